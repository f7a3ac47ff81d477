"""The copy-out limit is a plan choice: the forward waits for the host link past it."""

from lightning_accudnn.planner import LayerProfile, StepProfile
from lightning_accudnn.planner.plan import min_budget_bytes, plan_swaps
from lightning_accudnn.planner.timeline import simulate


def _profile(layers, bandwidth):
    return StepProfile(
        tuple(LayerProfile(f"l{i}", 100, 100, 1.0, 1.0) for i in range(layers)),
        static_bytes=0,
        d2h_bytes_per_second=bandwidth,
        h2d_bytes_per_second=bandwidth,
    )


def test_forward_waits_for_the_oldest_copy_past_the_limit():
    profile = _profile(2, bandwidth=50.0)  # a 100-byte copy takes 2 s, a layer 1 s
    # F_a [0,1], copy a [1,3]; F_b [1,2], copy b [3,5]: 200 bytes wait, over the limit of 100,
    # so the forward waits for copy a (until 3 s) before it may go on.
    free = simulate(profile, [True, True], 0)
    limited = simulate(profile, [True, True], 0, max_copying_out_bytes=100)
    assert free.forward_seconds == 2.0
    assert limited.forward_seconds == 3.0
    assert limited.compute_wait_seconds >= 1.0
    assert limited.peak_bytes == free.peak_bytes == 200  # retired after b was counted


def test_limit_bounds_the_forward_peak_on_a_slow_link():
    profile = _profile(10, bandwidth=5.0)  # copies 20x slower than compute
    free = simulate(profile, [True] * 10, 0)
    limited = simulate(profile, [True] * 10, 0, max_copying_out_bytes=200)
    assert free.peak_bytes == 1000  # nothing leaves before the forward ends
    assert limited.peak_bytes == 200 + 100
    assert limited.step_seconds > free.step_seconds


def test_plan_chooses_the_limit_and_a_cap_changes_neither_feasibility_nor_the_smallest_budget():
    profile = _profile(10, bandwidth=5.0)
    plan = plan_swaps(profile, budget_bytes=500)
    assert plan.max_copying_out_bytes is not None and plan.predicted_peak_bytes <= 500
    capped = plan_swaps(profile, budget_bytes=500, max_copying_out_bytes=500 // 8)
    assert capped.max_copying_out_bytes <= 500 // 8
    assert capped.min_budget_bytes == plan.min_budget_bytes == min_budget_bytes(profile) == 200
    # At the smallest budget the plan needs the smallest limit: one storage in flight.
    tight = plan_swaps(profile, budget_bytes=200)
    assert (tight.max_copying_out_bytes, tight.prefetch_window_bytes) == (0, 0)
