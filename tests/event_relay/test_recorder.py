"""The message recorders: event_relay/recorder.py (the reference) and its C twin
event_relay/_recorder.c, driven through the same calls, must leave the same records.

The broker's own Message and Delivery are used; sessions and clients are small slotted
classes (and an unslotted one, which the C recorder reads by getattr).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.message import Delivery, Message
from event_relay import recorder
from event_relay.log import EventLog
from event_relay.schema import CODES, DELIVERIES, PUBLISH_DELIVERIES, SESSION_EVENTS, expand
from hooks import MatchedAcl

try:
    from event_relay import _recorder
except ImportError:  # pragma: no cover - the C recorder is built by `pip install -e .`
    _recorder = None  # type: ignore[assignment]

RECORDERS = [recorder.Recorder]
if _recorder is not None:
    RECORDERS.append(_recorder.Recorder)
MESSAGE_HOOKS = {"on_publish", "on_deliver", "on_delivery_complete"}


class Who:
    __slots__ = ("client_id", "mountpoint", "session_id", "username")

    def __init__(self, number: int, username: str | None = "user", mountpoint: str = "") -> None:
        self.client_id = f"client-{number}"
        self.mountpoint = mountpoint
        self.username = username
        self.session_id = f"session-{number}"


class LooseWho:  # no __slots__: read by getattr
    def __init__(self, number: int) -> None:
        self.client_id = f"loose-{number}"
        self.mountpoint = ""
        self.username = None
        self.session_id = f"loose-session-{number}"


class Harness:
    """One recorder on a log of its own, with the loop turn's end run by hand."""

    def __init__(self, cls: type, relayed: set[str] = MESSAGE_HOOKS, payloads: str = "full"):
        self.log = EventLog(memory_events=1_000_000, memory_bytes=1 << 30)
        self.due: list[Callable[[], None]] = []
        self.recorder = cls(self.log, relayed, payloads, {}, self.due.append)

    def end_turn(self) -> None:
        while self.due:
            self.due.pop(0)()

    def records(self) -> list[list[Any]]:
        self.recorder.seal()
        self.end_turn()
        found, _ = self.log.read(1, 1 << 30)
        return [msgpack.unpackb(data) for data in found]

    def events(self) -> list[list[Any]]:
        return expand(self.records())


def without_ts(values: list[Any]) -> list[Any]:
    return [values[0], *values[2:]]


def decoded(record: list[Any]) -> list[Any]:
    """A record with its receivers decoded and no ts (the two recorders differ there)."""
    record = without_ts(record)
    if record[1] in (DELIVERIES, PUBLISH_DELIVERIES, SESSION_EVENTS):
        count, data = record[-2], record[-1]
        record[-1] = msgpack.unpackb(b"\xdd" + count.to_bytes(4, "big") + data)
    return record


@pytest.mark.parametrize("cls", RECORDERS)
def test_a_publish_and_its_deliveries_make_one_record(cls):
    h = Harness(cls)
    message = Message("a/b", b"hello", 1, retain=True)
    message.acl_name = "fleet"
    before = time.time_ns()
    h.recorder.published(Who(0), message, MatchedAcl("fleet", "a/#"))
    h.recorder.delivered(Who(1), Delivery(message, 1, True, ()))
    stored = Delivery(message, 0, False, ())
    stored.seq = 7
    h.recorder.delivered(Who(2, None), stored)
    records = h.records()
    assert [r[2] for r in records] == [PUBLISH_DELIVERIES]
    events = expand(records)
    assert [e[0] for e in events] == [1, 2, 3]
    assert all(before <= e[1] <= time.time_ns() for e in events)
    on_publish, first, second = (without_ts(e) for e in events)
    publisher = ["client-0", "", "user", "session-0"]
    assert on_publish == [1, 3, *publisher, "a/b", 1, True, 5, b"hello", "fleet", "a/#"]
    receiver = ["client-1", "", "user", "session-1"]
    assert first == [2, 6, *receiver, "a/b", 1, True, 5, b"hello", "fleet", False]
    assert second[2:7] == ["client-2", "", None, "session-2", "a/b"]
    assert second[7:] == [0, False, 5, b"hello", "fleet", True]  # qos 0, persisted


