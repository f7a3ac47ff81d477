"""A per-layer plan applied in AOTAutograd's partitioner, keyed in the compile caches by the plan.

A model compiled whole is one graph: the engine's saved-tensor hooks see every activation
as saved by one module, so no per-layer plan applies from outside. Inside the graph, the
partitioner decides what forward saves for backward, and each joint-graph node carries the
modules it came from (``node.meta["nn_module_stack"]``). :class:`PlanPartitioner` is an
Inductor ``custom_partitioner_fn`` that, before running the default min-cut partitioner,
tags the forward nodes of each layer the plan swaps with ``node.meta["should_offload"]``
(PyTorch's activation-offloading pass then copies those saved activations to the host and
back, when ``torch._functorch.config.enable_activation_offloading`` is on: see
:func:`offloading_options`) and the forward nodes of each layer it recomputes with
``node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE``. Its ``uuid()`` hashes the plan
and :data:`PARTITIONER_VERSION`, so a changed plan recompiles and an unchanged one is served
from Inductor's and AOTAutograd's caches.

The trial partition: a partitioner with :data:`TRIAL_PLAN` tags every forward node for
offloading (the safest mode, as the eager route's profiling pass swaps everything it can) and
records, per layer, the bytes the forward graph saves (:attr:`Partition.saved_bytes`) and
those the offload pass took (:attr:`Partition.offloaded_bytes`); :func:`profile_of` turns
that into a :class:`~lightning_accudnn.profile.StepProfile` for the planner, and
:func:`plan_choices` turns the planner's plan into the ``layer -> LayerChoice`` mapping
this partitioner takes.

Experimental: tested with PyTorch 2.14.1 (:data:`TESTED_TORCH_VERSIONS`). On CPU the offload
pass copies within host memory (no memory saved, the tags and gradients can be checked);
the asynchronous copy stream (``activation_offload_separate_stream``,
``activation_reload_prefetch``) runs only on an accelerator.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.custom_graph_pass import CustomPartitionerFn
from torch.utils.checkpoint import CheckpointPolicy

from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.profile import ROOT_LAYER, LayerChoice, LayerProfile, StepProfile
from lightning_accudnn.whole_model_compile._torch_internals import offload_copy_name

__all__ = [
    "PARTITIONER_VERSION",
    "TESTED_TORCH_VERSIONS",
    "TRIAL_PLAN",
    "Partition",
    "PlanPartitioner",
    "layer_of",
    "module_path",
    "offloading_options",
    "plan_choices",
    "profile_of",
]

#: Part of every cache key: bump it when the way a plan becomes tags changes.
PARTITIONER_VERSION = "accudnn-partitioner-1"

#: The PyTorch versions this route was tested with.
TESTED_TORCH_VERSIONS = ("2.14.1",)

#: The trial's plan: every forward node tagged for offloading (a node in no layer a plan names
#: belongs to the root).
TRIAL_PLAN: dict[str, LayerChoice] = {ROOT_LAYER: LayerChoice.SWAP}

_DYNAMO_ROOT = re.compile(r"^L\['[^']*'\]\.?")


def module_path(dynamo_name: str) -> str:
    """The qualified module name of an ``nn_module_stack`` entry (``"L['self'].blocks.0"``).

    Example:
        >>> module_path("L['self'].blocks.0.up"), module_path("L['self']")
        ('blocks.0.up', '')
    """
    return _DYNAMO_ROOT.sub("", dynamo_name)


def _stack(node: fx.Node) -> list[str]:
    """The node's modules, outermost first, as qualified names (the root left out)."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = (module_path(name) for name, _ in stack.values())
    return [path for path in paths if path]


