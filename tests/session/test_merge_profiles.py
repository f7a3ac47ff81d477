"""Ranks plan from one merged profile: what a rank saw saved again or kept for being small survives."""

from dataclasses import replace

from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile
from lightning_accudnn.session.agreement import with_times_of
from lightning_accudnn.session.distributed import merge_profiles


def _profile(resaved: int, small: tuple[int, ...]) -> StepProfile:
    layers = (
        LayerProfile("relu", 100 + sum(small), 100, resaved_by=(("conv", resaved),), small_storages=small),
        LayerProfile("conv", 0, 0),
    )
    return StepProfile(layers, static_bytes=10)


def test_merged_profile_keeps_resaved_and_small_storages():
    merged = merge_profiles([_profile(40, (8,)), _profile(60, (8, 4))])
    relu = merged.layers[0]
    assert relu.resaved_by == (("conv", 60),)  # the most any rank saw saved again
    assert relu.small_storages == (8, 4)  # from the rank with the most resident bytes
    assert relu.saved_bytes == 112 and relu.swappable_bytes == 100


def _resaving(modules: tuple[tuple[str, int], ...]) -> StepProfile:
    layers = (
        LayerProfile("block.relu", 100, 100, resaved_by=(("next.conv", 100),), resaved_by_module=modules),
        LayerProfile("next.conv", 10, 10),
    )
    return StepProfile(layers, static_bytes=10)


def test_the_merge_keeps_the_re_saves_by_module_every_rank_saw_with_their_fewest_bytes():
    a = _resaving((("block.conv", 60), ("block.pool", 40)))
    b = _resaving((("block.conv", 50),))
    merged = merge_profiles([a, b]).layers[0]
    # Bytes listed by module are left out after a recomputed segment: only what every rank saw.
    assert merged.resaved_by_module == (("block.conv", 50),)
    assert merge_profiles([a, a]).layers[0].resaved_by_module == a.layers[0].resaved_by_module
    assert merge_profiles([b, _resaving(())]).layers[0].resaved_by_module == ()


def test_an_untimed_pass_takes_the_re_saves_by_module_of_the_timed_one():
    timed = _resaving((("block.conv", 60),))
    untimed = (LayerProfile("block.relu", 100, 100), LayerProfile("next.conv", 10, 10))
    relu = with_times_of(untimed, timed)[0]
    assert relu.resaved_by == (("next.conv", 100),)
    assert relu.resaved_by_module == (("block.conv", 60),)


def test_the_merge_keeps_the_segments_every_rank_may_recompute_with_their_most_input_bytes():
    layers = (LayerProfile("block.a", 10, 10),)
    a = StepProfile(layers, 0, segments=(SegmentProfile("block", 4), SegmentProfile("only_a", 1)))
    b = StepProfile(layers, 0, segments=(SegmentProfile("block", 6),))
    assert merge_profiles([a, b]).segments == (SegmentProfile("block", 6),)


def test_the_merge_keeps_each_segment_s_most_output_and_selective_bytes():
    layers = (LayerProfile("block.conv", 10, 10),)
    a = StepProfile(
        layers,
        0,
        segments=(
            SegmentProfile(
                "block",
                4,
                8,
                selective_kept_bytes=5,
                selective_recompute_share=0.2,
                selective_recomputed_bytes=3,
            ),
            SegmentProfile("other", 1, selective_kept_bytes=1),
        ),
    )
    b = StepProfile(
        layers,
        0,
        segments=(
            SegmentProfile(
                "block",
                6,
                7,
                selective_kept_bytes=4,
                selective_recompute_share=0.3,
                selective_recomputed_bytes=2,
            ),
            SegmentProfile("other", 1),
        ),
    )
    block, other = merge_profiles([a, b]).segments
    assert (block.input_bytes, block.output_bytes) == (6, 8)
    assert (
        block.selective_kept_bytes,
        block.selective_recompute_share,
        block.selective_recomputed_bytes,
    ) == (
        5,
        0.3,
        3,
    )
    assert other.selective_kept_bytes is None  # one rank did not measure it: never recomputed selectively


def test_the_merge_keeps_the_costliest_recomputation_any_rank_measured():
    a = replace(_profile(40, (8,)), recompute_cost_ratio=1.5)
    b = replace(_profile(40, (8,)), recompute_cost_ratio=3.0)
    assert merge_profiles([a, b]).recompute_cost_ratio == merge_profiles([b, a]).recompute_cost_ratio == 3.0


def test_the_merge_keeps_a_segment_s_slowest_timed_recomputation_where_every_rank_timed_it():
    layers = (LayerProfile("block.conv", 10, 10),)

    def profile(whole: float | None, selective: float | None) -> StepProfile:
        segment = SegmentProfile("block", 4, recompute_seconds=whole, selective_recompute_seconds=selective)
        return StepProfile(layers, 0, segments=(segment,))

    (merged,) = merge_profiles([profile(1.0, 0.2), profile(3.0, None)]).segments
    assert merged.recompute_seconds == 3.0 and merged.selective_recompute_seconds is None


def test_the_merge_keeps_the_fewest_input_bytes_every_rank_may_swap():
    layers = (LayerProfile("block.conv", 10, 10),)

    def profile(swappable: int, storages: int) -> StepProfile:
        segment = SegmentProfile(
            "block", 8, swappable_input_bytes=swappable, swappable_input_storages=storages
        )
        return StepProfile(layers, 0, segments=(segment,))

    (merged,) = merge_profiles([profile(8, 1), profile(6, 2)]).segments
    assert (merged.swappable_input_bytes, merged.swappable_input_storages) == (6, 2)
    (merged,) = merge_profiles([profile(8, 1), profile(0, 0)]).segments
    assert (merged.swappable_input_bytes, merged.swappable_input_storages) == (0, 0)
