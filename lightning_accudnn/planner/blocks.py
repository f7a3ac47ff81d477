"""Full per-block checkpointing as a plan: every top-level block recomputed, nothing swapped.

What a user already has without this project: ``torch.utils.checkpoint`` around each block of
the model (each ResNet bottleneck, each transformer layer), everything else kept. Scored by
the planner's own model (:mod:`.recompute` for the step the engine then sees, the
:class:`~.timeline.Simulator` for its peak and time), it is the baseline a plan of
:func:`~.plan.plan_swaps` is compared with.

The *top-level blocks* of a profile (:func:`top_level_blocks`) are the outermost recompute
candidates (:func:`~.recompute.candidate_spans`) named as items of a container, ``name.<index>``
(``layer1.0``, ``transformer.h.11``, ``model.layers.3``), none inside another.

Example:
    >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile
    >>> layers = (LayerProfile("stem", 40, 40, 1e-3, 2e-3),
    ...           LayerProfile("blocks.0.conv", 100, 100, 1e-3, 2e-3),
    ...           LayerProfile("blocks.0.relu", 100, 100, 1e-3, 2e-3),
    ...           LayerProfile("blocks.1.conv", 100, 100, 1e-3, 2e-3),
    ...           LayerProfile("head", 10, 10, 1e-3, 2e-3))
    >>> segments = (SegmentProfile("blocks", 40), SegmentProfile("blocks.0", 40, 100),
    ...             SegmentProfile("blocks.1", 100, 100))
    >>> profile = StepProfile(layers, static_bytes=1_000, segments=segments)
    >>> top_level_blocks(profile)
    ('blocks.0',)
    >>> plan = checkpoint_blocks_plan(profile, budget_bytes=10_000)
    >>> plan.recomputed, plan.policy, plan.swapped_bytes
    (('blocks.0',), 'recompute', 0)
    >>> plan.predicted_step_seconds > plan.unconstrained_seconds
    True
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_accudnn.planner.plan import BudgetTooSmallError, Plan, lower_bound_seconds
from lightning_accudnn.planner.recompute import candidate_spans, recomputed_profile
from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from lightning_accudnn.profile import StepProfile

__all__ = ["CHECKPOINT_BLOCKS_SEARCH", "checkpoint_blocks_plan", "top_level_blocks"]

#: ``Plan.search`` of the plans :func:`checkpoint_blocks_plan` returns (nothing was searched).
CHECKPOINT_BLOCKS_SEARCH = "every top-level block recomputed"


def _is_item(name: str) -> bool:
    return name.rpartition(".")[2].isdigit()


def top_level_blocks(profile: StepProfile) -> tuple[str, ...]:
    """The outermost recompute candidates named ``<container>.<index>``, in forward order.

    ``blocks.1`` above is not among them: it saves no more than its inputs, so recomputing
    it would free nothing (it is no candidate). A block inside another block is not listed.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> layers = tuple(LayerProfile(f"h.{i}.mlp.fc", 100, 100) for i in range(3))
        >>> segments = tuple(SegmentProfile(f"h.{i}", 10) for i in range(3))
        >>> segments += tuple(SegmentProfile(f"h.{i}.mlp", 10) for i in range(3))
        >>> top_level_blocks(StepProfile(layers, 0, segments=segments))
        ('h.0', 'h.1', 'h.2')
    """
    items = [span.name for span in candidate_spans(profile) if _is_item(span.name)]
    chosen: list[str] = []
    for name in items:
        if not any(name.startswith(outer + ".") for outer in chosen):
            chosen.append(name)
    return tuple(chosen)


def checkpoint_blocks_plan(
    profile: StepProfile,
    budget_bytes: int,
    reserve_bytes: int = 0,
    blocks: Sequence[str] | None = None,
) -> Plan:
    """The plan that recomputes every block of ``blocks`` (default :func:`top_level_blocks`)
    and keeps every other saved tensor on the device, scored by the planner's model.

    Its ``policy`` is ``"recompute"`` and its ``lower_bound_seconds`` the bound of that policy
    at ``budget_bytes`` (:func:`~.plan.lower_bound_seconds`); ``min_budget_bytes`` is its own
    predicted peak plus ``reserve_bytes`` (no profiling pass precedes it).
    Raises :class:`~.plan.BudgetTooSmallError` when that peak is above
    ``budget_bytes - reserve_bytes``, and ``ValueError`` when the profile has no such block or
    a name of ``blocks`` is no recompute candidate of it.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> layers = tuple(LayerProfile(f"h.{i}.fc", 100, 100, 1e-3, 2e-3) for i in range(2))
        >>> profile = StepProfile(layers, 0, segments=(SegmentProfile("h.0", 10), SegmentProfile("h.1", 10)))
        >>> plan = checkpoint_blocks_plan(profile, budget_bytes=1_000)
        >>> plan.recomputed, plan.predicted_peak_bytes <= 1_000
        (('h.0', 'h.1'), True)
        >>> checkpoint_blocks_plan(profile, budget_bytes=50).min_budget_bytes  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_accudnn.planner.refusals.BudgetTooSmallError: memory budget 50 B is too small ...
    """
    names = tuple(blocks) if blocks is not None else top_level_blocks(profile)
    if not names:
        raise ValueError(
            "the profile has no top-level blocks to recompute (no segment named <container>.<index>)"
        )
    by_name = {span.name: span for span in candidate_spans(profile)}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise ValueError(f"not recompute candidates of the profile: {', '.join(unknown)}")
    step = recomputed_profile(profile, [by_name[name] for name in names], swappable=False)
    choice = PlanChoice((False,) * len(step.profile.layers))
    timeline = Simulator(step.profile, step.transient_bytes).timeline(choice)
    min_budget = timeline.peak_bytes + reserve_bytes
    if min_budget > budget_bytes:
        raise BudgetTooSmallError(min_budget, budget_bytes, reserve_bytes)
    return Plan(
        profile=profile,
        swap=(False,) * len(profile.layers),
        prefetch_window_bytes=0,
        budget_bytes=budget_bytes,
        reserve_bytes=reserve_bytes,
        predicted_peak_bytes=timeline.peak_bytes,
        predicted_step_seconds=timeline.step_seconds,
        lower_bound_seconds=lower_bound_seconds(profile, budget_bytes, "recompute"),
        min_budget_bytes=min_budget,
        search=CHECKPOINT_BLOCKS_SEARCH,
        timeline=timeline,
        recomputed=step.recomputed,
        policy="recompute",
        step=step,
    )