def layer_of(node: fx.Node, layers: Collection[str] | None = None) -> str:
    """The layer owning ``node``: its innermost module, or with ``layers`` the innermost of its
    modules that ``layers`` names; :data:`ROOT_LAYER` when there is none.

    Example:
        >>> from torch import nn
        >>> graph = fx.Graph()
        >>> node = graph.placeholder("x")
        >>> stack = {"a": ("L['self'].blocks.0", nn.Module), "b": ("L['self'].blocks.0.up", nn.Linear)}
        >>> node.meta["nn_module_stack"] = stack
        >>> layer_of(node), layer_of(node, {"blocks.0"}), layer_of(node, {"head"})
        ('blocks.0.up', 'blocks.0', '(root)')
    """
    for path in reversed(_stack(node)):
        if layers is None or path in layers:
            return path
    return ROOT_LAYER


def _is_forward(node: fx.Node) -> bool:
    return node.op == "call_function" and node.meta.get("partitioner_tag") != "is_backward"


def _tensor_bytes(node: fx.Node) -> int:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return 0
    return int(value.numel()) * value.element_size()


@dataclass
class Partition:
    """What one call of :class:`PlanPartitioner` did to one graph.

    ``offloaded`` and ``recomputed`` name the joint-graph nodes tagged, per layer;
    ``saved_bytes`` are the bytes of the activations the forward graph saves for backward per
    layer, as the partitioner left them (graph inputs, i.e. parameters and the batch, not
    counted; an offloaded activation counted once, in its own layer); ``saved_offloaded``
    names, per layer, the saved nodes PyTorch's offload pass accepted, and
    ``offloaded_bytes`` counts their bytes (it refuses views and non-contiguous tensors;
    both empty when the pass is off).

    Example:
        >>> Partition().saved_bytes
        {}
    """

    offloaded: dict[str, list[str]] = field(default_factory=dict)
    recomputed: dict[str, list[str]] = field(default_factory=dict)
    saved_bytes: dict[str, int] = field(default_factory=dict)
    saved_offloaded: dict[str, list[str]] = field(default_factory=dict)
    offloaded_bytes: dict[str, int] = field(default_factory=dict)


