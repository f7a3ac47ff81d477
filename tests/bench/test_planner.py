"""``python -m bench.planner --cases tiny`` end to end: every cell present and consistent, the files written.

No timing is asserted; what is checked is that each policy was planned through the planner
(or said why not), that the figures obey what the planner promises, and that the result
records where and at which commit it was computed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.planner import cli
from bench.planner.table import CHECKPOINT_BLOCKS, FRACTIONS, NOT_AVAILABLE, TABLE_POLICIES
from lightning_accudnn.planner.search import POLICIES


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    results = tmp_path_factory.mktemp("results")
    record = cli.main(["--cases", "tiny", "--results-dir", str(results)])
    return record, results / "cpu"


def test_every_fraction_and_policy_has_a_cell(tiny) -> None:
    record, _ = tiny
    (case,) = record["cases"]
    cells = {(row["fraction"], row["policy"]) for row in case["rows"]}
    assert cells == {(name, policy) for name, _ in FRACTIONS for policy in TABLE_POLICIES}
    for row in case["rows"]:
        offered = row["policy"] == CHECKPOINT_BLOCKS or row["policy"] in POLICIES
        assert (row["status"] == NOT_AVAILABLE) == (not offered)


def test_budgets_are_static_bytes_plus_a_share_of_the_activations(tiny) -> None:
    record, _ = tiny
    (case,) = record["cases"]
    for name, fraction in FRACTIONS:
        assert case["budgets"][name] == case["static_bytes"] + round(fraction * case["saved_bytes"])
    assert case["assumed_kernels"]["scaled_dot_product_attention"] == {"cudnn": 4}


def test_planned_cells_fit_and_lie_between_the_bound_and_the_step(tiny) -> None:
    record, _ = tiny
    (case,) = record["cases"]
    planned = [row for row in case["rows"] if row["status"] == "planned"]
    assert {row["policy"] for row in planned} >= {"auto", "swap", CHECKPOINT_BLOCKS}
    for row in planned:
        assert row["predicted_peak_bytes"] <= row["budget_bytes"]
        assert row["step_vs_unconstrained"] >= 1.0
        assert row["lower_bound_seconds"] <= row["predicted_step_seconds"] * (1 + 1e-9)
    for row in case["rows"]:
        if row["status"] == "does not fit":
            assert row["min_budget_bytes"] > row["budget_bytes"]


def test_full_checkpointing_recomputes_each_block_once(tiny) -> None:
    record, _ = tiny
    (case,) = record["cases"]
    rows = [row for row in case["rows"] if row["policy"] == CHECKPOINT_BLOCKS and row["status"] == "planned"]
    assert rows
    for row in rows:
        assert row["recomputed_segments"] == 4 and row["swapped_bytes"] == 0
        # one extra forward of the blocks: between 1x and 2x the step
        assert 1.0 < row["step_vs_unconstrained"] < 2.0


def test_files_say_what_was_computed_where(tiny) -> None:
    record, folder = tiny
    (json_path,) = folder.glob("*-planner-h100.json")
    written = json.loads(json_path.read_text())
    assert written["kind"] == "planner-table" and written["gpu"] == "H100 SXM 80GB"
    assert written["environment"]["device"] == "cpu"
    commit = written["environment"]["git"]["commit"]
    assert commit and commit in written["label"] and "not measurements" in written["label"]
    markdown = json_path.with_suffix(".md").read_text()
    assert written["label"] in markdown
    assert "## tiny transformer" in markdown and "full per-block checkpointing" in markdown


def _auto_properties(case: dict) -> None:
    """Per fraction, ``auto`` is never slower than another policy that plans, its bound is never
    above theirs (it searches a superset), a plan more than 2 % slower than the unconstrained
    step uses at least 90 % of the budget, and more budget is never slower."""
    rows = {(row["fraction"], row["policy"]): row for row in case["rows"]}
    previous = None
    for name, _ in FRACTIONS:
        auto = rows[(name, "auto")]
        assert auto["status"] == "planned", name
        for policy in TABLE_POLICIES:
            other = rows[(name, policy)]
            where = (name, policy)
            if other["status"] == "planned":
                assert auto["predicted_step_seconds"] <= other["predicted_step_seconds"] * (1 + 1e-9), where
            if policy in POLICIES and other["status"] != NOT_AVAILABLE:
                assert auto["lower_bound_seconds"] <= other["lower_bound_seconds"] * (1 + 1e-9), where
        if auto["step_vs_unconstrained"] > 1.02:
            assert auto["peak_share_of_budget"] >= 0.9, name
        if previous is not None:
            assert previous <= auto["predicted_step_seconds"] * (1 + 1e-9), name
        previous = auto["predicted_step_seconds"]


def test_auto_beats_every_policy_uses_the_budget_and_is_monotone(tiny) -> None:
    record, _ = tiny
    (case,) = record["cases"]
    # The tiny case's budgets (its saves' shares) leave no room for selective recomputation beside
    # its working memory (the cuBLAS workspaces, its head's logits): auto's cells say what they chose.
    assert all(
        "selective_segments" in row
        for row in case["rows"]
        if row["policy"] == "auto" and row["status"] == "planned"
    )
    _auto_properties(case)


@pytest.mark.slow
@pytest.mark.parametrize("key", ["resnet152-bf16", "gpt2-medium-bf16", "llama-1b-bf16", "resnet152-fp32"])
def test_auto_properties_on_the_table_models(key: str) -> None:
    from bench.planner.cases import CASES, trace_case
    from lightning_accudnn.profiling.gpus import get_gpu

    case = cli.case_record(trace_case(CASES[key], get_gpu("h100")))
    _auto_properties(case)
