"""The planner: the fastest keep/swap/recompute plan whose predicted peak fits the budget.

Pure: a :class:`~lightning_accudnn.profile.StepProfile` in, a :class:`Plan` out.
Every plan is scored by the two-stream simulator in :mod:`.timeline`; the search is in
:mod:`.search`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from lightning_accudnn.planner.bounds import lower_bound_seconds
from lightning_accudnn.planner.budget import format_bytes
from lightning_accudnn.planner.headroom import Headroom
from lightning_accudnn.planner.recompute import (
    RecomputedProfile,
    named_spans,
    policy_spans,
    recomputed_profile,
)
from lightning_accudnn.planner.refusals import (
    BudgetTooSmallError,
    HostLimitTooSmallError,
    NothingToRecomputeError,
    refuse_recompute_without_segments,
)
from lightning_accudnn.planner.search import (
    KEEP_OR_RECOMPUTE,
    check_policy,
    fewest_bytes_swapped,
    least_peak_choice,
    planned_sets,
    search_mixed,
)
from lightning_accudnn.planner.timeline import PlanChoice, Simulator, Timeline, unconstrained_seconds
from lightning_accudnn.profile import LayerChoice, LayerProfile, StepProfile

__all__ = [
    "BudgetTooSmallError",
    "HostLimitTooSmallError",
    "NothingToRecomputeError",
    "Plan",
    "lower_bound_seconds",
    "min_budget_bytes",
    "plan_swaps",
    "refuse_recompute_without_segments",
    "swap_everything_peak_bytes",
]


#: Which route a model's plan is applied by (``Plan.route``): hooks per layer, per compiled block, or
#: tags in the partitioner of a model compiled whole (experimental).
ROUTE_EAGER, ROUTE_REGIONAL, ROUTE_WHOLE_MODEL = (
    "eager, per layer",
    "regional compile, per compiled block",
    "whole-model compile, in the partitioner (experimental)",
)


@dataclass(frozen=True)
class Plan:
    """Which segments recompute, which layers swap, how far to prefetch, and the predictions.

    ``swap`` has one flag per layer of ``profile`` (layers inside a recomputed segment are not
    swapped); ``recomputed`` names the recomputed segments (``profile.segments``), whose
    layers the engine no longer sees: it sees ``step.profile``, with one layer per recomputed
    segment saving the segment's inputs, kept on the device but for the segments named in
    ``swapped_segments``, whose layer swaps them. ``lower_bound_seconds`` is the physical bound
    for ``budget_bytes`` under ``policy`` (see :func:`lower_bound_seconds`; the reserve is
    the planner's own margin, so its cost shows in ``bound_ratio``). ``min_budget_bytes`` is
    the smallest budget, reserve included, at which a plan exists under ``policy`` and the
    session's profiling pass fits too (see :func:`plan_swaps`); ``profiling_peak_bytes`` is
    that pass's peak (every activation swapped, nothing recomputed). ``search`` says how the
    plan was found: ``"nothing to swap"``, ``"exhaustive"`` or ``"heuristic"``.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = tuple(LayerProfile(name, 100, 100, 1e-3, 2e-3) for name in "abc")
        >>> plan = plan_swaps(StepProfile(layers, static_bytes=0), budget_bytes=250)
        >>> sorted(plan.swapped_layers), plan.predicted_peak_bytes, plan.bound_ratio
        (['a', 'b', 'c'], 200, 1.0)
        >>> [choice.value for choice in plan.choices], plan.recomputed
        (['swap', 'swap', 'swap'], ())
    """

    profile: StepProfile = field(repr=False)
    swap: tuple[bool, ...]
    prefetch_window_bytes: int
    budget_bytes: int
    reserve_bytes: int
    predicted_peak_bytes: int
    predicted_step_seconds: float
    lower_bound_seconds: float
    min_budget_bytes: int
    search: str = "exhaustive"
    max_copying_out_bytes: int | None = None
    timeline: Timeline | None = field(default=None, repr=False, compare=False)
    route: str = ROUTE_EAGER
    recomputed: tuple[str, ...] = ()
    policy: str = "auto"
    step: RecomputedProfile | None = field(default=None, repr=False, compare=False)
    profiling_peak_bytes: int = 0
    selective: tuple[str, ...] = ()
    """The recomputed segments recomputed selectively (their expensive ops' outputs kept)."""
    swapped_segments: tuple[str, ...] = ()
    """The recomputed segments whose inputs are swapped (their layer in ``step.profile``)."""

    @property
    def bound_ratio(self) -> float:
        """Predicted step time over the lower bound (1.0 is perfect)."""
        if self.lower_bound_seconds > 0:
            return self.predicted_step_seconds / self.lower_bound_seconds
        return 1.0 if self.predicted_step_seconds == 0 else math.inf

    @property
    def engine_profile(self) -> StepProfile:
        """The layers the engine sees under this plan (``profile`` when nothing is recomputed)."""
        return self.step.profile if self.step is not None else self.profile

    @property
    def choices(self) -> tuple[LayerChoice, ...]:
        """Keep, swap or recompute, per layer of ``profile``."""
        inside = self._recomputed_layers()
        return tuple(
            LayerChoice.RECOMPUTE if i in inside else LayerChoice.SWAP if s else LayerChoice.KEEP
            for i, s in enumerate(self.swap)
        )

    def _recomputed_layers(self) -> set[int]:
        if self.step is None:
            return set()
        names = set(self.recomputed)
        return {
            i
            for layer, origin in zip(self.step.profile.layers, self.step.origin, strict=True)
            if layer.name in names
            for i in origin
        }

    @property
    def swapped_layers(self) -> frozenset[str]:
        """Names of the layers the engine sees and swaps: the swapped layers of ``profile`` and
        the recomputed segments whose inputs are swapped."""
        swapped = (layer.name for layer, s in zip(self.profile.layers, self.swap, strict=True) if s)
        return frozenset((*swapped, *self.swapped_segments))

    @property
    def swapped_count_text(self) -> str:
        """What the plan swaps, counted for a report: ``"13 of 42 layers"``, and the recomputed
        segments whose inputs it swaps.

        Example:
            >>> from lightning_accudnn.profile import LayerProfile, StepProfile
            >>> layers = tuple(LayerProfile(name, 100, 100, 1e-3, 2e-3) for name in "abc")
            >>> plan_swaps(StepProfile(layers, static_bytes=0), budget_bytes=250).swapped_count_text
            '3 of 3 layers'
        """
        segments = len(self.swapped_segments)
        inputs = f" and the inputs of {segments} recomputed segments" if segments else ""
        return f"{sum(self.swap)} of {len(self.profile.layers)} layers{inputs}"

    def _swapped_segment_layers(self) -> list[LayerProfile]:
        names = set(self.swapped_segments)
        return [layer for layer in self.engine_profile.layers if layer.name in names]

    @property
    def kept_layers(self) -> frozenset[str]:
        """Names of the layers the engine sees and keeps (what :class:`SwapSchedule` wants): the
        kept layers and the recomputed segments whose inputs stay on the device."""
        return frozenset(layer.name for layer in self.engine_profile.layers) - self.swapped_layers

    @property
    def swapped_bytes(self) -> int:
        """Bytes copied out (and back in) per step."""
        return sum(
            layer.swappable_bytes for layer, s in zip(self.profile.layers, self.swap, strict=True) if s
        ) + sum(layer.swappable_bytes for layer in self._swapped_segment_layers())

    @property
    def swapped_storages(self) -> int:
        """Storages copied out (and back in) per step, where the profile counts them
        (:attr:`~lightning_accudnn.profile.LayerProfile.swappable_storages`)."""
        return sum(
            layer.swappable_storages for layer, s in zip(self.profile.layers, self.swap, strict=True) if s
        ) + sum(layer.swappable_storages for layer in self._swapped_segment_layers())

    @property
    def recompute_seconds(self) -> float:
        """Predicted forward time run again in backward."""
        return self.step.recompute_seconds if self.step is not None else 0.0

    @property
    def unconstrained_seconds(self) -> float:
        """Predicted step time on a GPU with enough memory (nothing swapped or recomputed)."""
        return unconstrained_seconds(self.profile)

    @property
    def predicted_ledger_peak_bytes(self) -> int:
        """The predicted peak as the engine's ledger counts it: ``predicted_peak_bytes`` less the
        recomputed segments' saves while their backward runs, which go to the checkpoint and never
        pass the engine's hooks, and less the working memory the profile lists (the same when
        nothing is recomputed and no working memory is listed).

        Example:
            >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile
            >>> layers = (LayerProfile("b.x", 100, 100, 1.0, 1.0), LayerProfile("b.y", 100, 100, 1.0, 1.0),
            ...           LayerProfile("c", 30, 30, 1.0, 1.0))
            >>> profile = StepProfile(layers, static_bytes=0, segments=(SegmentProfile("b", 10),))
            >>> plan = plan_swaps(profile, budget_bytes=220, policy="recompute")
            >>> plan.recomputed, plan.predicted_peak_bytes, plan.predicted_ledger_peak_bytes
            (('b',), 210, 40)
        """
        if self.step is None or (not self.step.recomputed and not self.profile.has_working_bytes):
            return self.predicted_peak_bytes
        choice = PlanChoice(
            tuple(self.timeline.swap)
            if self.timeline is not None
            else (False,) * len(self.step.profile.layers),
            self.prefetch_window_bytes,
            self.max_copying_out_bytes,
        )
        return Simulator(self.step.profile.without_working_bytes()).memory(choice).peak_bytes

    @property
    def compute_wait_seconds(self) -> float:
        """Predicted time the compute stream waits for copies in."""
        return self.timeline.compute_wait_seconds if self.timeline is not None else 0.0

    def _bound_assumes(self) -> str:
        moved = {"swap": "swapped", "recompute": "recomputed", "selective": "recomputed selectively"}.get(
            self.policy, "swapped or recomputed"
        )
        return (
            f"bytes over the budget {moved} at no cost but copy time hidden behind compute and "
            "recomputed forward time; no transient"
        )

    def peak_bytes_on(self, profile: StepProfile) -> int:
        """The predicted peak of this plan's choices (recomputed segments, swapped layers,
        limit and window) on ``profile``, a profile of the same layers (another batch shape).

        Example:
            >>> from lightning_accudnn.profile import LayerProfile, StepProfile
            >>> profile = StepProfile((LayerProfile("a", 100, 100), LayerProfile("b", 100, 100)), 0)
            >>> plan = plan_swaps(profile, budget_bytes=250)
            >>> plan.peak_bytes_on(profile) == plan.predicted_peak_bytes
            True
        """
        spans = named_spans(profile, self.policy, self.recomputed, self.selective)
        if sum(len(span.names) for span in spans) != len(self.recomputed):
            raise ValueError(f"the profile lacks recomputed segments of the plan: {self.recomputed}")
        step = recomputed_profile(profile, spans, swappable=self.policy not in KEEP_OR_RECOMPUTE)
        position = {layer.name: i for i, layer in enumerate(self.profile.layers)}
        swapped_segments = set(self.swapped_segments)
        swap = tuple(
            layer.name in swapped_segments
            if layer.name in step.recomputed
            else layer.name in position and self.swap[position[layer.name]]
            for layer in step.profile.layers
        )
        simulator = Simulator(step.profile, step.transient_bytes)
        return simulator.peak_bytes(PlanChoice(swap, self.prefetch_window_bytes, self.max_copying_out_bytes))

    def __str__(self) -> str:
        layers = self.profile.layers
        choices = self.choices
        width = max([len("layer"), *(len(layer.name) for layer in layers)])
        lines = [
            f"{'layer':<{width}}  {'saved':>10}  {'swappable':>10}  {'fwd ms':>9}  {'bwd ms':>9}  decision"
        ]
        for layer, choice in zip(layers, choices, strict=True):
            lines.append(
                f"{layer.name:<{width}}  {format_bytes(layer.saved_bytes):>10}  "
                f"{format_bytes(layer.swappable_bytes):>10}  {layer.forward_seconds * 1e3:>9.3f}  "
                f"{layer.backward_seconds * 1e3:>9.3f}  {choice.value}"
            )
        usable = Headroom(self.budget_bytes, self.reserve_bytes).usable_bytes
        swapped_text = f"{self.swapped_count_text} ({format_bytes(self.swapped_bytes)})"
        unconstrained = self.unconstrained_seconds
        overhead = (
            f"{(self.predicted_step_seconds / unconstrained - 1) * 100:+.1f}%" if unconstrained > 0 else "n/a"
        )
        lines += [
            "",
            f"policy {self.policy}: predicted peak {format_bytes(self.predicted_peak_bytes)} of "
            f"{format_bytes(usable)} usable (budget {format_bytes(self.budget_bytes)} less reserve "
            f"{format_bytes(self.reserve_bytes)}; least budget that fits "
            f"{format_bytes(self.min_budget_bytes)}; the profiling pass, every activation swapped, "
            f"peaks at {format_bytes(self.profiling_peak_bytes)})",
            f"predicted step {self.predicted_step_seconds * 1e3:.3f} ms ({overhead} vs "
            f"{unconstrained * 1e3:.3f} ms unconstrained), lower bound "
            f"{self.lower_bound_seconds * 1e3:.3f} ms ({self._bound_assumes()}), "
            f"bound ratio {self.bound_ratio:.3f}",
            f"swapped {swapped_text}, prefetch window {format_bytes(self.prefetch_window_bytes)}, "
            f"compute waits {self.compute_wait_seconds * 1e3:.3f} ms ({self.search} search); "
            f"route: {self.route}",
            f"recomputed {len(self.recomputed)} segments"
            + (f" ({', '.join(self.recomputed)})" if self.recomputed else "")
            + (f", {len(self.selective)} of them selectively" if self.selective else "")
            + f", adding {self.recompute_seconds * 1e3:.3f} ms to backward"
            + (
                f" (recomputing measured at {self.profile.recompute_cost_ratio:.2f}x the forward it repeats)"
                if self.profile.recompute_cost_ratio != 1.0
                else ""
            ),
        ]
        lines += [
            f"not recomputed, unsafe: {excluded.name}: {excluded.reason}"
            for excluded in self.profile.excluded_segments
        ]
        if self.timeline is not None:
            lines.append(f"peak at {self.timeline.peak_cause}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        """Plain data for JSON (infinite bandwidths become ``None``).

        Example:
            >>> from lightning_accudnn.profile import LayerProfile, StepProfile
            >>> profile = StepProfile((LayerProfile("a", 100, 100),), static_bytes=0)
            >>> data = plan_swaps(profile, budget_bytes=1_000).to_dict()
            >>> data["predicted_peak_bytes"], data["layers"][0]["swap"], data["layers"][0]["choice"]
            (100, False, 'keep')
        """
        profile = self.profile
        return {
            "policy": self.policy,
            "budget_bytes": self.budget_bytes,
            "reserve_bytes": self.reserve_bytes,
            "min_budget_bytes": self.min_budget_bytes,
            "profiling_peak_bytes": self.profiling_peak_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_step_seconds": self.predicted_step_seconds,
            "unconstrained_seconds": self.unconstrained_seconds,
            "lower_bound_seconds": self.lower_bound_seconds,
            "lower_bound_assumes": self._bound_assumes(),
            "bound_ratio": _finite_or_none(self.bound_ratio),
            "compute_wait_seconds": self.compute_wait_seconds,
            "prefetch_window_bytes": self.prefetch_window_bytes,
            "swapped_bytes": self.swapped_bytes,
            "recomputed_segments": list(self.recomputed),
            "selective_segments": list(self.selective),
            "swapped_segments": list(self.swapped_segments),
            "excluded_segments": [
                {"name": excluded.name, "reason": excluded.reason} for excluded in profile.excluded_segments
            ],
            "recompute_seconds": self.recompute_seconds,
            "recompute_cost_ratio": profile.recompute_cost_ratio,
            "swap_host_seconds": list(profile.swap_host_seconds),
            "search": self.search,
            "route": self.route,
            "static_bytes": profile.static_bytes,
            "d2h_bytes_per_second": _finite_or_none(profile.d2h_bytes_per_second),
            "h2d_bytes_per_second": _finite_or_none(profile.h2d_bytes_per_second),
            "peak": self.timeline.peak_cause if self.timeline is not None else None,
            "layers": [
                {
                    "name": layer.name,
                    "saved_bytes": layer.saved_bytes,
                    "swappable_bytes": layer.swappable_bytes,
                    "swappable_storages": layer.swappable_storages,
                    "forward_seconds": layer.forward_seconds,
                    "backward_seconds": layer.backward_seconds,
                    "swap": swapped,
                    "choice": choice.value,
                }
                for layer, swapped, choice in zip(profile.layers, self.swap, self.choices, strict=True)
            ],
        }


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def plan_swaps(
    profile: StepProfile,
    budget_bytes: int,
    reserve_bytes: int = 0,
    max_copying_out_bytes: int | None = None,
    policy: str = "auto",
    *,
    host_limit_bytes: int | None = None,
    host_bytes: Sequence[int] | None = None,
    profiling_peak_bytes: int | None = None,
) -> Plan:
    """The fastest predicted plan whose predicted peak is at most ``budget_bytes - reserve_bytes``.

    Chooses which of the profile's segments to recompute (``policy`` ``"auto"`` or
    ``"recompute"``; ``"selective"``: which to recompute selectively, see :mod:`.recompute`),
    keep/swap per layer (``"auto"`` or ``"swap"``; under ``"recompute"`` and ``"selective"``
    every layer is kept or recomputed), the copy-out limit (the engine's
    ``max_copying_out_bytes``, carried by the plan) and the prefetch window, scoring each
    candidate with the :class:`~lightning_accudnn.planner.timeline.Simulator`: memory in issue
    order (a function of the plan only), time on two streams, recomputation charged to the
    backward (:mod:`.recompute`). ``max_copying_out_bytes``, if given, caps the limits
    considered (it changes neither the smallest budget nor feasibility). If nothing needs
    swapping, nothing is swapped. Among equally fast plans it prefers less recomputation,
    then fewer bytes copied, then the lower peak, then the smaller window and limit.

    The search is **exhaustive** (every non-overlapping recompute set, all swap sets, every
    limit and window that behave differently) when the profile has at most 6 recompute
    candidates and, for each recompute set, at most 10 swappable layers with
    ``2**swappable * layers <= 16384``: the result is then the exact optimum of the model.
    Beyond that it is a **heuristic** with a bounded number of simulations (see
    :mod:`.search`): with many candidates, the recompute sets simulated are those of a frontier
    (the cheapest set for each amount of bytes freed, :mod:`.frontier`); it always includes
    swapping everything and recomputing nothing.

    No plan's budget is below the peak of the pass the session profiles with (the first pass
    of each new batch shape: every swappable activation swapped, nothing recomputed), since
    that pass runs before any plan: a budget that only recomputation would fit is refused.
    ``profiling_peak_bytes`` is that pass's peak; by default the computed one
    (:func:`swap_everything_peak_bytes`, what ``accudnn plan`` and the tuner predict). The
    session passes its profiling pass's measured ledger peak instead: exact, where the computed
    peak assumes the worst split of layers into storages, and higher when the host-memory limit
    kept storages on the device. Recomputation then serves speed at budgets of at least that.

    Raises :class:`BudgetTooSmallError` when no plan fits; its ``min_budget_bytes`` is the
    larger of the least peak of the plans searched and the profiling pass's peak, plus the
    reserve (it does not depend on the budget or the timings), and the planner succeeds with
    any budget of at least that much.

    With ``host_limit_bytes`` no plan swaps more than that many host bytes: swapping a layer
    takes ``host_bytes[i]`` of them (default its ``swappable_bytes``; pass the host pool's
    rounded sizes). When plans fit the device but none the host limit as well,
    :class:`HostLimitTooSmallError` says by how much and what to change.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = tuple(LayerProfile(f"l{i}", 100, 100, 1e-3, 2e-3) for i in range(4))
        >>> profile = StepProfile(layers, static_bytes=1_000, d2h_bytes_per_second=1e6,
        ...                       h2d_bytes_per_second=1e6)
        >>> plan = plan_swaps(profile, budget_bytes=1_300)
        >>> sorted(plan.swapped_layers), plan.predicted_peak_bytes, plan.max_copying_out_bytes
        (['l0', 'l1', 'l2', 'l3'], 1300, 0)
    """
    cap = Headroom(budget_bytes, reserve_bytes).usable_bytes  # checks the reserve
    if max_copying_out_bytes is not None and max_copying_out_bytes < 0:
        raise ValueError(f"max_copying_out_bytes must be >= 0, got {max_copying_out_bytes}")
    check_policy(policy)
    refuse_recompute_without_segments(profile, policy)
    costs = _host_costs(profile, host_limit_bytes, host_bytes)
    floor = _profiling_floor(profile, profiling_peak_bytes)
    if cap < floor:  # the profiling pass itself would not fit: no plan is searched
        least = _least_peak(profile, policy)
        computed = swap_everything_peak_bytes(profile)
        min_budget = max(least, floor) + reserve_bytes
        # Only a host limit that cannot take every activation keeps storages on the device in
        # that pass: a measured peak above the computed one is the host's doing only then.
        host_short = costs is not None and host_limit_bytes is not None and sum(costs) > host_limit_bytes
        raise BudgetTooSmallError(
            min_budget,
            budget_bytes,
            reserve_bytes,
            _smaller_min_swap_bytes(profile, min_budget, reserve_bytes, policy, floor),
            profiling_binds=floor > least,
            with_host_memory_for_all_bytes=(
                max(least, computed) + reserve_bytes if floor > computed and host_short else None
            ),
        )
    host_limit = host_limit_bytes if host_limit_bytes is not None else 0
    host_fits = (
        None if costs is None else lambda swap, inputs: _host_bytes_of(costs, swap) + inputs <= host_limit
    )
    result = search_mixed(profile, cap, max_copying_out_bytes, policy, host_fits)
    min_budget = max(result.min_peak_bytes, floor) + reserve_bytes
    if result.best is None and costs is not None and result.min_peak_bytes <= cap:
        raise HostLimitTooSmallError(
            host_limit,
            _host_bytes_of(costs, fewest_bytes_swapped(Simulator(profile), cap)),
            budget_bytes,
            _nothing_swapped_peak_bytes(profile) + reserve_bytes,
        )
    if result.best is None or result.step is None:
        raise BudgetTooSmallError(
            min_budget,
            budget_bytes,
            reserve_bytes,
            _smaller_min_swap_bytes(profile, min_budget, reserve_bytes, policy, floor),
        )
    step = result.step
    choice = result.best.choice
    timeline = Simulator(step.profile, step.transient_bytes).timeline(choice)
    swap = [False] * len(profile.layers)
    swapped_segments = []
    for swapped, origin, layer in zip(timeline.swap, step.origin, step.profile.layers, strict=True):
        if not swapped:
            continue
        if layer.name in step.recomputed:  # a recomputed segment's layer: its inputs swapped
            swapped_segments.append(layer.name)
        else:
            (index,) = origin
            swap[index] = True
    return Plan(
        profile=profile,
        swap=tuple(swap),
        prefetch_window_bytes=choice.prefetch_window_bytes,
        budget_bytes=budget_bytes,
        reserve_bytes=reserve_bytes,
        predicted_peak_bytes=timeline.peak_bytes,
        predicted_step_seconds=timeline.step_seconds,
        lower_bound_seconds=lower_bound_seconds(profile, budget_bytes, policy),
        min_budget_bytes=min_budget,
        search=result.method,
        max_copying_out_bytes=choice.max_copying_out_bytes,
        timeline=timeline,
        recomputed=step.recomputed,
        policy=policy,
        step=step,
        profiling_peak_bytes=floor,
        selective=step.selective,
        swapped_segments=tuple(swapped_segments),
    )


def _host_costs(
    profile: StepProfile, host_limit_bytes: int | None, host_bytes: Sequence[int] | None
) -> tuple[int, ...] | None:
    """Host bytes per layer when swapped (``None`` without a host limit)."""
    if host_limit_bytes is None:
        if host_bytes is not None:
            raise ValueError("host_bytes needs host_limit_bytes")
        return None
    if host_bytes is None:
        return tuple(layer.swappable_bytes for layer in profile.layers)
    if len(host_bytes) != len(profile.layers):
        raise ValueError(f"host_bytes has {len(host_bytes)} entries for {len(profile.layers)} layers")
    return tuple(host_bytes)


def _host_bytes_of(costs: tuple[int, ...], swap: tuple[bool, ...]) -> int:
    return sum(cost for cost, swapped in zip(costs, swap, strict=True) if swapped)


def min_budget_bytes(
    profile: StepProfile,
    reserve_bytes: int = 0,
    policy: str = "auto",
    *,
    profiling_peak_bytes: int | None = None,
) -> int:
    """The smallest budget at which :func:`plan_swaps` succeeds under ``policy``: the larger
    of the least peak of the plans it searches and the profiling pass's peak (see
    :func:`plan_swaps` for ``profiling_peak_bytes``), plus the reserve.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile
        >>> layers = (LayerProfile("a", 100, 100), LayerProfile("b", 100, 100))
        >>> min_budget_bytes(StepProfile(layers, static_bytes=10), reserve_bytes=5)
        215

        Nothing swappable: recomputing both blocks would peak at 110 bytes (their inputs, and
        one block's saves while its backward runs), but the profiling pass keeps all 200:

        >>> layers = tuple(LayerProfile(f"b{i}.{part}", 50, 0) for i in range(2) for part in "xy")
        >>> segments = (SegmentProfile("b0", 10), SegmentProfile("b1", 10))
        >>> profile = StepProfile(layers, static_bytes=0, segments=segments)
        >>> min_budget_bytes(profile, policy="recompute"), swap_everything_peak_bytes(profile)
        (200, 200)
    """
    check_policy(policy)
    return max(_least_peak(profile, policy), _profiling_floor(profile, profiling_peak_bytes)) + reserve_bytes


def swap_everything_peak_bytes(profile: StepProfile) -> int:
    """The predicted peak of the session's profiling pass: every swappable activation swapped,
    nothing recomputed, copy-out limit and prefetch window 0 (the least peak of any plan under
    policy ``"swap"``). No plan's budget is below it (see :func:`plan_swaps`).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = (LayerProfile("a", 100, 100), LayerProfile("b", 100, 0))
        >>> swap_everything_peak_bytes(StepProfile(layers, static_bytes=10))  # b stays: 10 + 100 + 100
        210
    """
    simulator = Simulator(profile)
    return simulator.peak_bytes(least_peak_choice(simulator))


def _nothing_swapped_peak_bytes(profile: StepProfile) -> int:
    """The predicted peak with nothing swapped or recomputed (working memory included)."""
    simulator = Simulator(profile)
    return simulator.peak_bytes(PlanChoice((False,) * simulator.k, 0, 0))


def _profiling_floor(profile: StepProfile, profiling_peak_bytes: int | None) -> int:
    """The profiling pass's peak: the one given, or the computed one."""
    return swap_everything_peak_bytes(profile) if profiling_peak_bytes is None else profiling_peak_bytes


def _least_peak(profile: StepProfile, policy: str) -> int:
    """The least peak of the plans :func:`plan_swaps` searches under ``policy``."""
    spans = policy_spans(profile, policy)
    least = None
    for chosen in planned_sets(profile, spans):
        step = recomputed_profile(profile, chosen, swappable=policy not in KEEP_OR_RECOMPUTE)
        simulator = Simulator(step.profile, step.transient_bytes)
        peak = simulator.peak_bytes(least_peak_choice(simulator))
        least = peak if least is None else min(least, peak)
    assert least is not None
    return least


def _smaller_min_swap_bytes(
    profile: StepProfile, min_budget: int, reserve_bytes: int, policy: str, floor: int
) -> tuple[int, int] | None:
    """(threshold, smallest budget) for the largest ``min_swap_bytes`` that gets within 1% of
    making every listed small storage swappable, if that saves at least 1% of the smallest
    budget (``min_swap_bytes`` then limits it). ``floor`` is the profiling pass's peak at the
    profile's threshold: its difference from the computed peak is assumed at every threshold."""
    small = profile.small_storages
    if not small:
        return None
    measured_over_computed = floor - swap_everything_peak_bytes(profile)

    def smallest(threshold: int) -> int:
        lowered = profile.with_min_swap_bytes(threshold)
        floor_then = swap_everything_peak_bytes(lowered) + measured_over_computed
        return min_budget_bytes(lowered, reserve_bytes, policy, profiling_peak_bytes=floor_then)

    best = smallest(min(small))
    if 100 * (min_budget - best) < min_budget:
        return None
    for threshold in sorted(set(small), reverse=True):
        smaller = smallest(threshold)
        if 100 * (smaller - best) <= best:
            return threshold, smaller
    return min(small), best  # pragma: no cover - the smallest threshold always qualifies
