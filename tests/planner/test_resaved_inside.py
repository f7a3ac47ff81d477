"""A re-save made inside a recomputed segment, by a layer that saves nothing of its own, is not
counted after the segment.

The engine's profile lists such a re-save under the next layer that saves something, which may
lie after the segment (``LayerProfile.resaved_by``), and names the module that made it
(``LayerProfile.resaved_by_module``). Recomputing the segment, the engine never sees that
re-save: the bytes are held by nobody after the segment. A re-save by a module after the
segment still is counted there.
"""

from __future__ import annotations

import pytest

from lightning_accudnn.planner.recompute import candidate_spans, recomputed_profile
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile


def _profile(module: tuple[tuple[str, int], ...]) -> StepProfile:
    """A stem, a segment ``d`` whose ReLU's output its convolution saves again (listed under the
    next segment's first layer), and that layer."""
    layers = (
        LayerProfile("stem", 40, 40),
        LayerProfile("d.relu", 100, 100, resaved_by=(("n.bn", 100),), resaved_by_module=module),
        LayerProfile("d.bn", 60, 60),
        LayerProfile("n.bn", 70, 70),
    )
    return StepProfile(layers, 0, segments=(SegmentProfile("d", 40, output_bytes=70),), resaves_listed=True)


@pytest.mark.parametrize(
    ("module", "after"),
    [
        ((("d.conv", 100),), 70),  # inside the segment: nothing more after it
        ((("d.conv#2", 100),), 70),  # a second call of a module inside it
        ((("n.conv", 100),), 170),  # after the segment: held from there
        ((), 170),  # unknown: counted after it
        ((("d.conv", 60), ("n.conv", 40)), 110),  # a part inside, a part after
    ],
)
def test_a_resave_inside_a_recomputed_segment_is_not_counted_after_it(module, after):
    profile = _profile(module)
    step = recomputed_profile(profile, candidate_spans(profile), swappable=False)
    assert [(layer.name, layer.saved_bytes) for layer in step.profile.layers] == [
        ("stem", 40),
        ("d", 40),
        ("n.bn", after),
    ]
    assert step.transient_bytes == (0, 160, 0)


def test_module_resaves_beyond_the_listed_ones_count_for_nothing():
    with pytest.raises(ValueError, match="resaved_by_module"):
        LayerProfile("a", 100, 100, resaved_by=(("b", 50),), resaved_by_module=(("a.conv", 0),))
    layers = (
        LayerProfile("d.relu", 100, 100, resaved_by=(("n.bn", 30),), resaved_by_module=(("d.conv", 100),)),
        LayerProfile("d.bn", 60, 60),
        LayerProfile("n.bn", 70, 70),
    )
    segments = (SegmentProfile("d", 40, output_bytes=70),)
    profile = StepProfile(layers, 0, segments=segments, resaves_listed=True)
    step = recomputed_profile(profile, candidate_spans(profile), swappable=False)
    assert [layer.saved_bytes for layer in step.profile.layers] == [40, 70]
