"""Layers grouped by kind: the same layer of every block of a model as one.

Example:
    >>> layer_kind("transformer.h.11.mlp.act"), layer_kind("layer1.0.relu#2")
    ('transformer.h.*.mlp.act', 'layer1.*.relu#2')
"""

from __future__ import annotations

import re

__all__ = ["layer_kind"]


def layer_kind(name: str) -> str:
    """A layer's name with its first index (the block's) replaced by ``*``: the same layer of
    every block as one kind.

    Example:
        >>> layer_kind("blocks.3.mlp.0"), layer_kind("(root)"), layer_kind("layer4.2.downsample.0")
        ('blocks.*.mlp.0', '(root)', 'layer4.*.downsample.0')
    """
    return re.sub(r"(?<=\.)\d+(?=\.|#|$)", "*", name, count=1)
