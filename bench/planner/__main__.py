"""``python -m bench.planner``: see :mod:`bench.planner.cli`."""

from bench.planner.cli import main

if __name__ == "__main__":
    main()
