"""``python -m lightning_accudnn`` runs the ``accudnn`` command line (see :mod:`lightning_accudnn.cli`).

Example:
    $ python -m lightning_accudnn plan torchvision:resnet152 --batch-size 64 --budget 8GB --gpu h100
"""

import sys

from lightning_accudnn.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
