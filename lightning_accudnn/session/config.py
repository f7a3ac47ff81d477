"""The offload options, in one frozen object that every entry point takes."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_accudnn.planner.budget import Budget
from lightning_accudnn.planner.search import check_policy
from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES

__all__ = [
    "DEFAULT_HOST_MEMORY_SHARE",
    "DEFAULT_OBSERVE_EVERY",
    "RESERVE_DIVISOR",
    "RESERVE_FLOOR_BYTES",
    "OffloadConfig",
    "default_reserve_bytes",
    "smallest_budget_bytes",
]

#: Share of system RAM the pinned pool may take unless told otherwise.
DEFAULT_HOST_MEMORY_SHARE = 0.5

#: In steady state one pass in this many of a kind whose plan keeps everything is observed.
DEFAULT_OBSERVE_EVERY = 8


@dataclass(frozen=True)
class OffloadConfig:
    """What to offload and within which limits; checked once, when it is made.

    Both strategies and :class:`~lightning_accudnn.OffloadSession` take one. The fields:

    * ``budget``: device memory the training step may use: an int of bytes, ``"12GB"``
      (powers of 10), ``"12GiB"`` (powers of 2), ``"80%"`` of the device or ``"auto"``, the
      device's free memory (see :class:`~lightning_accudnn.Budget` for every accepted spelling).
      The allocator is capped at the budget and plans use the budget less ``reserve_bytes``:
      one reserve, ``"auto"`` included.
    * ``min_swap_bytes``: saved tensors smaller than this stay on the device.
    * ``keep_on_device``: module-name patterns (``fnmatch``) whose activations never swap,
      e.g. ``("head", "decoder.layers.23.*")``; a pattern that matches no module of the
      model is refused before training. A single string is one pattern.
    * ``host_memory_limit``: cap on pinned host memory (the same forms as ``budget``,
      against system RAM); ``None`` is half of system RAM.
    * ``reserve_bytes``: kept free under the budget for the allocator's fragmentation and what
      the plans' model of the step misses (the only reserve: ``"auto"`` keeps no other; the
      working memory the hooked passes measure, workspaces included, the plans count);
      ``None`` is the larger of 256 MiB and 5% of the budget on CUDA, 0 on CPU. It grows when a
      planned pass goes past its room.
    * ``policy``: what a plan may do with a segment besides keeping it: ``"auto"`` (swap or
      recompute, whichever is fastest), ``"swap"`` (swap only), ``"recompute"``
      (recompute only) or ``"selective"`` (recompute selectively only: keep what matrix
      products, convolutions and attention write, run the other ops of a segment again).
    * ``observe_every``: in steady state a pass runs with the engine's hooks only up to its
      last swapped saved tensor (none at all when its plan swaps nothing), and the hooks cost
      nothing per saved tensor after it, but for one pass of its kind in this many, observed
      whole: a changed graph shows there, and the next pass profiles it (a change before the
      last swapped save shows at once). A plan that recomputes selectively and swaps is
      observed every pass. ``1`` observes every pass. On CUDA the allocator's peak is checked
      against the budget every pass either way.
    * ``pause_gc``: hold Python's cyclic garbage collector off from a training pass's forward
      to the end of its backward, so that the objects a swapping pass makes are freed by
      reference counting instead of promoted into full collections
      (:mod:`lightning_accudnn.session.collector_pause`); ``False`` leaves it alone.
    * ``plan_in_background``: make the plans that refine a pass kind's plan from its warmer
      timings (after its profiling pass, two planned passes are timed again, see
      :mod:`~lightning_accudnn.session.warm_times`) on a thread of their own while training goes on;
      the first pass of the kind that starts after such a plan is ready adopts it, and until
      then the kind runs the plan in force, which fits the budget as well
      (:mod:`~lightning_accudnn.session.background_plans`). ``False`` makes them at the end of
      the pass they come from, so that which plan every pass runs does not depend on how long
      planning takes. Gradients are the same either way. Ranks of a distributed run make the
      plans they agree on at once either way, so that they run them from the same pass.
    * ``whole_model_compile``: ``None`` (a model compiled whole is refused before training)
      or ``"experimental"``: such a model is planned inside its compiled graph (see
      :mod:`lightning_accudnn.whole_model_compile`; PyTorch 2.14.1 only, swap or keep per
      layer; ``keep_on_device`` then names modules of the compiled graph, checked after its
      first forward).
    * ``whole_model_backend``: what that route compiles the model with, ``"inductor"``
      (``torch.compile``'s default) or ``"aot_eager"``; the backend and options the model
      was compiled with are not used on that route.

    Example:
        >>> config = OffloadConfig(budget="12GB", keep_on_device="head")
        >>> config.budget, config.keep_on_device
        (Budget(kind='bytes', value=12000000000.0), ('head',))
        >>> config.replace(min_swap_bytes=0).min_swap_bytes
        0
        >>> OffloadConfig(min_swap_bytes=-1)
        Traceback (most recent call last):
        ...
        ValueError: min_swap_bytes must be an int >= 0, got -1
    """

    budget: Budget | int | str = "auto"
    min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES
    keep_on_device: Sequence[str] = ()
    host_memory_limit: Budget | int | str | None = None
    reserve_bytes: int | None = None
    policy: str = "auto"
    observe_every: int = DEFAULT_OBSERVE_EVERY
    pause_gc: bool = True
    plan_in_background: bool = True
    whole_model_compile: str | None = None
    whole_model_backend: str = "inductor"

    def __post_init__(self) -> None:
        check_policy(self.policy)
        if (
            isinstance(self.observe_every, bool)
            or not isinstance(self.observe_every, int)
            or self.observe_every < 1
        ):
            raise ValueError(f"observe_every must be an int >= 1 (1: every pass), got {self.observe_every!r}")
        if not isinstance(self.pause_gc, bool):
            raise ValueError(f"pause_gc must be True or False, got {self.pause_gc!r}")
        if not isinstance(self.plan_in_background, bool):
            raise ValueError(f"plan_in_background must be True or False, got {self.plan_in_background!r}")
        set_field = object.__setattr__  # frozen: normalise once, here
        set_field(self, "budget", Budget.parse(self.budget))
        if self.host_memory_limit is not None:
            set_field(self, "host_memory_limit", Budget.parse(self.host_memory_limit))
        if isinstance(self.min_swap_bytes, bool) or not isinstance(self.min_swap_bytes, int):
            raise ValueError(f"min_swap_bytes must be an int >= 0, got {self.min_swap_bytes!r}")
        if self.min_swap_bytes < 0:
            raise ValueError(f"min_swap_bytes must be an int >= 0, got {self.min_swap_bytes}")
        if self.reserve_bytes is not None and (
            isinstance(self.reserve_bytes, bool)
            or not isinstance(self.reserve_bytes, int)
            or self.reserve_bytes < 0
        ):
            raise ValueError(f"reserve_bytes must be None or an int >= 0, got {self.reserve_bytes!r}")
        patterns = (self.keep_on_device,) if isinstance(self.keep_on_device, str) else self.keep_on_device
        patterns = tuple(patterns)
        if not all(isinstance(pattern, str) and pattern for pattern in patterns):
            raise ValueError(f"keep_on_device must hold non-empty module-name patterns, got {patterns!r}")
        set_field(self, "keep_on_device", patterns)
        check_whole_model_compile(self)

    @property
    def parsed_budget(self) -> Budget:
        """``budget`` as the :class:`~lightning_accudnn.Budget` it was parsed into."""
        assert isinstance(self.budget, Budget)
        return self.budget

    @property
    def parsed_host_memory_limit(self) -> Budget | None:
        assert self.host_memory_limit is None or isinstance(self.host_memory_limit, Budget)
        return self.host_memory_limit

    def replace(self, **changes: Any) -> OffloadConfig:
        """A copy with ``changes`` applied (and checked)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, config: OffloadConfig | None = None, **options: Any) -> OffloadConfig:
        """``config`` (default: all defaults) with ``options`` applied: how strategies take both.

        Example:
            >>> OffloadConfig.of(OffloadConfig(budget="2GB"), min_swap_bytes=0).budget
            Budget(kind='bytes', value=2000000000.0)
            >>> OffloadConfig.of(budgett="2GB")
            Traceback (most recent call last):
            ...
            TypeError: unknown offload option 'budgett'; the options are budget, min_swap_bytes, \
keep_on_device, host_memory_limit, reserve_bytes, policy, observe_every, pause_gc, \
plan_in_background, whole_model_compile, whole_model_backend
        """
        names = option_names()
        for name in options:
            if name not in names:
                raise TypeError(f"unknown offload option {name!r}; the options are {', '.join(names)}")
        base = config if config is not None else cls()
        return base.replace(**options) if options else base


