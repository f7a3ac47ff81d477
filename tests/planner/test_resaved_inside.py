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


def _input_profile(module: tuple[tuple[str, int], ...]) -> StepProfile:
    """A segment ``a`` whose layer's 40 bytes are saved again (listed under the next segment's
    first layer, ``b.conv``) by ``module``, then a segment ``b`` whose 40 bytes of inputs ``a`` made."""
    layers = (
        LayerProfile("a.attn", 100, 100, resaved_by=(("b.conv", 40),), resaved_by_module=module),
        LayerProfile("b.conv", 40, 40),
        LayerProfile("b.bn", 50, 50),
    )
    segments = (
        SegmentProfile("a", 40, output_bytes=40),
        SegmentProfile("b", 40, output_bytes=40, input_sources=(("a", 40),)),
    )
    return StepProfile(layers, 0, segments=segments, resaves_listed=True)


@pytest.mark.parametrize(
    ("module", "held"),
    [
        ((), 0),  # saved again by b.conv: b's inputs, saved by a.attn already
        ((("b.view", 40),), 0),  # by a module inside b: likewise
        ((("a.proj", 40),), 40),  # by a module before b: not b's inputs, which b holds itself
        ((("a.proj", 30), ("b.view", 10)), 30),  # a part before b, a part inside it
    ],
)
def test_a_resave_before_a_recomputed_segment_does_not_show_its_inputs_saved_already(module, held):
    """A kept layer's storage saved again last by a module before a recomputed segment that
    saves nothing of its own is listed under the segment's first layer; it is not the segment's
    input (the output of an attention block saved again by its projection, not the projection's
    output the next block takes), so the segment's layer still holds its inputs. Counted as held
    already, a selective segment after an attention block was planned 4 KB under what the engine
    saw, and the pass under that plan departed from it."""
    profile = _input_profile(module)
    (span,) = [span for span in candidate_spans(profile) if span.name == "b"]
    step = recomputed_profile(profile, [span], swappable=False)
    saved = [(layer.name, layer.saved_bytes) for layer in step.profile.layers]
    assert saved == [("a.attn", 100), ("b", held)]
