"""``bench.planner.zoo`` runs ``accudnn plan`` for the models named and writes which planned."""

from __future__ import annotations

import json

from bench.planner.zoo import main


def test_the_zoo_writes_each_model_s_outcome(tmp_path) -> None:
    assert main(["--models", "squeezenet1_0,no_such_model", "--results-dir", str(tmp_path)]) == 1
    (written,) = (tmp_path / "cpu").glob("*-planner-zoo.json")
    rows = {row["model"]: row for row in json.loads(written.read_text())["rows"]}
    assert rows["squeezenet1_0"]["status"] == 0 and rows["squeezenet1_0"]["input_shape"] == [3, 224, 224]
    assert rows["no_such_model"]["status"] == 2
    assert "unknown torchvision model" in rows["no_such_model"]["error"]
    assert "1 of 2 planned" in written.with_suffix(".md").read_text()
