"""Plan pickled steps at pickled budgets and print each plan's predicted step and CPU seconds.

Run by :mod:`bench.planner.monotone` as a script, in a fresh process whose ``PYTHONPATH`` is the
checkout being measured: it imports the standard library and that checkout's
``lightning_accudnn`` only.

    python bench/planner/budget_sweep.py STEPS.pkl

``STEPS.pkl`` holds a list of ``(StepProfile, [budget, ...])``. Each budget is planned under
``auto``, in the order given. Prints one JSON list with, per step, ``{"steps": predicted step
seconds per budget (null where refused), "seconds": CPU seconds (time.process_time) of all its
plans, "searches": how each plan was found}``.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from typing import Any


def sweep(steps: list[tuple[Any, list[int]]]) -> list[dict[str, Any]]:
    """Each step planned at each of its budgets (see the module docstring).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = tuple(LayerProfile(f"l{i}", 100, 100, 1.0, 2.0) for i in range(3))
        >>> swept = sweep([(StepProfile(layers, 0, 100.0, 100.0), [99, 200, 300])])
        >>> swept[0]["steps"], swept[0]["searches"]
        ([None, 12.0, 9.0], [None, 'exhaustive', 'exhaustive'])
    """
    from lightning_accudnn.planner.plan import BudgetTooSmallError, plan_swaps

    swept = []
    for profile, budgets in steps:
        predicted: list[float | None] = []
        searches: list[str | None] = []
        started = time.process_time()
        for budget in budgets:
            try:
                plan = plan_swaps(profile, budget, policy="auto")
            except BudgetTooSmallError:
                predicted.append(None)
                searches.append(None)
                continue
            predicted.append(plan.predicted_step_seconds)
            searches.append(plan.search)
        swept.append({"steps": predicted, "seconds": time.process_time() - started, "searches": searches})
    return swept


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as file:
        print(json.dumps(sweep(pickle.load(file))))
