"""``python -m bench.overhead.recompute`` and ``bench.overhead.lean_checkpoint`` at a small
depth: every row measured and counted, the forced plans run, every row's weights (or the floor's
gradients) bitwise the plain row's. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

from bench.overhead import lean_checkpoint, recompute


def test_every_row_is_measured_counted_and_bitwise_plain(tmp_path: Path) -> None:
    assert (
        recompute.main(
            [
                "--depth",
                "26",
                "--steps",
                "1",
                "--rounds",
                "1",
                "--counted-steps",
                "1",
                "--results-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    (written,) = (tmp_path / "cpu").glob("*-recompute-host.json")
    data = json.loads(written.read_text())
    assert written.with_suffix(".md").exists()
    assert data["bitwise_equal"] and all(data["equality"].values())
    rows = data["rows"]
    assert set(rows) == set(recompute.ROWS)
    for row in rows.values():
        assert (
            row["cpu_ms_per_step"] > 0 and row["bytecodes_per_step"] > 0 and row["python_calls_per_step"] > 0
        )
    # Recomputation runs the blocks' forward again: more Python than a plain step, less for half the blocks.
    bytecodes = {name: row["bytecodes_per_step"] for name, row in rows.items()}
    assert bytecodes["plain"] < bytecodes["recompute_half"] < bytecodes["recompute_all"]
    assert bytecodes["plain"] < bytecodes["checkpoint"]


def test_the_lean_checkpoint_floor_is_measured_and_its_gradients_are_plain() -> None:
    result = lean_checkpoint.measure(depth=26, rounds=1, steps=1, counted_steps=1)
    assert result["gradients_bitwise_plain"]
    rows = result["rows"]
    assert set(rows) == set(lean_checkpoint.ROWS)
    # The floor runs the blocks again with less Python than torch.utils.checkpoint, more than plain.
    bytecodes = {name: row["bytecodes_per_step"] for name, row in rows.items()}
    assert bytecodes["plain"] < bytecodes["lean"] < bytecodes["checkpoint"]
