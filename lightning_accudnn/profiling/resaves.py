"""Storages a traced step saves again, listed as the offload engine lists re-saves.

A storage saved again is needed from the backward of the last layer that saves it, or, if that
layer saves nothing of its own (a convolution saving the output of the ReLU before it), of the
next layer that does (:attr:`.LayerProfile.resaved_by`); the bytes of such a re-save are also
listed under the layer that really made it (:attr:`.LayerProfile.resaved_by_module`), as the
engine's recording does.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from lightning_accudnn.profile import resave_position

Listed = dict[str, list[tuple[str, int]]]


@dataclass
class ResaveLog:
    """The last re-save of each storage saved again during a traced step, by storage key.

    Example:
        >>> log, saving = ResaveLog(), {"conv1": None, "conv2": None}
        >>> log.note(7, "conv2.relu", saving)  # saves nothing of its own: needed from the next on
        >>> saving["conv3"] = None
        >>> log.listed({7: "conv1"}, {7: 64}, saving, read_in_forward=())
        ({'conv1': [('conv3', 64)]}, {'conv1': [('conv2.relu', 64)]})
    """

    resaved_from: dict[int, int] = field(default_factory=dict)
    """Storage -> the index, in the saving layers, of the layer from whose backward on it is needed."""
    resaved_module: dict[int, str] = field(default_factory=dict)
    """Storage -> the layer of its last re-save, where that layer saved nothing of its own."""

    def note(self, key: int, layer: str, saving: dict[str, None]) -> None:
        """``layer`` saves the storage ``key`` again; ``saving`` holds the layers that saved
        something of their own so far, in order. Placed as the engine places it
        (:func:`~lightning_accudnn.profile.resave_position`)."""
        self.resaved_from[key], noted = resave_position(layer, saving)
        if noted:
            self.resaved_module[key] = layer
        else:
            self.resaved_module.pop(key, None)

    def listed(
        self,
        first_layer: Mapping[int, str],
        sizes: Mapping[int, int],
        saving: Mapping[str, None],
        read_in_forward: Collection[int],
    ) -> tuple[Listed, Listed]:
        """Per layer that saved a storage first, ``(later layer, storage bytes)`` for each of
        its storages saved again (:attr:`.LayerTrace.resaved`), and ``(module, storage bytes)``
        for those whose last re-save was by a layer that saved nothing of its own
        (:attr:`.LayerTrace.resaved_modules`). A storage read during the forward (a backward
        inside it) is needed from the start and listed in neither."""
        order = list(saving)
        resaved: Listed = {}
        modules: Listed = {}
        for key, index in self.resaved_from.items():
            first = first_layer[key]
            later = order[min(index, len(order) - 1)]
            if later != first and key not in read_in_forward:
                resaved.setdefault(first, []).append((later, sizes[key]))
                module = self.resaved_module.get(key)
                if module is not None:
                    modules.setdefault(first, []).append((module, sizes[key]))
        return resaved, modules
