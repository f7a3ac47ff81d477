"""AccUDNNDDPStrategy with gloo on 2 CPU processes: weights equal to plain DDP, bit for bit."""

import subprocess
import sys
from pathlib import Path

import pytest

# Spawned process groups must never hang CI: every test here is bounded.
pytestmark = [pytest.mark.timeout(240), pytest.mark.ddp]

SCRIPT = Path(__file__).with_name("plain_and_offloaded_fits.py")
CONFIGURATIONS = ("defaults", "static-graph-bucket-view", "accumulation-no-sync", "find-unused-parameters")


def test_weights_after_several_steps_equal_plain_ddp_bitwise_in_every_configuration():
    """Plain DDP and AccUDNN DDP (swapping forced) trained in the same two ranks, per configuration."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=SCRIPT.parents[2], capture_output=True, text=True, timeout=220
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    reported = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    verdicts = {name: reported.get(name) for name in CONFIGURATIONS}
    assert verdicts == dict.fromkeys(CONFIGURATIONS, "equal"), output[-3000:]
