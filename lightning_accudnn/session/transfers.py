"""What a pass's swaps move, read from its profiled save sequence: the copy sizes (for the
host link's rates) and each layer's host bytes as the host pool rounds them (for the plan's
host-memory limit).

The sequence lists every save with its storage's size; a storage saved twice is listed twice,
which weighs the rates and the rounding ratios alike and changes neither much.
"""

from __future__ import annotations

from collections.abc import Callable

from lightning_accudnn.ops.layers import SaveSequence
from lightning_accudnn.profile import StepProfile

__all__ = ["layer_host_bytes", "transfer_sizes"]


def transfer_sizes(sequence: SaveSequence | None, min_swap_bytes: int) -> list[int]:
    """The sizes of the storages a plan may swap (at least ``min_swap_bytes``, not excluded).

    Example:
        >>> sequence = SaveSequence()
        >>> sequence.append("a", False, 2**20); sequence.append("b", True, 2**22)
        >>> sequence.append("c", False, 100)
        >>> transfer_sizes(sequence, min_swap_bytes=1024)
        [1048576]
    """
    if sequence is None:
        return []
    return [
        size
        for size, excluded in zip(sequence.sizes, sequence.excluded, strict=True)
        if size >= min_swap_bytes and not excluded and size > 0
    ]


def layer_host_bytes(
    profile: StepProfile,
    sequence: SaveSequence | None,
    min_swap_bytes: int,
    host_bytes: Callable[[int], int],
) -> list[int]:
    """Per layer of ``profile``, the host bytes swapping it takes: its swappable bytes scaled by
    how ``host_bytes`` (the pool's rounding) grows that layer's storages in ``sequence``; a
    layer the sequence does not list is rounded as one buffer.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> sequence = SaveSequence()
        >>> sequence.append("a", False, 600); sequence.append("a", False, 600)
        >>> layers = (LayerProfile("a", 1200, 1200), LayerProfile("b", 700, 700))
        >>> power_of_two = lambda nbytes: 1 << (nbytes - 1).bit_length()
        >>> layer_host_bytes(StepProfile(layers, static_bytes=0), sequence, 0, power_of_two)
        [2048, 1024]
    """
    raw: dict[str, int] = {}
    rounded: dict[str, int] = {}
    if sequence is not None:
        for name, size, excluded in zip(sequence.layers, sequence.sizes, sequence.excluded, strict=True):
            if size >= min_swap_bytes and size > 0 and not excluded:
                raw[name] = raw.get(name, 0) + size
                rounded[name] = rounded.get(name, 0) + host_bytes(size)
    result = []
    for layer in profile.layers:
        nbytes = layer.swappable_bytes
        if nbytes <= 0:
            result.append(0)
        elif layer.name in raw:
            result.append(-(-nbytes * rounded[layer.name] // raw[layer.name]))
        else:
            result.append(host_bytes(nbytes))
    return result
