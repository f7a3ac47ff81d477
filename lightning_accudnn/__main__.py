"""``python -m lightning_accudnn`` runs the ``accudnn`` command line (see :mod:`lightning_accudnn.cli`).

:func:`main` is the process's entry point (``python -m lightning_accudnn`` and the ``accudnn``
script). It freezes the garbage collector (:func:`gc.freeze`) before the command, once torch
is imported, and after it, since the process ends right after: torch's objects then stay out
of the collections the trace and the plan trigger, and everything stays out of the one the
interpreter's shutdown would run over ``torch._dynamo`` and the traced model (measured in
``bench.planner.speed``). Call :func:`lightning_accudnn.cli.main` to run a command inside a
process that goes on.

Example:
    $ python -m lightning_accudnn plan torchvision:resnet152 --batch-size 64 --budget 8GB --gpu h100
"""

import gc
import sys
from collections.abc import Sequence

from lightning_accudnn import cli

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line as a whole process does; returns the exit status.

    Example:
        >>> main(["plan", "--help"])  # doctest: +SKIP
    """
    gc.freeze()  # torch's modules and types live as long as the process
    status = cli.main(argv)
    gc.freeze()  # the process ends now: its objects need no collection on the way out
    return status


if __name__ == "__main__":
    sys.exit(main())
