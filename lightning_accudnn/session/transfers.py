"""What a pass's swaps move, read from its profiled save sequence: the copy sizes (for the
host link's rates), each layer's host bytes as the host pool rounds them (for the plan's
host-memory limit) and the host buffers a plan's pass holds (reserved when the plan is made).

The sequence lists every save with its storage's size; a storage saved twice is listed twice,
which weighs the rates and the rounding ratios alike and changes neither much.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from lightning_accudnn.ops.layers import SWAPPABLE, SaveSequence
from lightning_accudnn.profile import StepProfile

__all__ = ["layer_host_bytes", "swapped_buffer_sizes", "transfer_sizes"]


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


def swapped_buffer_sizes(sequence: SaveSequence, swapped_layers: Collection[str]) -> list[int]:
    """The bytes of the host buffers a pass of ``sequence`` holds by the end of its forward
    when it swaps ``swapped_layers``: one per swappable record those layers open.

    Example:
        >>> from lightning_accudnn.ops.layers import SMALL
        >>> sequence = SaveSequence()
        >>> sequence.append("a", False, 4096, record_bytes=4096, kind=SWAPPABLE)
        >>> sequence.append("a", False, 64, record_bytes=64, kind=SMALL)
        >>> sequence.append("b", False, 2048, record_bytes=2048, kind=SWAPPABLE)
        >>> swapped_buffer_sizes(sequence, {"a"})
        [4096]
    """
    return [
        nbytes
        for layer, nbytes, kind in zip(sequence.layers, sequence.record_bytes, sequence.kinds, strict=True)
        if kind == SWAPPABLE and layer in swapped_layers
    ]
