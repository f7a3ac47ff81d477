"""``bench.planner.monotone`` runs end to end at a small size, both sides in fresh processes."""

from __future__ import annotations

import json
import random

from bench.environment import REPO_ROOT
from bench.planner.monotone import draw_step, main, sweep_budgets
from lightning_accudnn.planner.recompute import candidate_spans
from lightning_accudnn.planner.search import EXACT_MAX_SEGMENTS


def test_drawn_steps_need_the_heuristic_search_and_their_budgets_rise_to_the_peak() -> None:
    rng = random.Random(3)
    for _ in range(5):
        step = draw_step(rng)
        assert len(candidate_spans(step)) > EXACT_MAX_SEGMENTS
        budgets = sweep_budgets(step, 4)
        assert budgets == sorted(set(budgets)) and budgets[-1] == step.unconstrained_peak_bytes


def test_the_same_checkout_on_both_sides_plans_the_same_steps(tmp_path) -> None:
    record = main(
        ["--steps", "2", "--budgets", "3", "--baseline", str(REPO_ROOT), "--results-dir", str(tmp_path)]
    )
    baseline, this = record["summary"]["baseline"], record["summary"]["this"]
    for key in (
        "steps",
        "budgets",
        "slower_than_a_smaller",
        "worst_excess",
        "sum_of_steps",
        "heuristic_share",
    ):
        assert baseline[key] == this[key], key
    assert this["budgets"] == 8 and this["sum_of_steps"] > 0
    (written,) = (tmp_path / "cpu").glob("*-planner-monotone.json")
    assert json.loads(written.read_text())["summary"] == record["summary"]
