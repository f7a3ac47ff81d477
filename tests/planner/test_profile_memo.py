"""Answers kept for the last profile asked about: the same profile gets them again, any other
profile (an equal one too) its own, and switching back recomputes them."""

import copy
import pickle

import pytest

from lightning_accudnn.planner.recompute import LastProfileMemo, SegmentSpan, candidate_spans
from lightning_accudnn.planner.search import nested_spans
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile


def _profile(saved: int) -> StepProfile:
    layers = tuple(LayerProfile(f"s.b{i}.{part}", saved, saved, 1.0, 2.0) for i in range(2) for part in "xy")
    segments = (SegmentProfile("s", 10), SegmentProfile("s.b0", 10), SegmentProfile("s.b1", 10))
    return StepProfile(layers, 0, segments=segments)


def test_memo_keeps_answers_of_the_last_profile_only():
    memo = LastProfileMemo()
    first, second = _profile(50), _profile(50)
    calls = []

    def compute(label: str) -> str:
        calls.append(label)
        return label

    assert memo.get(first, "k", lambda: compute("a")) == "a"
    assert memo.get(first, "k", lambda: compute("b")) == "a"  # kept
    assert memo.get(first, "other", lambda: compute("c")) == "c"  # another key
    assert memo.get(second, "k", lambda: compute("d")) == "d"  # equal, but another profile
    assert memo.get(first, "k", lambda: compute("e")) == "e"  # forgotten on switching
    assert calls == ["a", "c", "d", "e"]


def test_candidate_spans_follow_the_profile_asked_about():
    small, large = _profile(50), _profile(500)
    spans = candidate_spans(small)
    assert candidate_spans(small) is spans  # kept: the same spans, their figures computed once
    other = candidate_spans(large)
    assert [span.saved_bytes for span in other] == [2000, 1000, 1000]
    assert [span.saved_bytes for span in candidate_spans(small)] == [200, 100, 100]
    assert candidate_spans(small, selective=True) == ()  # the flag is part of the question


def test_nested_spans_are_copies_the_caller_may_change():
    profile = _profile(50)
    spans = candidate_spans(profile)
    nested = nested_spans(profile, spans)
    assert [span.names for span in nested] == [("s", "s.b0", "s.b1")]
    nested.clear()
    assert [span.names for span in nested_spans(profile, spans)] == [("s", "s.b0", "s.b1")]
    inner_only = [span for span in spans if span.name != "s"]
    assert nested_spans(profile, inner_only) == []  # other spans: another answer


def test_span_figures_are_computed_once_and_match_the_fields():
    span = SegmentSpan("b", 0, 3, 10, 400, 4.0, input_sources=(("a", 5),), kept_bytes=20)
    assert span.freed_bytes == 370 and span.held_bytes == 30 and span.recompute_seconds == 4.0
    assert span.sources == {"a": 5}
    assert span.sources is span.sources
    with pytest.raises(TypeError):  # shared by every reader: read-only
        span.sources["a"] = 1  # type: ignore[index]


def test_a_span_whose_figures_were_read_pickles_and_copies_as_its_fields():
    span = SegmentSpan("b", 0, 3, 10, 400, 4.0, input_sources=(("a", 5),))
    assert span.sources == {"a": 5} and span.freed_bytes == 390
    for again in (pickle.loads(pickle.dumps(span)), copy.deepcopy(span), copy.copy(span)):
        assert again == span
        assert again.sources == {"a": 5} and again.freed_bytes == 390
