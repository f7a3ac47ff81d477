"""Merged profiles of the ranks of AccUDNNDDPStrategy.

The full Lightning lifecycle under DDP, equal weights to plain DDP and an error on one rank
ending both (one launch of two ranks): test_launched.py; an error on one rank under the spawn
launcher: test_ddp_rank_error.py."""

import pytest

from lightning_accudnn.planner import LayerProfile, StepProfile
from lightning_accudnn.session import merge_profiles

# Marked as the other DDP tests (left out by `make test-fast`), though it starts no process.
pytestmark = [pytest.mark.timeout(240), pytest.mark.ddp]


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