@pytest.mark.parametrize("cls", RECORDERS)
def test_a_mountpoints_events_carry_it_and_the_topic_as_its_clients_know_it(cls):
    h = Harness(cls)
    message = Message("\0tenant-a/a/b", b"hi", 1)  # as the broker keeps tenant-a's topics
    h.recorder.published(Who(0, mountpoint="tenant-a"), message, None)
    h.recorder.delivered(Who(1, mountpoint="tenant-a"), Delivery(message, 1, False, ()))
    h.recorder.completed(Who(1, mountpoint="tenant-a"), Delivery(message, 1, False, ()))
    on_publish, on_deliver, complete = (without_ts(e) for e in h.events())
    assert on_publish[2:8] == ["client-0", "tenant-a", "user", "session-0", "a/b", 1]
    assert on_deliver[2:7] == ["client-1", "tenant-a", "user", "session-1", "a/b"]
    assert complete[2:7] == ["client-1", "tenant-a", "user", "session-1", "a/b"]


@pytest.mark.parametrize("cls", RECORDERS)
def test_anything_else_recorded_ends_the_run_so_order_is_kept(cls):
    h = Harness(cls)
    m1, m2 = Message("t/1", b"1", 0), Message("t/2", b"2", 0)
    h.recorder.published(Who(0), m1, None)
    h.recorder.delivered(Who(1), Delivery(m1, 0, False, ()))
    h.recorder.append(CODES["on_client_wakeup"], [0, 5, 0, "client-9", "", None, "s-9"])
    h.recorder.delivered(Who(2), Delivery(m1, 0, False, ()))  # after it: a run of its own
    h.recorder.delivered(Who(3), Delivery(m2, 0, False, ()))  # another message
    h.recorder.completed(Who(1), Delivery(m1, 0, False, ()))
    records = h.records()
    assert [r[2] for r in records] == [
        PUBLISH_DELIVERIES,
        CODES["on_client_wakeup"],
        DELIVERIES,
        DELIVERIES,
        SESSION_EVENTS,  # client-1's completion: a run of client-1's events
    ]
    events = expand(records)
    assert [e[0] for e in events] == list(range(1, 7))
    assert [(e[2], e[3]) for e in events] == [
        (3, "client-0"),
        (6, "client-1"),
        (10, "client-9"),
        (6, "client-2"),
        (6, "client-3"),
        (7, "client-1"),
    ]


@pytest.mark.parametrize("cls", RECORDERS)
def test_one_receivers_deliveries_and_completions_in_a_row_make_one_record(cls):
    # A queue drained when the subscriber has room again: messages one after another to
    # one connection, with the PUBACKs that made the room among them.
    h = Harness(cls)
    m1, m2, m3 = (Message(f"t/{i}", b"%d" % i, 1) for i in (1, 2, 3))
    h.recorder.published(Who(0), m1, None)
    h.recorder.delivered(Who(1), Delivery(m1, 1, False, ()))
    h.end_turn()  # later, receiver's queue drains
    receiver = Who(2)
    stored = Delivery(m2, 1, True, ())
    stored.seq = 4
    h.recorder.delivered(receiver, Delivery(m1, 1, False, ()))  # a DELIVERIES run of m1...
    h.recorder.delivered(receiver, stored)  # ...becomes receiver's: m2 is another message
    h.recorder.completed(receiver, Delivery(m1, 1, False, ()))
    h.recorder.delivered(receiver, Delivery(m3, 0, False, ()))
    records = h.records()
    assert [r[2] for r in records] == [PUBLISH_DELIVERIES, SESSION_EVENTS]
    assert records[1][3:8] == ["client-2", "", "user", "session-2", 4]
    events = expand(records)
    assert [e[0] for e in events] == list(range(1, 7))
    assert len({e[1] for e in events[2:]}) == 1  # a record's events share its ts
    expected = ["client-2", "", "user", "session-2"]
    assert [without_ts(e) for e in events[2:]] == [
        [3, 6, *expected, "t/1", 1, False, 1, b"1", "", False],
        [4, 6, *expected, "t/2", 1, True, 1, b"2", "", True],
        [5, 7, *expected, "t/1", 1, False, 1, b"1", "", False],
        [6, 6, *expected, "t/3", 0, False, 1, b"3", "", False],
    ]


