"""``python -m bench.overhead --quick`` end to end on the CPU: every figure present, the files written.

No timing is asserted (the figures are wall-clock times of a shared machine); what is
checked is that each figure was measured, the swaps the benchmark relies on happened, and
the result records where it was measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.overhead import cli
from bench.overhead.spread import Spread
from lightning_accudnn import OffloadConfig
from lightning_accudnn.session.steady_costs import STEADY_TIMED_PASSES
from lightning_accudnn.session.warm_times import TIMED_PLANNED_PASSES

SPREAD_KEYS = {"median", "low", "high", "n"}
PER_UNIT = (
    "module_call_us",
    "kept_saved_tensor_us_above_floor",
    "swapped_saved_tensor_us_above_floor",
    "swapped_saved_tensor_us_above_copy_floor",
    "parameter_us",
    "kept_saved_tensor_us_total",
    "swapped_saved_tensor_us_total",
)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    results = tmp_path_factory.mktemp("results")
    data = cli.main(["--quick", "--results-dir", str(results)])
    return data, results / "cpu"


def _is_spread(value: object, rounds: int) -> bool:
    return isinstance(value, dict) and set(value) == SPREAD_KEYS and value["n"] == rounds


def test_every_figure_is_measured(quick: tuple[dict, Path]) -> None:
    data, _ = quick
    rounds = cli.QUICK.repeats
    assert data["kind"] == "bench.overhead" and data["quick"] is True
    for key in PER_UNIT:
        assert _is_spread(data["per_unit"][key], rounds), key
    assert _is_spread(data["floor"]["us_per_saved_tensor"], cli.QUICK.floor_repeats)
    assert _is_spread(data["copy_floor"]["us_per_saved_tensor"], cli.QUICK.floor_repeats)
    assert data["copy_floor"]["what"].startswith("a saved_tensors_hooks pair copying")
    deep = data["deep_narrow"]
    for key in (
        "ratio_nothing_swapped",
        "ratio_nothing_swapped_observed",
        "ratio_nothing_swapped_amortised",
        "ratio_half_swapped",
        "ratio_half_swapped_observed",
        "ratio_half_swapped_amortised",
        "ratio_half_swapped_mean",
        "measured_swapped_fraction",
        "swapped_storages_per_step",
        "swap_us_above_observed_step",
        "swap_us_above_observed_step_at_target",
    ):
        assert _is_spread(deep[key], rounds), key
    for key in ("ratio_half_swapped", "measured_swapped_fraction", "swapped_storages_per_step"):
        assert _is_spread(deep["statistics_kept"][key], rounds), key
    assert deep["errors"] == []
    for name in ("resnet152", "gpt2_medium"):
        item = data["structured"][name]
        for key in ("host_ms_added", "host_ms_added_typical", "host_ms_added_observed", "share_of_h100_step"):
            assert _is_spread(item[key], rounds), (name, key)
        assert item["h100"]["predicted_step_seconds"] > 0 and "datasheet" in item["h100"]["source"]
        assert item["h100"]["command"].startswith("python -m lightning_accudnn plan ")
        assert item["errors"] == []
    for name, value in data["full_collections_per_100_steps"].items():
        assert value is not None and value >= 0, name


def test_the_swaps_the_figures_rely_on_happened(quick: tuple[dict, Path]) -> None:
    data, _ = quick
    fits = data["fits"]
    assert all(len(runs) == cli.QUICK.repeats for runs in fits.values())
    for name, runs in fits.items():
        for fit in runs:
            assert fit["error"] is None, (name, fit["error"])
            assert len(fit["step_seconds"]) == cli.QUICK.steps
            if "/accudnn" in name:
                assert fit["profiling_steps"] == 0, name  # the warm-up reached the planned steps
    assert all(fit["swapped_bytes_per_step"] == 0 for fit in fits["tanhs/accudnn"])
    # The per-unit and "-observed" fits pass every save through the hooks; the typical fits of a
    # plan that keeps everything measure steady-state passes that skip them.
    for name, runs in fits.items():
        for fit in runs:
            if name.endswith("-observed") or name.split("/")[0] in ("base", "adds", "tanhs", "params"):
                assert fit["observed_steps"] == (len(fit["step_seconds"]) if "/accudnn" in name else 0), name
    for name in ("deep_narrow", "resnet152", "gpt2_medium"):
        assert all(fit["observed_steps"] == 0 for fit in fits[f"{name}/accudnn"]), name
    assert all(fit["swapped_bytes_per_step"] > 0 for fit in fits["tanhs/accudnn-swapped"])
    # Half swapped: the typical steps pass the hooks only up to their last swapped save.
    for name in ("deep_narrow/accudnn-half", "deep_narrow/accudnn-half-statistics-kept"):
        assert all(fit["swapped_storages_per_step"] > 0 for fit in fits[name]), name
        assert all(fit["observed_steps"] == 0 for fit in fits[name]), name
    # Keeping the LayerNorm statistics leaves no more storages to swap (at the quick size the plan
    # of every storage swappable may swap no statistic either: then they swap as many).
    half, kept_statistics = fits["deep_narrow/accudnn-half"], fits["deep_narrow/accudnn-half-statistics-kept"]
    for every, kept in zip(half, kept_statistics, strict=True):
        assert kept["swapped_storages_per_step"] <= every["swapped_storages_per_step"]
    fraction = data["deep_narrow"]["measured_swapped_fraction"]
    assert 0 < fraction["low"] <= fraction["high"] < 1
    planned = data["budgets"]["deep_narrow_half"]["planned_swapped_fraction"]
    assert 0.45 <= planned <= 0.55
    counts = data["workloads"]
    assert counts["tanhs"]["module_calls"] == counts["adds"]["module_calls"]
    assert counts["tanhs"]["saved_tensors"] - counts["adds"]["saved_tensors"] == cli.QUICK.units


def test_files_label_and_environment(quick: tuple[dict, Path]) -> None:
    data, folder = quick
    files = data["files"]
    assert json.loads((folder / files["json"]).read_text())["per_unit"] == json.loads(
        json.dumps(data["per_unit"])
    )
    markdown = (folder / files["markdown"]).read_text()
    assert "µs per module call" in markdown and "--quick run" in markdown and "CPU" in markdown
    assert "calibration fits" in (folder / files["log"]).read_text()
    env = data["environment"]
    assert env["device"] == "cpu" and env["torch"] and env["lightning"]
    assert env["git"]["commit"] and isinstance(env["git"]["dirty"], bool)


def test_spread() -> None:
    assert Spread.of([None, 2.0, 1.0, 3.0]) == Spread(2.0, 1.0, 3.0, 3)
    assert Spread.of([None]) is None


def test_bytecodes_per_swapped_storage_are_counted_the_same_each_time():
    from bench.overhead.bytecodes import count_bytecodes

    first, second = count_bytecodes(layers=4), count_bytecodes(layers=4)
    assert first["swapped_storages"] > 0
    assert first["per_swapped_storage"] > 0
    assert first == second  # no clock in it: the same code runs the same bytecodes


def test_host_profile_writes_its_figures(tmp_path: Path) -> None:
    from bench.overhead import hostprofile

    arguments = ["--layers", "4", "--passes", "2", "--profiled", "1", "--results-dir", str(tmp_path)]
    assert hostprofile.main(arguments) == 0
    (written,) = (tmp_path / "cpu").glob("*-hostprofile.json")
    data = json.loads(written.read_text())
    assert data["kind"] == "bench.overhead.hostprofile" and data["environment"]["device"] == "cpu"
    assert data["swapped_storages"] > 0 and set(data["pass_ms"]) == {"keep", "half"}
    calls = data["runtime_calls_per_pass"]
    assert calls["keep"]["copy_out"] == 0 < calls["half"]["copy_out"] <= calls["half"]["record_compute"]
    functions = [row["function"] for row in data["profile_by_function"]]
    engine_modules = ("engine.py:", "pack.py:", "transfers.py:")
    assert any(name.startswith(engine_modules) for name in functions)  # the engine's own functions profiled


def test_a_window_of_one_layer_brings_each_swapped_storage_back_in_a_round_of_its_own():
    from bench.overhead.hostprofile import profile_host

    wide = profile_host(torch.device("cpu"), layers=80, passes=1, profiled=1)
    tight = profile_host(torch.device("cpu"), layers=80, passes=1, profiled=1, tight=True)
    assert wide["prefetch_window"] == "wide" and tight["prefetch_window"] == "one layer"
    assert wide["swapped_storages"] == tight["swapped_storages"] > 1
    assert wide["runtime_calls_per_pass"]["half"]["copy_in"] == 1  # one group at the start of backward
    assert tight["runtime_calls_per_pass"]["half"]["copy_in"] > 1


def test_engine_passes_time_each_phase_of_a_pass():
    from bench.overhead.engine_passes import PHASES, EnginePasses

    passes = EnginePasses.deep_narrow(torch.device("cpu"), layers=4)
    try:
        stats, phases = passes.run_phases("half")
    finally:
        passes.close()
    assert stats.storages_swapped_out > 0
    assert tuple(phases) == PHASES and all(seconds > 0 for seconds in phases.values())


def test_the_lean_floor_swaps_what_the_engine_swaps_in_fewer_bytecodes(tmp_path: Path) -> None:
    from bench.overhead import lean

    assert lean.main(["--layers", "6", "--rounds", "2", "--results-dir", str(tmp_path)]) == 0
    (written,) = (tmp_path / "cpu").glob("*-lean.json")
    data = json.loads(written.read_text())
    assert data["kind"] == "bench.overhead.lean" and data["environment"]["device"] == "cpu"
    assert data["swapped_storages"]["lean"] == data["swapped_storages"]["engine"] > 0
    assert 0 < data["lean"]["bytecodes_per_swap"] < data["engine"]["bytecodes_per_swap"]


def test_the_lean_hooks_refuse_a_save_that_is_not_the_one_profiled() -> None:
    from bench.overhead.engine_passes import EnginePasses
    from bench.overhead.lean import LeanSwaps, run_pass
    from lightning_accudnn.ops.replay import ReplayRoute

    passes = EnginePasses.deep_narrow(torch.device("cpu"), layers=4, tight=True)
    route = ReplayRoute(passes.profiles["half"].sequence, passes.schedules["half"])
    passes.batch = torch.cat([passes.batch, passes.batch])  # every activation twice the bytes
    with pytest.raises(RuntimeError, match="not what was profiled"):
        run_pass(passes, LeanSwaps(route))


def test_instruction_counts_without_valgrind_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from bench.overhead import instructions

    monkeypatch.setattr(instructions.shutil, "which", lambda name: None)
    assert instructions.main(["--results-dir", str(tmp_path)]) == 2
    assert "needs valgrind" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.json"))


def test_the_counted_regions_run_every_variant_and_note_their_dumps(tmp_path: Path) -> None:
    from bench.overhead import instructions

    # Outside callgrind the regions run and no dump is written: what the parent reads is noted.
    threads = torch.get_num_threads()
    assert instructions.main(["--child", str(tmp_path), "--layers", "4", "--passes", "1"]) == 0
    assert torch.get_num_threads() == threads  # one thread while counting, given back after
    regions = json.loads((tmp_path / "regions.json").read_text())
    assert regions["swapped_storages"]["engine"] == regions["swapped_storages"]["lean"] > 0
    assert regions["saved_tensors"] > regions["swapped_storages"]["engine"]
    assert regions["dumps"] == {name: [] for name in instructions.VARIANTS}


def test_a_counted_region_raises_what_its_run_raised() -> None:
    from bench.overhead.instructions import run_in_region

    def fails() -> None:
        raise ValueError("inside the region")

    with pytest.raises(ValueError, match="inside the region"):
        run_in_region(fails)


def test_the_warm_up_holds_the_passes_timed_whole_under_two_plans() -> None:
    """After the timed planned passes, a whole cycle of ``observe_every`` passes: room for the
    passes timed whole under the refined plan and under the plan they may re-cost it into."""
    assert cli.WARMUP - 2 - TIMED_PLANNED_PASSES == OffloadConfig().observe_every >= 2 * STEADY_TIMED_PASSES
