"""Working memory carried to another batch shape: the held part grows with the batch, the model
state the step did not hold (gradients not made yet) does not, and a scaled estimate is never
taken for a measurement."""

from __future__ import annotations

from lightning_accudnn.planner import scale_profile
from lightning_accudnn.planner.scaling import borrowed_measurements
from lightning_accudnn.profile import LayerProfile, StepProfile
from lightning_accudnn.session.agreement import with_most_working_memory
from lightning_accudnn.session.distributed import merge_profiles

# Held 60 B beyond the forward level with 100 B of gradients not made (-40); in backward 80 B held
# with 30 B not made yet (50).
LAYER = LayerProfile(
    "a",
    100,
    100,
    1e-3,
    1e-3,
    forward_working_bytes=-40,
    backward_working_bytes=50,
    backward_static_not_held_bytes=30,
)
PROFILE = StepProfile((LAYER,), 1_000, outside_working_bytes=20, static_not_held_bytes=100)


def _working(profile: StepProfile) -> tuple[int, int, int]:
    layer = profile.layers[0]
    return layer.forward_working_bytes, layer.backward_working_bytes, profile.outside_working_bytes


def test_twice_the_batch_holds_twice_what_was_held_and_no_more_gradients():
    # forward 2 * 60 - 100, backward 2 * 80 - 30, between the passes 2 * 120 - 100
    assert _working(scale_profile(PROFILE, 2.0)) == (20, 130, 140)


def test_half_the_batch_shrinks_what_was_held_and_keeps_the_optimizer_s():
    assert _working(scale_profile(PROFILE, 0.5)) == (-20, 25, 20)


def test_a_layer_without_its_own_figure_takes_the_step_s():
    layer = LayerProfile("a", 100, 100, backward_working_bytes=50)
    doubled = scale_profile(StepProfile((layer,), 1_000, static_not_held_bytes=100), 2.0)
    assert doubled.layers[0].backward_working_bytes == 200


def test_measured_bytes_grow_the_working_memory_they_do_not_list_the_same_way():
    measured = scale_profile(PROFILE, 2.0, measured=[LayerProfile("a", 300, 300)])
    assert _working(measured)[:2] == (3 * -40 + 2 * 100, 3 * 50 + 2 * 30)


def test_a_larger_pass_borrowing_a_smaller_one_s_figures_grows_the_held_part():
    not_held = PROFILE.static_not_held_bytes, PROFILE.backward_static_not_held(LAYER)
    larger = borrowed_measurements(LayerProfile("a", 200, 200), LAYER, *not_held)
    assert (larger.forward_working_bytes, larger.backward_working_bytes) == (20, 130)


def test_scaling_twice_is_scaling_once_by_the_product():
    """A figure below 0 stays so: a shape scaled from one that was itself scaled (its profile the
    most of its pass and that estimate) is bounded as if scaled from the first at once."""
    twice = scale_profile(scale_profile(PROFILE, 1.5), 2.0)
    once = scale_profile(PROFILE, 3.0)
    assert _working(twice)[:2] == _working(once)[:2] == (3 * -40 + 2 * 100, 3 * 50 + 2 * 30)


def test_the_pass_after_a_scaled_plan_keeps_the_most_of_its_measurement_and_the_estimate():
    """One pass under one plan does not meet what the estimate's shape met in its other passes
    (its profiling pass swapped every layer; a layer's backward holds its copy brought back)."""
    measured = StepProfile(
        (LayerProfile("a", 200, 200, forward_working_bytes=-80, backward_working_bytes=-60),), 1_000
    )
    estimate = scale_profile(PROFILE, 2.0)
    taken = with_most_working_memory(measured, estimate)
    assert _working(taken) == (20, 130, 140)
    assert taken.static_not_held_bytes == 100


def test_ranks_merged_keep_the_most_gradients_not_made_at_each_level():
    other = StepProfile(
        (LayerProfile("a", 100, 100, backward_working_bytes=50),), 1_000, static_not_held_bytes=70
    )
    merged = merge_profiles([PROFILE, other])
    assert (merged.static_not_held_bytes, merged.layers[0].backward_static_not_held_bytes) == (100, 70)
