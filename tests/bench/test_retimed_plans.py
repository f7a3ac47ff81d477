"""bench.retimed_plans on the CPU: plans from re-timed profiles, each planned step against its plan."""

import lightning_accudnn.session.planning as session_planning
from bench import retimed_plans


def test_each_draw_plans_from_its_own_times_and_the_planner_is_restored(tmp_path):
    planner = session_planning.plan_swaps
    record = retimed_plans.main(
        [
            "--workload",
            "tiny",
            "--draws",
            "2",
            "--fractions",
            "0.7",
            "--steps",
            "3",
            "--results-dir",
            str(tmp_path),
        ]
    )
    assert session_planning.plan_swaps is planner
    assert [run["draw"] for run in record["runs"]] == [1, 2]
    for run in record["runs"]:
        assert "refused" in run or run["worst"] <= 1.0
    (written,) = (tmp_path / "cpu").glob("*-retimed-plans-tiny.md")
    assert "Runs with a step above its prediction" in written.read_text()