@pytest.mark.parametrize("cls", RECORDERS)
def test_a_message_run_of_two_receivers_stays_one_and_a_receiver_run_ends_at_another(cls):
    h = Harness(cls)
    m1, m2 = Message("t/1", b"1", 0), Message("t/2", b"2", 0)
    second = Who(2)
    h.recorder.delivered(Who(1), Delivery(m1, 0, False, ()))
    h.recorder.delivered(second, Delivery(m1, 0, False, ()))
    h.recorder.delivered(second, Delivery(m2, 0, False, ()))  # not the run's one receiver
    third = Who(3)
    h.recorder.completed(third, Delivery(m1, 0, False, ()))
    h.recorder.completed(third, Delivery(m2, 0, False, ()))
    h.recorder.delivered(Who(4), Delivery(m2, 0, False, ()))  # another receiver: ends it
    records = h.records()
    assert [(r[2], r[7]) for r in records] == [
        (DELIVERIES, 2),
        (DELIVERIES, 1),
        (SESSION_EVENTS, 2),
        (DELIVERIES, 1),
    ]
    assert [(e[0], e[2], e[3], e[7]) for e in expand(records)] == [
        (1, 6, "client-1", "t/1"),
        (2, 6, "client-2", "t/1"),
        (3, 6, "client-2", "t/2"),
        (4, 7, "client-3", "t/1"),
        (5, 7, "client-3", "t/2"),
        (6, 6, "client-4", "t/2"),
    ]


@pytest.mark.parametrize("cls", RECORDERS)
def test_a_reconnect_in_the_same_turn_starts_a_run_of_the_new_connection(cls):
    # The broker's Session outlives a connection; its session id is the connection's.
    h = Harness(cls)
    session = Who(1)
    h.recorder.completed(session, Delivery(Message("t", b"x", 1), 1, False, ()))
    session.session_id = "session-1-again"
    h.recorder.completed(session, Delivery(Message("t", b"y", 1), 1, False, ()))
    assert [(e[2], e[6], e[11]) for e in h.events()] == [
        (7, "session-1", b"x"),
        (7, "session-1-again", b"y"),
    ]


@pytest.mark.parametrize("cls", RECORDERS)
def test_a_publish_nobody_receives_is_a_plain_on_publish(cls):
    h = Harness(cls)
    h.recorder.published(LooseWho(1), Message("x", b"", 0), None)
    h.end_turn()  # the run ends with the loop turn
    records = h.records()
    assert [without_ts(r) for r in records] == [
        [1, 3, "loose-1", "", None, "loose-session-1", "x", 0, False, 0, b"", "", ""]
    ]


@pytest.mark.parametrize("cls", RECORDERS)
@pytest.mark.parametrize(
    ("relayed", "payloads", "expected"),
    [
        ({"on_deliver"}, "full", [(6, 4, b"data")]),
        ({"on_publish"}, "size", [(3, 4, None)]),
        ({"on_publish", "on_deliver"}, "none", [(3, None, None), (6, None, None)]),
        ({"on_delivery_complete"}, "full", [(7, 4, b"data")]),
    ],
)
def test_hooks_and_payloads(cls, relayed, payloads, expected):
    h = Harness(cls, relayed, payloads)
    message = Message("t", b"data", 1)
    h.recorder.published(Who(0), message, None)
    h.recorder.delivered(Who(1), Delivery(message, 1, False, ()))
    h.recorder.completed(Who(1), Delivery(message, 1, False, ()))
    assert [(e[2], e[10], e[11]) for e in h.events()] == expected


