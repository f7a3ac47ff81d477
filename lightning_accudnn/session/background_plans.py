"""Plans made on threads of their own while training goes on.

A pass kind's first plan is made at the end of its profiling pass: nothing can run before it.
The plans that only refine it (made again from planned passes' warmer timings, the plan in
force still fitting the budget) need not stop training: :class:`BackgroundPlans` makes each on
a thread of its own, the pass kind keeps running its plan meanwhile, and the first pass of the
kind that starts after the plan is ready adopts it. The planner is pure Python on immutable
figures (:func:`~lightning_accudnn.planner.plan.plan_swaps`), so such a thread shares nothing
with training but the CPU and the interpreter's lock (which torch's kernels, CUDA's waits and
the autograd engine's backward release; Python that issues kernels holds it). Each thread ends
with its plan: none outlives the plans in the making (a process that forks, as a data loader's
workers do, rarely has one to fork beside).

A plan made under a headroom that has changed since (the reserve grew) is never taken; an
error making a plan is raised by :meth:`BackgroundPlans.take`, where the plan would be adopted.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from lightning_accudnn.planner.plan import Plan

__all__ = ["THREAD_NAME", "BackgroundPlans", "ReadyPlan"]


@dataclass(frozen=True)
class ReadyPlan:
    """A plan made on a thread, with that thread's wall-clock seconds making it.

    Example:
        >>> from lightning_accudnn.planner import plan_swaps
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> plan = plan_swaps(StepProfile((LayerProfile("fc", 10, 10, 1e-3, 2e-3),), 5), 100)
        >>> ReadyPlan(plan, seconds=0.01).plan.swapped_layers
        frozenset()
    """

    plan: Plan
    seconds: float


@dataclass(frozen=True)
class _Pending:
    future: concurrent.futures.Future[ReadyPlan]
    made_under: object  # what the plan is valid under (the headroom): another one discards it


class BackgroundPlans:
    """At most one plan in the making per key, each on a thread of its own.

    Example:
        >>> from lightning_accudnn.planner import plan_swaps
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("fc", 4_000, 4_000, 1e-3, 2e-3),), static_bytes=1_000)
        >>> plans = BackgroundPlans()
        >>> plans.submit("pass 0", lambda: plan_swaps(profile, 10_000), made_under="headroom")
        >>> plans.waiting("pass 0")
        True
        >>> plans.wait_all()
        >>> plans.in_making()
        False
        >>> ready = plans.take("pass 0", made_under="headroom")
        >>> ready.plan.predicted_peak_bytes <= 10_000, plans.waiting("pass 0")
        (True, False)
        >>> plans.close()
    """

    def __init__(self) -> None:
        self._pending: dict[Hashable, _Pending] = {}
        self._threads: list[threading.Thread] = []

    def submit(self, key: Hashable, make: Callable[[], Plan], *, made_under: object) -> None:
        """Make ``key``'s plan with ``make`` on a thread (replacing one still in the making)."""
        self.drop(key)
        future: concurrent.futures.Future[ReadyPlan] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        thread = threading.Thread(target=_run, args=(make, future), name=THREAD_NAME, daemon=True)
        self._threads = [each for each in self._threads if each.is_alive()]
        self._threads.append(thread)
        self._pending[key] = _Pending(future, made_under)
        thread.start()

    def waiting(self, key: Hashable) -> bool:
        """Whether a plan for ``key`` is in the making or ready and not taken yet."""
        return key in self._pending

    def in_making(self) -> bool:
        """Whether a thread is making a plan now (it shares the host with the training thread)."""
        return any(not pending.future.done() for pending in self._pending.values())

    def take(self, key: Hashable, *, made_under: object) -> ReadyPlan | None:
        """``key``'s plan when it is ready and was made under ``made_under`` (``None`` while it
        is in the making, when there is none, or when it was made under something else: it is
        then forgotten). Raises what the thread raised making it."""
        pending = self._pending.get(key)
        if pending is None or not pending.future.done():
            return None
        del self._pending[key]
        ready = pending.future.result()
        return ready if pending.made_under is made_under else None

    def wait_all(self) -> None:
        """Wait until every plan in the making is ready (not taken: :meth:`take` takes each)."""
        concurrent.futures.wait([pending.future for pending in self._pending.values()])

    def drop(self, key: Hashable | None = None) -> None:
        """Forget ``key``'s plan (every key's with ``None``); one in the making finishes unused."""
        if key is None:
            self._pending.clear()
        else:
            self._pending.pop(key, None)

    def close(self) -> None:
        """Forget every plan, and wait for the threads still making one. Idempotent."""
        self.drop()
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()


#: The name of the threads plans are made on.
THREAD_NAME = "accudnn-planner"


def _run(make: Callable[[], Plan], future: concurrent.futures.Future[ReadyPlan]) -> None:
    started = time.perf_counter()
    try:
        plan = make()
    except BaseException as error:  # handed to the training thread, which raises it
        future.set_exception(error)
    else:
        future.set_result(ReadyPlan(plan, time.perf_counter() - started))
