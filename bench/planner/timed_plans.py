"""Plan every cell of pickled profiles and print, per cell, the CPU seconds and a hash of the plan.

Run by :mod:`bench.planner.plan_time` as a script, in a fresh process whose ``PYTHONPATH`` is the
checkout being timed: it imports the standard library and that checkout's ``lightning_accudnn``
only (and, with ``--heap``, torch, torchvision and transformers first).

    python bench/planner/timed_plans.py PROFILES.pkl [--heap]

``PROFILES.pkl`` holds ``{case: StepProfile}``. Each cell (case, budget fraction, policy) is
planned on a fresh copy of its case's profile (another object, as each pass's profile is), in
the same order every run. Prints one JSON object: ``{"case fraction policy": {"seconds": CPU
seconds (time.process_time), "plan": sha256 of the plan's to_dict(), or of the refusal (the
smallest budget where none fits), "full_collections": how many times the garbage collector
walked the whole heap during the cell}}``.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import pickle
import sys
import time
from typing import Any

#: The table's budget fractions (labels) and the planner policies timed.
FRACTIONS = (("2/3", 2 / 3), ("1/2", 1 / 2), ("1/3", 1 / 3), ("1/4", 1 / 4))
POLICIES = ("auto", "swap", "recompute", "selective")


def digest(data: object) -> str:
    """sha256 of ``data`` as sorted JSON (what tells two plans apart).

    Example:
        >>> digest({"b": 1, "a": [1.5, None]}) == digest({"a": [1.5, None], "b": 1})
        True
    """
    text = json.dumps(data, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def time_cells(profiles: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """CPU seconds and plan hash of every cell of ``profiles`` (see the module docstring).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = tuple(LayerProfile(f"l{i}", 100, 100, 1e-3, 2e-3) for i in range(4))
        >>> cells = time_cells({"toy": StepProfile(layers, 0, 1e6, 1e6)})
        >>> len(cells), sorted(cells["toy 1/2 swap"])
        (16, ['full_collections', 'plan', 'seconds'])
        >>> cells["toy 1/2 recompute"]["plan"] == digest({"refused": "nothing to recompute"})  # no segments
        True
    """
    from lightning_accudnn.planner.plan import BudgetTooSmallError, NothingToRecomputeError, plan_swaps

    cells: dict[str, dict[str, Any]] = {}
    full = [0]

    def count(phase: str, info: dict[str, int]) -> None:
        full[0] += phase == "stop" and info["generation"] == 2

    gc.callbacks.append(count)
    for case, profile in profiles.items():
        for label, fraction in FRACTIONS:
            budget = profile.static_bytes + round(fraction * profile.saved_bytes)
            for policy in POLICIES:
                fresh = dataclasses.replace(profile)
                full[0] = 0
                started = time.process_time()
                try:
                    plan: object = plan_swaps(fresh, budget, policy=policy).to_dict()
                except BudgetTooSmallError as error:
                    plan = {"does not fit": error.min_budget_bytes}
                except NothingToRecomputeError:
                    plan = {"refused": "nothing to recompute"}
                seconds = time.process_time() - started
                cells[f"{case} {label} {policy}"] = {
                    "seconds": seconds,
                    "plan": digest(plan),
                    "full_collections": full[0],
                }
    gc.callbacks.remove(count)
    return cells


def main(argv: list[str]) -> None:
    if "--heap" in argv:
        import torch  # noqa: F401  (the heap of a process that plans)
        import torchvision  # noqa: F401
        import transformers  # noqa: F401
    with open(argv[0], "rb") as file:
        profiles = pickle.load(file)
    print(json.dumps(time_cells(profiles)))


if __name__ == "__main__":
    main(sys.argv[1:])