@pytest.mark.skipif(_recorder is None, reason="the C recorder was not built")
def test_the_c_recorder_refuses_sampling_rules():
    log = EventLog(memory_events=10, memory_bytes=1 << 20)
    with pytest.raises(ValueError, match="sampling"):
        _recorder.Recorder(log, MESSAGE_HOOKS, "full", {"on_deliver": {"x": 5}}, print)


@pytest.mark.skipif(_recorder is None, reason="the C recorder was not built")
def test_the_c_recorder_raises_what_a_bad_object_raises():
    h = Harness(_recorder.Recorder)
    with pytest.raises(AttributeError):
        h.recorder.delivered(Who(1), object())
    with pytest.raises(TypeError):
        h.recorder.published(Who(1))  # type: ignore[call-arg]
    message = Message("t", b"x", 0)
    h.recorder.published(Who(0), message, None)  # still works after the errors
    h.recorder.delivered(Who(1), Delivery(message, 0, False, ()))
    assert [e[2] for e in h.events()] == [3, 6]


# One operation on both recorders: (kind, who, message index, qos, retain, stored)
operations = st.lists(
    st.tuples(
        st.sampled_from(
            ["publish", "deliver", "deliver", "deliver", "complete", "other", "turn", "run"]
        ),
        st.integers(0, 5),
        st.integers(0, 3),
        st.integers(0, 2),
        st.booleans(),
        st.booleans(),
    ),
    max_size=60,
)


def play(h: Harness, op: tuple, whos: list[Any], messages: list[Message]) -> None:
    """One of `operations` on a harness's recorder."""
    kind, who, index, qos, retain, stored = op
    message = messages[index]
    delivery = Delivery(message, qos, retain, ())
    delivery.seq = 3 if stored else -1
    if kind == "publish":
        h.recorder.published(whos[who], message, MatchedAcl("l", "p/#") if qos else None)
    elif kind == "deliver":
        h.recorder.delivered(whos[who], delivery)
    elif kind == "complete":
        h.recorder.completed(whos[who], delivery)
    elif kind == "other":
        h.recorder.append(CODES["on_session_expired"], [0, 1, 0, "c", "", None, "s"])
    elif kind == "run":
        matched = MatchedAcl("l", "p/#") if stored else None
        h.recorder.published_run(whos[who], message.topic, *run_of(op, whos), matched)
    else:
        h.end_turn()


def run_of(op: tuple, whos: list[Any]) -> tuple[list[bytes], list[Any]]:
    """A "run" operation's payloads (1 to 3) and receivers (none to 3, from `who` on)."""
    _, who, index, qos, _, _ = op
    return [bytes([n]) * (n * 50) for n in range(qos + 1)], whos[who + 1 : who + 1 + index]


@pytest.mark.skipif(_recorder is None, reason="the C recorder was not built")
@settings(max_examples=150, deadline=None)
@given(
    operations,
    st.sampled_from(["full", "size", "none"]),
    st.sets(st.sampled_from(sorted(MESSAGE_HOOKS)), min_size=1),
)
def test_the_c_recorder_leaves_the_records_the_reference_leaves(ops, payloads, relayed):
    harnesses = [Harness(recorder.Recorder, relayed, payloads)]
    harnesses.append(Harness(_recorder.Recorder, relayed, payloads))
    messages = [Message(f"topic/{i}", bytes([i]) * (i * 100), i % 3) for i in range(4)]
    whos: list[Any] = [Who(i, None if i == 3 else f"u{i}") for i in range(5)] + [LooseWho(5)]
    for op in ops:
        for h in harnesses:
            play(h, op, whos, messages)
    reference, compiled = ([decoded(r) for r in h.records()] for h in harnesses)
    assert compiled == reference
    assert harnesses[0].log.next_seq == harnesses[1].log.next_seq


