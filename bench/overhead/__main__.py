"""``python -m bench.overhead``: see :mod:`bench.overhead.cli`."""

from bench.overhead.cli import main

if __name__ == "__main__":
    main()