#: The default reserve on CUDA: the larger of this many bytes and a :data:`RESERVE_DIVISOR`-th
#: of the budget.
RESERVE_FLOOR_BYTES = 256 * 2**20
RESERVE_DIVISOR = 20


def default_reserve_bytes(budget_bytes: int, device_type: str) -> int:
    """The reserve kept under ``budget_bytes`` when ``OffloadConfig.reserve_bytes`` is ``None``:
    on CUDA the larger of 256 MiB and 5% of the budget (the caching allocator's fragmentation,
    and what the plans' model of the step misses), elsewhere nothing.

    Example:
        >>> default_reserve_bytes(8 * 10**9, "cuda"), default_reserve_bytes(10**9, "cuda") == 2**28
        (400000000, True)
        >>> default_reserve_bytes(8 * 10**9, "cpu")
        0
    """
    return max(RESERVE_FLOOR_BYTES, budget_bytes // RESERVE_DIVISOR) if device_type == "cuda" else 0


def smallest_budget_bytes(usable_bytes: int, device_type: str) -> int:
    """The smallest budget whose part left to the plans, the budget less its default reserve
    (:func:`default_reserve_bytes`, which grows with the budget), is at least ``usable_bytes``:
    the budget to name when a plan needs that much and the reserve is left to its default.

    Example:
        >>> budget = smallest_budget_bytes(9 * 10**9, "cuda")
        >>> budget - default_reserve_bytes(budget, "cuda") >= 9 * 10**9
        True
        >>> budget - 1 - default_reserve_bytes(budget - 1, "cuda") < 9 * 10**9
        True
        >>> smallest_budget_bytes(10**9, "cuda") - 10**9 == RESERVE_FLOOR_BYTES
        True
        >>> smallest_budget_bytes(5, "cpu")
        5
    """
    if device_type != "cuda":
        return usable_bytes
    # budget - budget // D >= usable  <=>  budget >= (D * (usable - 1)) // (D - 1) + 1
    share = RESERVE_DIVISOR * (usable_bytes - 1) // (RESERVE_DIVISOR - 1) + 1
    return max(usable_bytes + RESERVE_FLOOR_BYTES, share)


def check_whole_model_compile(config: OffloadConfig) -> None:
    """Refuse a ``whole_model_compile`` setting the route cannot serve, when the config is made.

    Example:
        >>> OffloadConfig(whole_model_compile="yes")
        Traceback (most recent call last):
        ...
        ValueError: whole_model_compile must be None or 'experimental', got 'yes'
        >>> OffloadConfig(whole_model_compile="experimental", policy="recompute")
        Traceback (most recent call last):
        ...
        ValueError: whole_model_compile='experimental' plans keep or swap per layer (its trial partition \
measures bytes, not the times recomputation is weighed by): use policy 'swap' or 'auto', not 'recompute'
    """
    if config.whole_model_compile is None:
        if config.whole_model_backend != "inductor":
            raise ValueError(
                f"whole_model_backend={config.whole_model_backend!r} is used only with "
                "whole_model_compile='experimental'; set both, or neither"
            )
        return
    if config.whole_model_compile != "experimental":
        raise ValueError(
            f"whole_model_compile must be None or 'experimental', got {config.whole_model_compile!r}"
        )
    from lightning_accudnn.whole_model_compile.backend import (
        COMPILERS,
        check_torch_version,
    )  # imports Dynamo: only when asked

    check_torch_version()
    if config.whole_model_backend not in COMPILERS:
        raise ValueError(
            f"whole_model_backend must be one of {', '.join(COMPILERS)} (what the whole-model route compiles "
            f"the model with), got {config.whole_model_backend!r}"
        )
    if config.policy in ("recompute", "selective"):
        raise ValueError(
            "whole_model_compile='experimental' plans keep or swap per layer (its trial partition measures "
            "bytes, not the times recomputation is weighed by): use policy 'swap' or 'auto', not "
            f"{config.policy!r}"
        )


def option_names() -> tuple[str, ...]:
    """The names :class:`OffloadConfig` takes, in order (how a strategy sorts its keywords)."""
    return tuple(field.name for field in dataclasses.fields(OffloadConfig))
