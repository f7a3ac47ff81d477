"""The copy stream's events are reused only once compute is ordered after them."""

from lightning_accudnn.ops.runtime import EventRing


class Made:
    count = 0

    def __init__(self):
        Made.count += 1
        self.number = Made.count


def test_an_event_is_reused_only_after_compute_waited_on_its_group_or_a_later_one():
    ring = EventRing(Made)
    first, second, third = ring.take(), ring.take(), ring.take()
    assert len({id(first.event), id(second.event), id(third.event)}) == 3
    ring.waited(first)
    fourth = ring.take()
    assert fourth.event is first.event  # compute is ordered after the first group: its event is free
    assert ring.pending(second) and ring.pending(third) and not ring.pending(first)
    ring.waited(third)  # a later group orders compute after the earlier ones
    assert not ring.pending(second)
    fifth, sixth = ring.take(), ring.take()
    assert {fifth.event, sixth.event} == {second.event, third.event}
    assert ring.created == 3
    ring.waited(second)  # an earlier group than the last waited on: nothing changes
    assert ring.waited_generation == third.generation


def test_past_its_cap_a_mark_keeps_its_event_and_the_ring_stays_bounded():
    ring = EventRing(Made, cap=2)
    marks = [ring.take() for _ in range(5)]
    ring.waited(marks[-1])
    reused = [ring.take().event for _ in range(3)]
    # Only the two marks still in the ring gave their events back; the others keep theirs.
    assert set(map(id, reused[:2])) == {id(marks[3].event), id(marks[4].event)}
    assert all(event is not mark.event for event in reused[2:] for mark in marks)


def test_another_compute_stream_makes_every_mark_pending_again():
    ring = EventRing(Made)
    mark = ring.take()
    ring.waited(mark)
    assert not ring.pending(mark)
    ring.forget_waits()
    assert ring.pending(mark)