class PlanPartitioner(CustomPartitionerFn):
    """Inductor's ``custom_partitioner_fn`` that applies ``plan`` (layer -> keep/swap/recompute).

    Layer names are qualified module names (``"blocks.0"``); a node belongs to the innermost
    of its modules the plan names (the root for a node in none); an empty plan tags nothing,
    :data:`TRIAL_PLAN` tags every node. Each call is recorded in :attr:`partitions`. Use it
    with Inductor's options and the offload flags of :func:`offloading_options`::

        partitioner = PlanPartitioner({"blocks.0": LayerChoice.SWAP, "blocks.1": LayerChoice.RECOMPUTE})
        compiled = torch.compile(model, options={"custom_partitioner_fn": partitioner})
        with torch._functorch.config.patch(offloading_options(accelerator=True)):
            loss = compiled(x).sum()

    Example:
        >>> a = PlanPartitioner({"blocks.0": LayerChoice.SWAP})
        >>> a.uuid() == PlanPartitioner({"blocks.0": "swap"}).uuid() != PlanPartitioner({}).uuid()
        True
    """

    def __init__(self, plan: Mapping[str, LayerChoice | str]) -> None:
        self.plan: dict[str, LayerChoice] = {
            name: LayerChoice(choice) for name, choice in sorted(plan.items())
        }
        self.partitions: list[Partition] = []

    def uuid(self) -> str:
        """The cache key: a hash of the plan and :data:`PARTITIONER_VERSION`."""
        text = json.dumps([PARTITIONER_VERSION, {name: choice.value for name, choice in self.plan.items()}])
        return hashlib.sha256(text.encode()).hexdigest()

    def __call__(
        self, gm: fx.GraphModule, joint_inputs: Any, **kwargs: Any
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        partition = Partition()
        self._tag(gm, partition)
        forward, backward = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        for node in _saved_activations(forward, kwargs["num_fwd_outputs"]):
            layer = layer_of(node)
            partition.saved_bytes[layer] = partition.saved_bytes.get(layer, 0) + _tensor_bytes(node)
            if node.meta.get("saved_for_offloading"):
                partition.saved_offloaded.setdefault(layer, []).append(node.name)
                partition.offloaded_bytes[layer] = partition.offloaded_bytes.get(layer, 0) + _tensor_bytes(
                    node
                )
        self.partitions.append(partition)
        return forward, backward

    def _tag(self, gm: fx.GraphModule, partition: Partition) -> None:
        if not self.plan:
            return
        for node in gm.graph.nodes:
            if not _is_forward(node):
                continue
            layer = layer_of(node, self.plan)
            choice = self.plan.get(layer, LayerChoice.KEEP)
            if choice is LayerChoice.SWAP:
                node.meta["should_offload"] = True
                partition.offloaded.setdefault(layer, []).append(node.name)
            elif choice is LayerChoice.RECOMPUTE:
                node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
                partition.recomputed.setdefault(layer, []).append(node.name)


def _saved_activations(forward: fx.GraphModule, num_fwd_outputs: int) -> list[fx.Node]:
    """The activations the forward graph saves for backward, in the order it computes them
    (the planner's layer order), its graph inputs left out. A saved output the offload pass
    made (its host copy, named after the activation it copies) stands for that activation."""
    output = forward.graph.find_nodes(op="output")[0]
    saved: set[fx.Node] = set()
    for node in output.args[0][num_fwd_outputs:]:
        if isinstance(node, fx.Node):
            copied = [
                source for source in node.all_input_nodes if node.name == offload_copy_name(source.name)
            ]
            saved.add(copied[0] if copied else node)
    return [node for node in forward.graph.nodes if node in saved and node.op != "placeholder"]


def offloading_options(*, accelerator: bool) -> dict[str, bool]:
    """The ``torch._functorch.config`` flags the offload pass needs; the stream and prefetch
    flags only where an accelerator runs the graph.

    Example:
        >>> offloading_options(accelerator=False)
        {'enable_activation_offloading': True}
    """
    options = {"enable_activation_offloading": True}
    if accelerator:
        options |= {"activation_offload_separate_stream": True, "activation_reload_prefetch": True}
    return options


def profile_of(partition: Partition, static_bytes: int, min_swap_bytes: int = 0) -> StepProfile:
    """The trial partition's saved bytes as a profile the planner takes (no times: the planner
    then minimises memory moved; bandwidths unknown). A layer's swappable bytes are those the
    offload pass took from it in the trial; none when they are fewer than ``min_swap_bytes``.

    Example:
        >>> partition = Partition(saved_bytes={"a": 4096, "b": 100, "c": 800},
        ...                       offloaded_bytes={"a": 3072, "b": 100})
        >>> profile = profile_of(partition, static_bytes=0, min_swap_bytes=1024)
        >>> [(layer.name, layer.swappable_bytes) for layer in profile.layers]
        [('a', 3072), ('b', 0), ('c', 0)]
    """
    offloaded = partition.offloaded_bytes
    layers = tuple(
        LayerProfile(
            name,
            saved_bytes=nbytes,
            swappable_bytes=offloaded.get(name, 0) if offloaded.get(name, 0) >= min_swap_bytes else 0,
        )
        for name, nbytes in partition.saved_bytes.items()
    )
    return StepProfile(layers=layers, static_bytes=static_bytes)


def plan_choices(plan: Plan) -> dict[str, LayerChoice]:
    """The planner's plan as the ``layer -> LayerChoice`` mapping :class:`PlanPartitioner` takes.

    Example:
        >>> from lightning_accudnn.planner.plan import plan_swaps
        >>> layers = (LayerProfile("a", 1000, 1000), LayerProfile("b", 1000, 1000))
        >>> profile = StepProfile(layers, static_bytes=0)
        >>> plan_choices(plan_swaps(profile, budget_bytes=10_000))
        {'a': <LayerChoice.KEEP: 'keep'>, 'b': <LayerChoice.KEEP: 'keep'>}
    """
    return {
        layer.name: LayerChoice.SWAP if layer.name in plan.swapped_layers else LayerChoice.KEEP
        for layer in plan.profile.layers
    }
