"""What the timeline simulator gives back: the plan it scores (:class:`PlanChoice`), the
memory in issue order (:class:`MemoryEstimate`), the two-stream times (:class:`StepTimes`), and
the whole simulated step (:class:`Timeline`, one :class:`LayerTiming` per layer). The rules are
in :mod:`.timeline`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_accudnn.planner.budget import format_bytes

__all__ = ["LayerTiming", "MemoryEstimate", "PlanChoice", "SimulationResult", "StepTimes", "Timeline"]


@dataclass(frozen=True)
class PlanChoice:
    """What a plan chooses: swap flags per layer, the prefetch window and the copy-out limit.

    ``max_copying_out_bytes`` is ``None`` for no limit (nothing is retired in forward).

    Example:
        >>> PlanChoice((True, False), prefetch_window_bytes=0, max_copying_out_bytes=0).swap
        (True, False)
    """

    swap: tuple[bool, ...]
    prefetch_window_bytes: int = 0
    max_copying_out_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.prefetch_window_bytes < 0:
            raise ValueError(f"prefetch_window_bytes must be >= 0, got {self.prefetch_window_bytes}")
        if self.max_copying_out_bytes is not None and self.max_copying_out_bytes < 0:
            raise ValueError(f"max_copying_out_bytes must be >= 0, got {self.max_copying_out_bytes}")


@dataclass(frozen=True)
class MemoryEstimate:
    """The predicted peak of a plan and where it happens; ``levels`` has one entry per compute op.

    ``peak_event`` is ``"static"`` (no layers), ``"between passes"`` (static memory and the
    optimizer step's working memory, ``StepProfile.outside_working_bytes``), ``"forward"``
    (while ``F`` of ``peak_layer`` runs) or ``"backward"`` (while ``B`` of ``peak_layer`` runs).
    ``forward_levels[i]`` and ``backward_levels[i]`` are the bytes counted at ``F_i`` and during
    ``B_i``, working memory included.

    Example:
        >>> from lightning_accudnn.planner.timeline import Simulator, simulate
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 10, 10),), static_bytes=5)
        >>> Simulator(profile).memory(PlanChoice((False,))).peak_bytes
        15
    """

    peak_bytes: int
    peak_event: str
    peak_index: int
    forward_levels: tuple[int, ...]
    backward_levels: tuple[int, ...]


@dataclass(frozen=True)
class StepTimes:
    """The simulated step time, when the forward ends and how long compute waited for copies.

    Example:
        >>> StepTimes(step_seconds=3.0, forward_seconds=1.0, compute_wait_seconds=0.0).step_seconds
        3.0
    """

    step_seconds: float
    forward_seconds: float
    compute_wait_seconds: float


@dataclass(frozen=True)
class SimulationResult:
    """Memory and time of one plan: what the search compares.

    Example:
        >>> from lightning_accudnn.planner.timeline import Simulator, simulate
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 10, 10, 1.0, 2.0),), static_bytes=0)
        >>> result = Simulator(profile).run(PlanChoice((False,)))
        >>> result.peak_bytes, result.step_seconds
        (10, 3.0)
    """

    choice: PlanChoice
    memory: MemoryEstimate
    times: StepTimes

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak_bytes

    @property
    def step_seconds(self) -> float:
        return self.times.step_seconds


@dataclass(frozen=True)
class LayerTiming:
    """When one layer's compute and copies happen in a simulated step (seconds from start).

    Copy times are ``None`` for a layer that is not swapped. ``retired`` says whether its
    bytes left the device in forward (else it stayed in the in-flight FIFO and is used in
    place in backward: no prefetch, no copy in).

    Example:
        >>> from lightning_accudnn.planner.timeline import Simulator, simulate
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 10, 10, 1.0, 2.0),), static_bytes=0)
        >>> simulate(profile, [False], 0).layers[0]
        LayerTiming(name='a', swapped=False, forward_start=0.0, forward_end=1.0, \
backward_start=1.0, backward_end=3.0, copy_out_start=None, copy_out_end=None, retired=False, \
prefetch_start=None, copy_in_start=None, copy_in_end=None)
    """

    name: str
    swapped: bool
    forward_start: float
    forward_end: float
    backward_start: float
    backward_end: float
    copy_out_start: float | None = None
    copy_out_end: float | None = None
    retired: bool = False
    prefetch_start: float | None = None
    copy_in_start: float | None = None
    copy_in_end: float | None = None


@dataclass(frozen=True)
class Timeline:
    """The simulated step: peak memory (issue order), its cause, and the two-stream times.

    ``swap`` is the effective plan (layers with nothing swappable are reported as kept).

    Example:
        >>> from lightning_accudnn.planner.timeline import Simulator, simulate
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile(
        ...     (LayerProfile("a", 100, 100, 1.0, 1.0), LayerProfile("b", 100, 100, 1.0, 1.0)),
        ...     static_bytes=1_000, d2h_bytes_per_second=100.0, h2d_bytes_per_second=100.0)
        >>> timeline = simulate(profile, [True, False], 0, max_copying_out_bytes=0)
        >>> timeline.peak_bytes, timeline.step_seconds, timeline.compute_wait_seconds
        (1200, 4.0, 0.0)
        >>> timeline.peak_cause
        "forward of 'b': 1.20 KB"
    """

    peak_bytes: int
    peak_event: str
    peak_layer: str | None
    step_seconds: float
    forward_seconds: float
    compute_wait_seconds: float
    prefetch_window_bytes: int
    max_copying_out_bytes: int | None
    swap: tuple[bool, ...]
    layers: tuple[LayerTiming, ...]
    memory: MemoryEstimate
    static_bytes: int

    @property
    def peak_cause(self) -> str:
        """A one-line account of the peak, e.g. ``"backward of 'conv3': 7.20 GB"``."""
        if self.peak_event == "static":
            return f"static memory: {format_bytes(self.peak_bytes)}"
        if self.peak_event == "between passes":
            return (
                f"between the passes (static and optimizer working memory): {format_bytes(self.peak_bytes)}"
            )
        return f"{self.peak_event} of {self.peak_layer!r}: {format_bytes(self.peak_bytes)}"

    def memory_curve(self) -> tuple[list[float], list[int]]:
        """Predicted device bytes over the step as a step function: (times, bytes from each time).

        Each compute op's level is drawn from its start; the step ends with static memory.

        Example:
            >>> from lightning_accudnn.planner.timeline import Simulator, simulate
            >>> from lightning_accudnn.profile import LayerProfile, StepProfile
            >>> profile = StepProfile((LayerProfile("a", 100, 100, 1.0, 1.0),), static_bytes=10)
            >>> simulate(profile, [False], 0).memory_curve()
            ([0.0, 1.0, 2.0], [110, 110, 10])
        """
        times: list[float] = []
        values: list[int] = []
        for timing, level in zip(self.layers, self.memory.forward_levels, strict=True):
            times.append(timing.forward_start)
            values.append(level)
        for timing, level in zip(reversed(self.layers), reversed(self.memory.backward_levels), strict=True):
            times.append(timing.backward_start)
            values.append(level)
        end = self.layers[0].backward_end if self.layers else 0.0
        times.append(max(end, self.step_seconds))
        values.append(self.static_bytes)
        return times, values