def expected_events(ops: list[tuple], relayed: set[str], whos: list[Any], messages) -> list:
    """What each operation is as a plain event: (type, client id, topic, qos, retain,
    persisted or None), in the order the calls were made."""
    wanted = {CODES[hook] for hook in relayed}
    kinds = {"publish": 3, "deliver": 6, "complete": 7, "other": 13}
    events: list[tuple] = []
    for op in ops:
        kind, who, index, qos, retain, stored = op
        if kind == "run":  # each message: its publish, then a delivery to each receiver
            topic = messages[index].topic
            payloads, receivers = run_of(op, whos)
            for _ in payloads:
                if 3 in wanted:
                    events.append((3, whos[who].client_id, topic, 0, False, None))
                if 6 in wanted:
                    events.extend((6, r.client_id, topic, 0, False, False) for r in receivers)
            continue
        code = kinds.get(kind)
        if code is None or (code != 13 and code not in wanted):
            continue
        message = messages[index]
        if code == 3:
            events.append((3, whos[who].client_id, message.topic, message.qos, False, None))
        elif code == 13:
            events.append((13, "c", None, None, None, None))
        else:
            events.append((code, whos[who].client_id, message.topic, qos, retain, stored))
    return events


def as_expected(event: list[Any]) -> tuple:
    if event[2] == 13:
        return (13, event[3], None, None, None, None)
    persisted = event[13] if event[2] in (6, 7) else None
    return (event[2], event[3], event[7], event[8], event[9], persisted)


@pytest.mark.parametrize("cls", RECORDERS)
@settings(max_examples=100, deadline=None)
@given(operations, st.sets(st.sampled_from(sorted(MESSAGE_HOOKS)), min_size=1))
def test_the_records_expand_to_every_event_in_the_order_it_happened(cls, ops, relayed):
    h = Harness(cls, relayed)
    messages = [Message(f"topic/{i}", bytes([i]) * 3, i % 3) for i in range(4)]
    whos: list[Any] = [Who(i) for i in range(5)] + [LooseWho(5)]
    for op in ops:
        play(h, op, whos, messages)
    events = h.events()
    assert [e[0] for e in events] == list(range(1, len(events) + 1))
    assert [as_expected(e) for e in events] == expected_events(ops, relayed, whos, messages)


@pytest.mark.parametrize("cls", RECORDERS)
@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_a_payload_that_is_not_bytes_is_recorded_as_its_bytes(cls, kind):
    h = Harness(cls)
    message = Message("t", kind(b"abc"), 0)  # type: ignore[arg-type]
    h.recorder.published(Who(0), message, None)
    h.recorder.delivered(Who(1), Delivery(message, 0, False, ()))
    assert [(e[10], e[11]) for e in h.events()] == [(3, b"abc"), (3, b"abc")]


class BrokenDelivery:
    """A delivery whose qos cannot be read (the broker's never is)."""

    def __init__(self, message: Message) -> None:
        self.message = message

    @property
    def qos(self) -> int:
        raise RuntimeError("no qos")


@pytest.mark.parametrize("cls", RECORDERS)
def test_a_delivery_that_fails_halfway_leaves_the_record_whole(cls):
    h = Harness(cls)
    message = Message("t", b"x", 0)
    h.recorder.published(Who(0), message, None)
    with pytest.raises(RuntimeError, match="no qos"):
        h.recorder.delivered(Who(1), BrokenDelivery(message))
    h.recorder.delivered(Who(2), Delivery(message, 0, False, ()))
    assert [(e[0], e[2], e[3]) for e in h.events()] == [(1, 3, "client-0"), (2, 6, "client-2")]


