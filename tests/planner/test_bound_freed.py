"""The lower bound counts at least what any recompute set frees, nested sets included.

A ResNet-like toy: a stem, then stages of blocks whose input a kept layer before them saves
(the previous block's last activation, saved again by the block's first convolution), with a
downsampling block whose input is larger than its output. Recomputing that block frees its
input (already held) and leaves only its smaller output to the next block, so it frees more
than its saved bytes less its inputs. Every set of segments (a stage with blocks inside it
recomputed nested) is checked against the exact accounting of ``recomputed_profile``.
"""

from __future__ import annotations

import itertools
import random

import pytest

from lightning_accudnn.planner import LayerProfile, StepProfile
from lightning_accudnn.planner.bounds import FreedBound, lower_bound_seconds
from lightning_accudnn.planner.frontier import recompute_cost_lines
from lightning_accudnn.planner.recompute import named_spans, policy_spans, recomputed_profile
from lightning_accudnn.profile import SegmentProfile

# (stage, block, input bytes, output bytes): s2.b0 downsamples, its input four times its output.
BLOCKS = (("s1", "b0", 40, 40), ("s1", "b1", 40, 40), ("s2", "b0", 40, 10), ("s2", "b1", 10, 10))


def resnet_like(seed: int) -> StepProfile:
    """The toy, with sizes and times drawn from ``seed``: the blocks' inputs and outputs scaled by
    one factor, what each saves inside and its time by one of its own."""
    rng = random.Random(seed)
    scale = rng.randint(1, 4)
    inside = [rng.randint(1, 4) for _ in BLOCKS]
    seconds = [rng.choice([0.5, 1.0, 2.0, 3.0]) for _ in BLOCKS]
    blocks = [
        (s, b, i * scale, o * scale, k, t) for (s, b, i, o), k, t in zip(BLOCKS, inside, seconds, strict=True)
    ]
    first_input = blocks[0][2]
    layers = [
        LayerProfile("stem.conv", 8, 8, 0.5, 1.0),
        LayerProfile(
            "stem.relu", first_input, first_input, 0.5, 1.0, resaved_by=(("s1.b0.conv", first_input),)
        ),
    ]
    segments = [SegmentProfile("stem", 8, output_bytes=first_input)]
    previous = ("stem", "stem")  # (innermost segment, stage) that made the next block's input
    stage_input: dict[str, tuple[int, tuple[tuple[str, int], ...]]] = {}
    for n, (stage, block, inputs, outputs, k, t) in enumerate(blocks):
        name = f"{stage}.{block}"
        later = f"{blocks[n + 1][0]}.{blocks[n + 1][1]}.conv" if n + 1 < len(blocks) else "head"
        middle = 2 * inputs * k
        layers += [
            LayerProfile(f"{name}.conv", 2, 2, t, 2 * t),
            LayerProfile(f"{name}.bn", middle, middle, t / 2, t),
            LayerProfile(f"{name}.relu", outputs, outputs, t / 2, t, resaved_by=((later, outputs),)),
        ]
        sources = tuple((segment, inputs) for segment in dict.fromkeys(previous))
        segments.append(SegmentProfile(name, inputs, output_bytes=outputs, input_sources=sources))
        stage_input.setdefault(stage, (inputs, sources))
        previous = (name, stage)
    layers.append(LayerProfile("head", 4, 4, 0.5, 1.0))
    for stage, (inputs, sources) in stage_input.items():
        outputs = [o for s, _, _, o, _, _ in blocks if s == stage][-1]
        segments.append(SegmentProfile(stage, inputs, output_bytes=outputs, input_sources=sources))
    return StepProfile(tuple(layers), 100, 1e3, 1e3, segments=tuple(segments), resaves_listed=True)


def recompute_sets(profile: StepProfile):
    """Every set of segment names (a block inside a recomputed stage is recomputed nested in it),
    with the bytes it frees by the exact accounting and its recompute seconds."""
    names = [segment.name for segment in profile.segments]
    for size in range(1, len(names) + 1):
        for chosen in itertools.combinations(names, size):
            spans = named_spans(profile, "recompute", chosen)
            step = recomputed_profile(profile, spans, swappable=False)
            freed = profile.saved_bytes - step.profile.saved_bytes
            yield chosen, spans, freed, sum(span.recompute_seconds for span in spans)


@pytest.mark.parametrize("seed", range(12))
def test_bound_below_every_recompute_set(seed: int) -> None:
    """At the budget a set just reaches at the end of the forward, the bound is at most that
    set's step: forward, backward and its recomputation."""
    profile = resnet_like(seed)
    compute = sum(layer.forward_seconds + layer.backward_seconds for layer in profile.layers)
    for chosen, _, freed, seconds in recompute_sets(profile):
        budget = profile.unconstrained_peak_bytes - freed
        bound = lower_bound_seconds(profile, budget, "recompute")
        assert bound <= (compute + seconds) * (1 + 1e-9), (chosen, freed, bound, compute + seconds)


@pytest.mark.parametrize("seed", range(12))
def test_freed_bound_is_the_exact_count_here(seed: int) -> None:
    """Summed over a set's spans and the gaps after them, the count equals the exact accounting
    on this toy (nothing covers a block's inputs from further back), and the relaxation's most
    is the most any set frees: never below (a bound), and no looser than it must be."""
    profile = resnet_like(seed)
    spans = policy_spans(profile, "recompute")
    bound = FreedBound(profile, spans)
    by_range = {(span.first, span.last): span for span in spans}
    most = 0
    for chosen, picked, freed, _ in recompute_sets(profile):
        total, before = 0, None
        for span in picked:
            span = by_range[(span.first, span.last)]  # a nested stage counts as the stage
            if before is not None and before.last + 1 != span.first:
                total, before = total + bound(before, None), None
            total += bound(before, span)
            before = span
        total += bound(before, None) if before is not None else 0
        assert total == freed, chosen
        most = max(most, freed)
    assert recompute_cost_lines(spans, bound)[1] == most


def test_the_downsampling_block_frees_more_than_saved_less_inputs() -> None:
    """The case the count must cover: its inputs are already held, its output is smaller."""
    profile = resnet_like(0)
    span = next(span for span in policy_spans(profile, "recompute") if span.name == "s2.b0")
    step = recomputed_profile(profile, [span], swappable=False)
    freed = profile.saved_bytes - step.profile.saved_bytes
    assert freed == span.saved_bytes - span.output_bytes > span.freed_bytes
