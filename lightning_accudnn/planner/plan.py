"""The planner: the fastest keep/swap plan whose predicted peak fits the budget.

Pure: a :class:`~lightning_accudnn.profile.StepProfile` in, a :class:`Plan` out.
Every plan is scored by the two-stream simulator in :mod:`.timeline`; the search is in
:mod:`.search`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lightning_accudnn.planner.budget import format_bytes
from lightning_accudnn.planner.search import search
from lightning_accudnn.planner.timeline import Timeline, _Prepared, _timeline
from lightning_accudnn.profile import StepProfile

__all__ = ["BudgetTooSmallError", "Plan", "copying_out_limit", "lower_bound_seconds", "plan_swaps"]


def copying_out_limit(budget_bytes: int) -> int:
    """The device bytes the strategy lets wait for their copy out: an eighth of the budget.

    When the host link cannot keep up with the forward pass, the engine makes the forward
    wait past this bound instead of piling activations up, and the planner simulates it.

    Example:
        >>> copying_out_limit(8_000_000_000)
        1000000000
    """
    return budget_bytes // 8


class BudgetTooSmallError(ValueError):
    """No plan fits the budget. ``min_budget_bytes`` is the smallest budget (reserve included)
    at which :func:`plan_swaps` succeeds for this profile.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 100, 0),), static_bytes=1_000)
        >>> try:
        ...     plan_swaps(profile, budget_bytes=1_000)
        ... except BudgetTooSmallError as error:
        ...     error.min_budget_bytes
        1100
    """

    def __init__(self, min_budget_bytes: int, budget_bytes: int, reserve_bytes: int) -> None:
        self.min_budget_bytes = min_budget_bytes
        self.budget_bytes = budget_bytes
        self.reserve_bytes = reserve_bytes
        needed = _rounded_up(min_budget_bytes)  # rounded up: that much is enough
        reserve = f" (including the {format_bytes(reserve_bytes)} reserve)" if reserve_bytes else ""
        super().__init__(
            f"memory budget {format_bytes(budget_bytes)} is too small for this training step: even the "
            f"least memory-hungry swap plan needs {needed} ({min_budget_bytes} bytes){reserve}. "
            f"Raise the budget to at least {needed}, or lower the batch size so that the "
            "activations shrink."
        )


def _rounded_up(nbytes: int) -> str:
    """``nbytes`` in the unit :func:`format_bytes` picks, rounded up to two decimals."""
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if nbytes >= size:
            return f"{math.ceil(nbytes * 100 / size) / 100:.2f}{unit}"
    return f"{nbytes}B"


def lower_bound_seconds(profile: StepProfile, budget_bytes: int) -> float:
    """Physical lower bound on the step time under ``budget_bytes`` (DESIGN.md).

    ``X = max(0, unconstrained peak - budget)`` bytes must leave the device in forward and
    come back in backward: ``LB = max(T_fwd, X / bw_out) + max(T_bwd, X / bw_in)``.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 400, 400, 1.0, 2.0),), static_bytes=100,
        ...                       d2h_bytes_per_second=100.0, h2d_bytes_per_second=50.0)
        >>> lower_bound_seconds(profile, budget_bytes=200)  # X = 300: max(1, 3) + max(2, 6)
        9.0
    """
    excess = max(0, profile.unconstrained_peak_bytes - budget_bytes)
    forward = sum(layer.forward_seconds for layer in profile.layers)
    backward = sum(layer.backward_seconds for layer in profile.layers)
    if excess == 0:
        return float(forward + backward)
    return float(
        max(forward, excess / profile.d2h_bytes_per_second)
        + max(backward, excess / profile.h2d_bytes_per_second)
    )


@dataclass(frozen=True)
class Plan:
    """Which layers swap, how far to prefetch, and what the performance model predicts.

    ``lower_bound_seconds`` is the physical bound for ``budget_bytes`` (the reserve is the
    planner's own margin, so its cost shows in ``bound_ratio``). ``min_budget_bytes`` is the
    smallest budget, reserve included, at which a plan exists (see :func:`plan_swaps`).
    ``search`` says how the plan was found: ``"nothing to swap"``, ``"exhaustive"`` or
    ``"heuristic"``.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = tuple(LayerProfile(name, 100, 100, 1e-3, 2e-3) for name in "abc")
        >>> plan = plan_swaps(StepProfile(layers, static_bytes=0), budget_bytes=250)
        >>> sorted(plan.swapped_layers), plan.predicted_peak_bytes, plan.bound_ratio
        (['a', 'b'], 200, 1.0)
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

    @property
    def bound_ratio(self) -> float:
        """Predicted step time over the lower bound (1.0 is perfect)."""
        if self.lower_bound_seconds > 0:
            return self.predicted_step_seconds / self.lower_bound_seconds
        return 1.0 if self.predicted_step_seconds == 0 else math.inf

    @property
    def swapped_layers(self) -> frozenset[str]:
        """Names of the swapped layers (what :class:`SwapSchedule` wants)."""
        return frozenset(layer.name for layer, s in zip(self.profile.layers, self.swap, strict=True) if s)

    @property
    def swapped_bytes(self) -> int:
        """Bytes copied out (and back in) per step."""
        return sum(
            layer.swappable_bytes for layer, s in zip(self.profile.layers, self.swap, strict=True) if s
        )

    @property
    def compute_wait_seconds(self) -> float:
        """Predicted time the compute stream waits for copies in."""
        return self.timeline.compute_wait_seconds if self.timeline is not None else 0.0

    def __str__(self) -> str:
        layers = self.profile.layers
        width = max([len("layer"), *(len(layer.name) for layer in layers)])
        lines = [
            f"{'layer':<{width}}  {'saved':>10}  {'swappable':>10}  {'fwd ms':>9}  {'bwd ms':>9}  decision"
        ]
        for layer, swapped in zip(layers, self.swap, strict=True):
            lines.append(
                f"{layer.name:<{width}}  {format_bytes(layer.saved_bytes):>10}  "
                f"{format_bytes(layer.swappable_bytes):>10}  {layer.forward_seconds * 1e3:>9.3f}  "
                f"{layer.backward_seconds * 1e3:>9.3f}  {'swap' if swapped else 'keep'}"
            )
        usable = self.budget_bytes - self.reserve_bytes
        swapped = f"{len(self.swapped_layers)} of {len(layers)} layers ({format_bytes(self.swapped_bytes)})"
        lines += [
            "",
            f"predicted peak {format_bytes(self.predicted_peak_bytes)} of {format_bytes(usable)} usable "
            f"(budget {format_bytes(self.budget_bytes)} less reserve {format_bytes(self.reserve_bytes)}; "
            f"least budget that fits {format_bytes(self.min_budget_bytes)})",
            f"predicted step {self.predicted_step_seconds * 1e3:.3f} ms, lower bound "
            f"{self.lower_bound_seconds * 1e3:.3f} ms, bound ratio {self.bound_ratio:.3f}",
            f"swapped {swapped}, prefetch window {format_bytes(self.prefetch_window_bytes)}, "
            f"compute waits {self.compute_wait_seconds * 1e3:.3f} ms ({self.search} search)",
        ]
        if self.timeline is not None:
            lines.append(f"peak at {self.timeline.peak_cause}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """Plain data for JSON (infinite bandwidths become ``None``).

        Example:
            >>> from lightning_accudnn.profile import LayerProfile, StepProfile
            >>> profile = StepProfile((LayerProfile("a", 100, 100),), static_bytes=0)
            >>> data = plan_swaps(profile, budget_bytes=1_000).to_dict()
            >>> data["predicted_peak_bytes"], data["layers"][0]["swap"]
            (100, False)
        """
        profile = self.profile
        return {
            "budget_bytes": self.budget_bytes,
            "reserve_bytes": self.reserve_bytes,
            "min_budget_bytes": self.min_budget_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_step_seconds": self.predicted_step_seconds,
            "lower_bound_seconds": self.lower_bound_seconds,
            "bound_ratio": _finite_or_none(self.bound_ratio),
            "compute_wait_seconds": self.compute_wait_seconds,
            "prefetch_window_bytes": self.prefetch_window_bytes,
            "swapped_bytes": self.swapped_bytes,
            "search": self.search,
            "static_bytes": profile.static_bytes,
            "d2h_bytes_per_second": _finite_or_none(profile.d2h_bytes_per_second),
            "h2d_bytes_per_second": _finite_or_none(profile.h2d_bytes_per_second),
            "peak": self.timeline.peak_cause if self.timeline is not None else None,
            "layers": [
                {
                    "name": layer.name,
                    "saved_bytes": layer.saved_bytes,
                    "swappable_bytes": layer.swappable_bytes,
                    "forward_seconds": layer.forward_seconds,
                    "backward_seconds": layer.backward_seconds,
                    "swap": swapped,
                }
                for layer, swapped in zip(profile.layers, self.swap, strict=True)
            ],
        }


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def plan_swaps(
    profile: StepProfile, budget_bytes: int, reserve_bytes: int = 0, max_copying_out_bytes: int | None = None
) -> Plan:
    """The fastest predicted plan whose predicted peak is at most ``budget_bytes - reserve_bytes``.

    ``max_copying_out_bytes`` is the engine's bound on bytes waiting for their copy out
    (the forward waits past it); the plan is simulated under it and carries it.

    Chooses keep/swap per layer and the prefetch window, scoring each candidate with
    :func:`~lightning_accudnn.planner.timeline.simulate`. If nothing needs swapping, nothing
    is swapped. Among equally fast plans it prefers fewer bytes copied, then the lower peak,
    then the smaller window.

    The search is **exhaustive** (all swap sets, every window that behaves differently) when
    the profile has at most 10 swappable layers and ``2**swappable * layers <= 16384``; this
    covers every profile of up to 8 layers, and the result is then the exact optimum of the
    model. Beyond that it is a **heuristic** with a bounded number of simulations (a descent
    towards the least peak from swapping everything, forward prefixes of the swappable
    layers, the largest window found to fit by bisection, then a bounded greedy refinement).
    The heuristic plan always fits, is never slower than swapping everything (which it
    evaluates, with window 0 and the largest window that fits), and it finds a plan
    whenever swapping everything with window 0 fits. Choosing the swap set exactly is
    subset-sum-like, hence no exact fast method.

    Raises :class:`BudgetTooSmallError` when no plan fits; its ``min_budget_bytes`` is the
    least peak over all plans plus the reserve (exhaustive search) or, for the heuristic, the
    peak of the budget-independent least-peak descent plus the reserve (an upper bound: when
    the copy stream falls behind the forward pass, a cleverer choice of layers may fit in a
    little less). Either way the planner succeeds with a budget of ``min_budget_bytes``.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = tuple(LayerProfile(f"l{i}", 100, 100, 1e-3, 2e-3) for i in range(4))
        >>> profile = StepProfile(layers, static_bytes=1_000, d2h_bytes_per_second=1e6,
        ...                       h2d_bytes_per_second=1e6)
        >>> plan = plan_swaps(profile, budget_bytes=1_300)
        >>> sorted(plan.swapped_layers), plan.predicted_peak_bytes, plan.compute_wait_seconds
        (['l0', 'l2'], 1300, 0.0)
    """
    if reserve_bytes < 0:
        raise ValueError(f"reserve_bytes must be >= 0, got {reserve_bytes}")
    prep = _Prepared(profile, max_copying_out_bytes)
    result = search(prep, budget_bytes - reserve_bytes)
    min_budget = result.min_peak_bytes + reserve_bytes
    if result.best is None:
        raise BudgetTooSmallError(min_budget, budget_bytes, reserve_bytes)
    best = result.best
    timeline = _timeline(prep, best.swap, best.window)
    return Plan(
        profile=profile,
        swap=best.swap,
        prefetch_window_bytes=best.window,
        budget_bytes=budget_bytes,
        reserve_bytes=reserve_bytes,
        predicted_peak_bytes=timeline.peak_bytes,
        predicted_step_seconds=timeline.step_seconds,
        lower_bound_seconds=lower_bound_seconds(profile, budget_bytes),
        min_budget_bytes=min_budget,
        search=result.method,
        max_copying_out_bytes=max_copying_out_bytes,
        timeline=timeline,
    )
