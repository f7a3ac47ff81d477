"""A swapped storage let go while the model's code still holds it is held beyond its level at a
forward level; a plan adds at most the share of the layers it swaps, where the profile lists
whose storages they were (``LayerProfile.retired_alive_from``)."""

from __future__ import annotations

from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from lightning_accudnn.profile import LayerProfile, StepProfile

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
