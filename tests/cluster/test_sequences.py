"""At least once between nodes, the bookkeeping alone (broker/cluster/sequences.py): what
the sender keeps and sends again, what the receiver takes for a duplicate, and the
receiver's state as it is stored and read back after a restart."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.cluster.sequences import WINDOW, Inbox, Outbox


def frame(seq: int) -> bytes:
    return b"frame %d" % seq


def filled(count: int, limit: int = 1 << 20) -> Outbox:
    outbox = Outbox("e1", limit)
    for _ in range(count):
        assert outbox.add(frame) is not None
    return outbox


def test_messages_are_numbered_from_one_and_kept_until_acknowledged() -> None:
    outbox = filled(5)
    assert len(outbox) == 5 and outbox.bytes == 5 * len(frame(1))
    assert outbox.ack(3) == [1, 2, 3]
    assert len(outbox) == 2 and outbox.acked == 3
    assert outbox.ack(2) == []  # an older acknowledgement arriving late changes nothing
    assert outbox.ack(99) == [4, 5]  # never past what was numbered
    assert outbox.acked == 5 and outbox.bytes == 0


def test_what_does_not_fit_is_refused_and_numbers_stay_contiguous() -> None:
    outbox = Outbox("e1", limit=3 * len(frame(1)))
    assert [outbox.add(frame) for _ in range(3)] == [(n, frame(n)) for n in (1, 2, 3)]
    assert outbox.add(frame) is None  # full: the caller counts it dropped
    outbox.ack(1)
    assert outbox.add(frame) == (4, frame(4))  # no number was used by the refused one


def test_a_new_link_gets_everything_not_acknowledged_in_order() -> None:
    outbox = filled(4)
    for seq, _ in outbox.unsent():
        outbox.mark_sent(seq)
    assert outbox.caught_up
    outbox.ack(2)
    outbox.relinked()
    assert not outbox.caught_up
    assert [seq for seq, _ in outbox.unsent()] == [3, 4]


def test_a_link_that_refuses_a_frame_is_offered_it_again_first() -> None:
    outbox = filled(3)
    sent = []
    for seq, _ in outbox.unsent():
        if seq == 2:
            break  # the link is full
        outbox.mark_sent(seq)
        sent.append(seq)
    outbox.add(frame)
    assert sent == [1]
    assert [seq for seq, _ in outbox.unsent()] == [2, 3, 4]


def test_restored_messages_continue_the_numbering() -> None:
    outbox = Outbox("e1", 1 << 20, acked=10)
    outbox.restore(11, frame(11))
    outbox.restore(12, frame(12))
    assert [seq for seq, _ in outbox.unsent()] == [11, 12]
    assert outbox.add(frame) == (13, frame(13))


def test_the_receiver_drops_what_it_queued_already() -> None:
    inbox = Inbox()
    inbox.stream("e1", 0)
    for seq in (1, 2, 3):
        assert inbox.fresh(seq)
        inbox.queued(seq)
    assert inbox.high == 3
    assert not inbox.fresh(2) and not inbox.fresh(3)
    assert inbox.fresh(4)


def test_gaps_are_remembered_until_they_fill() -> None:
    inbox = Inbox("e1")
    for seq in (1, 2, 5, 6):
        inbox.queued(seq)
    assert inbox.high == 2 and inbox.window == {5, 6}
    assert inbox.fresh(3) and inbox.fresh(4) and not inbox.fresh(5)
    inbox.queued(4)
    inbox.queued(3)
    assert inbox.high == 6 and inbox.window == set()


def test_a_window_past_its_bound_gives_up_the_oldest_gap() -> None:
    inbox = Inbox("e1")
    for seq in range(3, WINDOW + 4):  # 1 and 2 never come
        inbox.queued(seq)
    assert inbox.high == WINDOW + 3 and inbox.window == set()


def test_another_epoch_starts_from_nothing() -> None:
    inbox = Inbox("e1", high=40)
    inbox.stream("e1", 0)
    assert not inbox.fresh(40)
    inbox.stream("e2", 0)  # the origin lost what it kept: its numbering starts again
    assert inbox.fresh(1)


def test_the_state_survives_a_restart() -> None:
    inbox = Inbox("e1")
    for seq in (1, 2, 4):
        inbox.queued(seq)
    again = Inbox.of(inbox.state())
    assert (again.epoch, again.high, again.window) == ("e1", 2, {4})


@given(
    st.lists(st.integers(1, 60), min_size=1, max_size=200),
)
def test_every_number_is_queued_once_whatever_the_order(arrivals: list[int]) -> None:
    """Frames sent again on new links arrive in any order, any number of times: each
    number is taken once, and what is acknowledged (`high`) was all taken."""
    inbox = Inbox("e1")
    taken: list[int] = []
    for seq in arrivals:
        if inbox.fresh(seq):
            inbox.queued(seq)
            taken.append(seq)
    assert sorted(taken) == sorted(set(arrivals))
    assert set(range(1, inbox.high + 1)) <= set(taken)


@pytest.mark.parametrize("lost", [1, 7])
def test_sender_and_receiver_lose_nothing_across_reconnects(lost: int) -> None:
    """A link that drops every `lost`-th frame, and is remade after each batch: what the
    receiver acknowledges is released, the rest is sent again, each message is queued
    exactly once."""
    outbox = Outbox("e1", 1 << 20)
    inbox = Inbox()
    inbox.stream("e1", 0)
    queued: list[int] = []
    count = 0
    for _ in range(5):
        for _ in range(20):
            outbox.add(frame)
        outbox.relinked()
        for seq, _ in outbox.unsent():
            outbox.mark_sent(seq)
            count += 1
            if count % lost == 0 and lost > 1:
                continue  # lost on the way
            if inbox.fresh(seq):
                inbox.queued(seq)
                queued.append(seq)
        outbox.ack(inbox.high)
    outbox.relinked()
    for seq, _ in outbox.unsent():
        if inbox.fresh(seq):
            inbox.queued(seq)
            queued.append(seq)
    outbox.ack(inbox.high)
    assert sorted(queued) == list(range(1, 101))
    assert len(outbox) == 0


def test_numbers_given_up_by_the_sender_are_not_waited_for() -> None:
    """The sender handed what it kept for this node to the node that took its sessions
    (give_up): its next STREAM says they are settled, and what follows is contiguous."""
    outbox = filled(5)
    for seq, _ in outbox.unsent():
        outbox.mark_sent(seq)
    inbox = Inbox()
    inbox.stream("e1", 0)
    inbox.queued(1)  # 2..5 never arrived
    assert [seq for seq, _ in outbox.give_up()] == [1, 2, 3, 4, 5]
    assert len(outbox) == 0 and outbox.acked == 5
    inbox.stream("e1", outbox.acked)
    assert inbox.high == 5
    seq, _ = outbox.add(frame)  # type: ignore[misc]
    assert inbox.fresh(seq)
    inbox.queued(seq)
    assert inbox.high == 6 and not inbox.window
