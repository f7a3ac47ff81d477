"""AccUDNNDDPStrategy with gloo on 2 CPU processes: the full Lightning lifecycle (one launch of
tests/ddp/lifecycle_ranks.py), and merged profiles.

Equal weights to plain DDP: test_ddp_bitwise.py; an error on one rank: test_ddp_rank_error.py
(split apart so that pytest-xdist can run them on different workers)."""

import subprocess
import sys
from pathlib import Path

import pytest

from lightning_accudnn.planner import LayerProfile, StepProfile
from lightning_accudnn.session import merge_profiles

# Spawned process groups must never hang CI: every test here is bounded.
pytestmark = [pytest.mark.timeout(240), pytest.mark.ddp]


SCRIPT = Path(__file__).with_name("lifecycle_ranks.py")


def test_registered_name_runs_fit_validate_checkpoint_and_restore(tmp_path):
    """``Trainer(strategy="accudnn_ddp")`` fits with validation and a checkpoint, validates, and a
    new Trainer resumes from the checkpoint (one launch of two ranks; the spawned registered name
    ``"accudnn_ddp_spawn"`` fits in test_ddp_rank_error.py)."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)],
        cwd=SCRIPT.parents[2],
        capture_output=True,
        text=True,
        timeout=220,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    # Both ranks trained; the step count shows in the checkpoints rank 0 wrote.
    assert "resumed from " in result.stdout and "step=3" in result.stdout, output[-3000:]
    assert any("step=5" in path.name for path in tmp_path.rglob("*.ckpt"))


def test_merged_profile_is_safe_for_every_rank_and_refuses_different_layers():
    a = StepProfile((LayerProfile("x", 10, 8, 1.0, 2.0), LayerProfile("y", 5, 5)), static_bytes=5)
    b = StepProfile(
        (LayerProfile("x", 12, 12, 0.5, 3.0), LayerProfile("y", 4, 4)),
        static_bytes=7,
        d2h_bytes_per_second=1e9,
        h2d_bytes_per_second=2e9,
    )
    merged = merge_profiles([a, b])
    assert [layer.saved_bytes for layer in merged.layers] == [12, 5]
    assert merged.layers[0].resident_bytes == 2  # the most any rank must keep
    assert merged.static_bytes == 7 and merged.d2h_bytes_per_second == 1e9
    with pytest.raises(RuntimeError, match="drop_last"):
        merge_profiles([a, StepProfile((LayerProfile("z", 1, 1),), static_bytes=0)])
