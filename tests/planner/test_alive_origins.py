"""A swapped storage let go while the model's code still holds it is held beyond its level at a
forward level; a plan adds at most the share of the layers it swaps, where the profile lists
whose storages they were (``LayerProfile.retired_alive_from``)."""

from __future__ import annotations

from lightning_accudnn.planner.recompute import candidate_spans, recomputed_profile
from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile

# "c"'s forward level met 70 bytes of "a"'s storages and 30 of "d"'s let go and alive (never
# more than 90 at once).
A, B, D = (LayerProfile(name, 100, 100) for name in "abd")
C = LayerProfile("c", 10, 10, retired_alive_bytes=90, retired_alive_from=(("a", 70), ("d", 30)))
SWAP_A_AND_B = (True, True, False, False)  # d kept; with limit 0 the FIFO keeps b, a is retired


def _forward_c(c: LayerProfile) -> int:
    profile = StepProfile((A, B, D, c), static_bytes=0)
    return Simulator(profile).memory(PlanChoice(SWAP_A_AND_B, 0, 0)).forward_levels[3]


def test_a_plan_adds_the_share_of_the_layers_it_swaps():
    # d (kept) 100, b in the FIFO 100, c's saves 10, and of the 100 retired bytes (a's) 70 alive
    assert _forward_c(C) == 100 + 100 + 10 + 70


def test_without_the_list_or_when_it_covers_less_the_whole_is_added():
    unlisted = LayerProfile("c", 10, 10, retired_alive_bytes=90)
    assert _forward_c(unlisted) == 100 + 100 + 10 + 90
    short = LayerProfile("c", 10, 10, retired_alive_bytes=90, retired_alive_from=(("a", 70),))
    assert _forward_c(short) == 100 + 100 + 10 + 90


def test_a_storage_still_in_the_copy_out_fifo_is_not_counted_alive_again():
    # b's storage is held by the model's code at c too, but with limit 0 the FIFO still holds b
    # at F_c (counted in flight): only a's retired bytes may be alive there.
    from_b = LayerProfile("c", 10, 10, retired_alive_bytes=90, retired_alive_from=(("a", 30), ("b", 60)))
    assert _forward_c(from_b) == 100 + 100 + 10 + 30


def test_a_recomputed_segments_storages_alive_after_it_are_its_outputs_counted_by_the_next_layer():
    """blk recomputed: the storage of blk.y that head's level met alive (blk's output, which the
    model's code holds until head) is never swapped under that plan: head counts blk's outputs
    (30 B) as its own, and nothing retired is added for them, though the stem's 40 B are
    retired at F_head (the FIFO, limit 0, keeps pre's); the list names the segment, which never
    swaps."""
    layers = (
        LayerProfile("stem", 40, 40, 1.0, 1.0),
        LayerProfile("pre", 40, 40, 1.0, 1.0),
        LayerProfile("blk.x", 100, 100, 1.0, 1.0),
        LayerProfile("blk.y", 100, 100, 1.0, 1.0),
        LayerProfile("head", 200, 200, 1.0, 1.0, retired_alive_bytes=30, retired_alive_from=(("blk.y", 30),)),
    )
    profile = StepProfile(layers, 0, segments=(SegmentProfile("blk", 40, output_bytes=30),))
    step = recomputed_profile(profile, candidate_spans(profile))
    head = step.profile.layers[3]
    assert (head.name, head.saved_bytes, head.retired_alive_from) == ("head", 230, (("blk", 30),))
    memory = Simulator(step.profile, step.transient_bytes).memory(
        PlanChoice((True, True, False, False), 0, 0)
    )
    assert memory.forward_levels[3] == 40 + 40 + 230  # pre in flight, blk's inputs, head's saves