@pytest.mark.parametrize("cls", RECORDERS)
def test_a_first_delivery_that_fails_leaves_no_run_of_that_receiver(cls):
    # Its next event, of another message, must not be taken for the failed run's second.
    h = Harness(cls)
    receiver = Who(1)
    m1, m2 = Message("t/1", b"1", 0), Message("t/2", b"2", 0)
    with pytest.raises(RuntimeError, match="no qos"):
        h.recorder.delivered(receiver, BrokenDelivery(m1))
    h.recorder.delivered(receiver, Delivery(m2, 0, False, ()))
    h.recorder.completed(receiver, Delivery(m2, 0, False, ()))
    assert [(e[0], e[2], e[3], e[7]) for e in h.events()] == [
        (1, 6, "client-1", "t/2"),
        (2, 7, "client-1", "t/2"),
    ]


@pytest.mark.parametrize("cls", RECORDERS)
@pytest.mark.parametrize("relayed", [MESSAGE_HOOKS, {"on_deliver"}, {"on_publish"}])
@pytest.mark.parametrize("matched", [None, MatchedAcl("tee", "a/+")])
def test_a_run_records_what_its_messages_would_one_by_one(cls, relayed, matched):
    """published_run means published, then delivered to each receiver, per message: the
    same records as those calls with the broker's own Message and Delivery, the ACL rule
    of the kept answer that allowed the run (`matched`) included, as Ingress.publish
    gives it (the rule's label is the message's acl_name)."""
    by_run, one_by_one = Harness(cls, relayed), Harness(cls, relayed)
    publisher, receivers = Who(0), [Who(1), Who(2, None), LooseWho(3)]
    payloads = [b"", b"x" * 40, bytes(300)]
    by_run.recorder.published_run(publisher, "a/b", payloads, receivers, matched)
    by_run.recorder.published_run(publisher, "a/b", [b"y"], receivers[:1], matched)  # one
    by_run.recorder.published_run(publisher, "a/c", [b"z"], [], matched)  # nobody subscribed

    def message_of(topic: str, payload: bytes) -> Message:
        message = Message(topic, payload, 0)
        if matched is not None:
            message.acl_name = matched.name
        return message

    for topic, run, to in (("a/b", payloads, receivers), ("a/b", [b"y"], receivers[:1])):
        for payload in run:
            message = message_of(topic, payload)
            one_by_one.recorder.published(publisher, message, matched)
            for receiver in to:
                one_by_one.recorder.delivered(receiver, Delivery(message, 0, False, ()))
    one_by_one.recorder.published(publisher, message_of("a/c", b"z"), matched)
    assert [decoded(r) for r in by_run.records()] == [decoded(r) for r in one_by_one.records()]
    events = by_run.events()
    if matched is not None:  # each event names the rule's label, each publish its pattern
        assert {e[12] for e in events} == {"tee"}
        assert {e[13] for e in events if e[2] == CODES["on_publish"]} <= {"a/+"}
    published = 3 + 1 + 1 if "on_publish" in relayed else 0
    delivered = 3 * 3 + 1 if "on_deliver" in relayed else 0
    assert len(events) == published + delivered
    assert [e[0] for e in events] == list(range(1, len(events) + 1))


@pytest.mark.parametrize("cls", RECORDERS)
def test_a_run_with_one_receiver_then_its_next_event_joins_that_receivers_run(cls):
    # As one by one: a message's only delivery, then that receiver's completion.
    h = Harness(cls, {"on_deliver", "on_delivery_complete"})
    receiver = Who(1)
    h.recorder.published_run(Who(0), "t", [b"1"], [receiver], None)
    h.recorder.completed(receiver, Delivery(Message("u", b"2", 1), 1, False, ()))
    records = h.records()
    assert [r[2] for r in records] == [SESSION_EVENTS]
    assert [(e[2], e[7]) for e in h.events()] == [(6, "t"), (7, "u")]
