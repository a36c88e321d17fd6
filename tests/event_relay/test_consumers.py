"""Consumers of the relay, against a real broker: attaching (types, start positions),
resuming from a commit or a sequence number, range reads and queries, falling behind the
retained range, a consumer that stops reading, and every handshake error, spoken with
the real RelayClient or with frames over a plain socket."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from event_relay import frames
from event_relay.client import OutOfRange, RelayError
from event_relay.log import SEGMENT
from event_relay.server import HANDSHAKE_TIMEOUT
from tests.broker.helpers import RawClient, publish_packet, unique_id

from .conftest import RelayBroker, Stream, assert_gap_free, flood, one_publish

VERSION = frames.VERSION
to_thread = asyncio.to_thread


# --------------------------------------------------------------------------- attaching


def test_types_filter_and_start_positions(relay_broker):
    broker: RelayBroker = relay_broker()
    flood(broker, 5)
    everything = broker.read_all()
    assert_gap_free(everything, first=1)
    assert len(everything) == 13
    publishes = [e for e in everything if e["type"] == "on_publish"]
    assert len(publishes) == 5

    async def scenario() -> None:
        # Only the types asked for, in order, then the next one of that type.
        async with await broker.connect(start="earliest", types=["on_publish"]) as client:
            stream = Stream(client)
            assert await stream.take(5) == publishes
            await to_thread(one_publish, broker, "sentinel/types")
            sentinel = await stream.next()
            assert (sentinel["type"], sentinel["topic"]) == ("on_publish", "sentinel/types")
            # In between came that client's register, wakeup (not on_publish).
            assert sentinel["seq"] == everything[-1]["seq"] + 3

        async with await broker.connect(start="earliest") as client:
            assert client.start == client.welcome["first_seq"] == 1
            assert await Stream(client).take(13) == everything

        async with await broker.connect(start=7) as client:
            assert client.start == 7
            assert await Stream(client).take(7) == everything[6:]

        async with await broker.connect(start="latest") as client:
            next_seq = await to_thread(broker.next_seq)
            assert client.start == client.welcome["next_seq"] == next_seq
            await to_thread(one_publish, broker, "sentinel/latest")
            first = await Stream(client).next()
            assert (first["seq"], first["type"]) == (next_seq, "on_register")

    asyncio.run(scenario())


def test_resume_after_a_disconnect_from_the_commit_or_a_sequence(relay_broker):
    broker: RelayBroker = relay_broker()
    flood(broker, 4)  # events 1..11

    async def scenario() -> None:
        async with await broker.connect(name="resumer", start="committed") as client:
            assert client.welcome["committed"] is None
            assert client.start == 1  # never committed: from the earliest
            before = await Stream(client).take(6)
            await asyncio.wait_for(client.commit(before[-1]["seq"] + 1), 5)
            info = await asyncio.wait_for(client.info(), 5)
            assert info["committed"] == 7
        # While it is away.
        last = await to_thread(flood, broker, 3) - 1  # events 12..20

        async with await broker.connect(name="resumer", start="committed") as client:
            assert client.welcome["committed"] == 7
            assert client.start == 7
            after = await Stream(client).until(lambda e: e["seq"] == last)
        assert_gap_free(before + after, first=1)  # no gap, no duplicate
        assert len(before + after) == last

        async with await broker.connect(name="another", start=7) as client:
            assert client.welcome["committed"] is None  # commits are per name
            again = await Stream(client).until(lambda e: e["seq"] == last)
        assert again == after

    asyncio.run(scenario())


# --------------------------------------------------------------------------- range reads


def test_range_reads_and_info_from_memory(relay_broker):
    broker: RelayBroker = relay_broker(broker={"node_name": "relay-node"})
    next_seq = flood(broker, 50)  # events 1..103
    assert next_seq == 104

    async def scenario() -> None:
        async with await broker.connect(name="reader", start=None) as client:
            assert client.start is None
            everything = await client.read(1, next_seq)
            assert_gap_free(everything, first=1)
            assert len(everything) == 103

            assert await client.read(10, 20) == everything[9:19]
            assert await client.read(95, 10_000) == everything[94:]  # `to` in the future
            events, position = await client.read_raw(95, 10_000)
            assert (len(events), position) == (9, next_seq)
            assert await client.read(20, 20) == []

            assert await client.read(1, next_seq, limit=5) == everything[:5]
            events, position = await client.read_raw(1, next_seq, limit=5)
            assert position == 6

            drops = [e for e in everything if e["type"] == "on_message_drop"]
            assert await client.read(1, next_seq, types=["on_message_drop"]) == drops
            got, position = await client.read_raw(1, next_seq, types=["on_message_drop"], limit=3)
            assert [e[0] for e in got] == [d["seq"] for d in drops[:3]]
            assert position == drops[2]["seq"] + 1
            assert await client.read(1, 3, types=["on_publish"]) == []  # register, wakeup

            info = await client.info()
            assert info == {
                "version": frames.VERSION,
                "node": "relay-node",
                "epoch": broker.plugin.epoch,
                "first_seq": 1,
                "next_seq": next_seq,
                "payloads": "full",
                "committed": None,
            }
            assert client.epoch == broker.plugin.epoch and client.node == "relay-node"
            await client.commit(40)
            assert (await client.info())["committed"] == 40

    asyncio.run(scenario())


def test_range_reads_from_the_spool_and_memory(relay_broker, tmp_path):
    broker: RelayBroker = relay_broker(
        relay={"durability": "spool", "spool_path": str(tmp_path / "spool"), "memory_events": 1}
    )
    next_seq = flood(broker, SEGMENT + 50)
    memory_first = broker.server.call(lambda: broker.plugin.log.memory_first_seq)
    assert memory_first > SEGMENT  # the first segment is only in the spool now

    async def scenario() -> None:
        async with await broker.connect(start="earliest") as client:
            assert client.welcome["first_seq"] == 1
            streamed = await Stream(client).until(lambda e: e["seq"] == next_seq - 1)
        assert_gap_free(streamed, first=1)

        async with await broker.connect(start=None) as client:
            assert await client.read(1, 50) == streamed[:49]  # from the spool
            low, high = memory_first - 100, memory_first + 100  # across the two
            assert await client.read(low, high) == streamed[low - 1 : high - 1]
            assert await client.read(low, high, limit=150) == streamed[low - 1 : low + 149]
            drops = [e for e in streamed[low - 1 : high - 1] if e["type"] == "on_message_drop"]
            assert await client.read(low, high, types=["on_message_drop"]) == drops
            assert await client.read(1, next_seq) == streamed
            info = await client.info()
            assert (info["first_seq"], info["next_seq"]) == (1, next_seq)

    asyncio.run(scenario())


# --------------------------------------------------------------------------- behind


@pytest.fixture
def trimmed(relay_broker) -> tuple[RelayBroker, int, int]:
    """A relay whose memory let its first segment go: (broker, first_seq, next_seq)."""
    broker: RelayBroker = relay_broker(relay={"memory_events": 1})
    next_seq = flood(broker, SEGMENT // 2 + 10)
    first_seq = broker.server.call(lambda: broker.plugin.log.first_seq)
    assert first_seq == SEGMENT + 1
    return broker, first_seq, next_seq


def test_start_before_the_retained_range_is_out_of_range(trimmed, raw_consumer):
    broker, first_seq, next_seq = trimmed
    raw = raw_consumer(broker.address)
    raw.hello(name="late", start=1)
    welcome, error = raw.until_eof()
    assert welcome[0] == frames.WELCOME
    assert (welcome[1]["start"], welcome[1]["first_seq"]) == (1, first_seq)
    assert error[0] == frames.ERROR
    body = error[1]
    assert body["code"] == "out_of_range"
    assert (body["requested"], body["first_seq"], body["next_seq"]) == (1, first_seq, next_seq)
    assert str(first_seq) in body["message"]

    async def scenario() -> None:
        async with await broker.connect(name="late", start=first_seq - 1) as client:
            with pytest.raises(OutOfRange) as caught:
                await asyncio.wait_for(Stream(client).next(), 5)
            assert caught.value.code == "out_of_range"
            assert caught.value.details == {
                "requested": first_seq - 1,
                "first_seq": first_seq,
                "next_seq": next_seq,
            }
            with pytest.raises(OutOfRange):  # the connection is over
                await client.info()

        # A commit the log no longer holds.
        async with await broker.connect(name="committer", start=None) as client:
            await client.commit(5)
            with pytest.raises(OutOfRange) as caught:
                await client.read(first_seq - 10, first_seq + 10)
            assert caught.value.details["requested"] == first_seq - 10
        async with await broker.connect(name="committer", start="committed") as client:
            assert client.start == 5
            with pytest.raises(OutOfRange):
                await Stream(client).next()

        # The first retained event is still served.
        async with await broker.connect(start=first_seq) as client:
            assert (await Stream(client).next())["seq"] == first_seq

    asyncio.run(scenario())


def test_a_stalled_consumer_costs_a_bounded_buffer_then_learns_it_fell_behind(
    relay_broker, raw_consumer, paho_client
):
    broker: RelayBroker = relay_broker(relay={"memory_events": 20_000})
    stalled = raw_consumer(broker.address, rcvbuf=4096)
    stalled.hello(name="stalled", start="earliest")
    consumer = broker.consumer("stalled")
    transport = consumer.transport
    assert transport is not None
    payload = b"p" * 300  # events of about 400 bytes
    chunk = 5000  # publishes per write: 10,000 events
    buffered: list[int] = []

    async def scenario() -> int:
        async with await broker.connect(name="keeping-up", start="earliest") as client:
            batches = client.batches()
            last = 0
            for _ in range(8):
                target = await to_thread(flood, broker, chunk, payload) - 1
                while last < target:  # every event, in order, none missing
                    batch = await asyncio.wait_for(anext(batches), 5)
                    seqs = [values[0] for values in batch]
                    assert seqs == list(range(last + 1, last + 1 + len(seqs)))
                    last = seqs[-1]
                buffered.append(
                    await to_thread(broker.server.call, transport.get_write_buffer_size)
                )
                assert consumer.paused
            return last

    last = asyncio.run(scenario())
    assert last == 8 * (3 + 2 * chunk)
    assert max(buffered) < 2 * 1024 * 1024, buffered  # bounded, whatever the backlog
    log = broker.plugin.log
    first_seq, next_seq, memory_first = broker.server.call(
        lambda: (log.first_seq, log.next_seq, log.memory_first_seq)
    )
    assert next_seq - memory_first <= 20_000
    # The broker still works.
    sub = paho_client(broker)
    assert sub.subscribe("alive/#", 1) == [1]
    sub.publish("alive/x", b"yes", 1)
    assert sub.expect_message().payload == b"yes"

    # The stalled consumer reads at last: what was buffered, then out_of_range.
    got = stalled.until_eof()
    assert got[0][0] == frames.WELCOME
    assert {kind for kind, _ in got[1:-1]} == {frames.EVENTS}
    seqs = [values[0] for _, batch in got[1:-1] for values in batch]
    assert seqs == list(range(1, len(seqs) + 1))  # no gap in what it got
    kind, error = got[-1]
    assert kind == frames.ERROR
    assert error["code"] == "out_of_range"
    assert error["requested"] == seqs[-1] + 1
    assert error["first_seq"] > error["requested"]
    assert error["first_seq"] >= first_seq
    assert error["next_seq"] >= next_seq


# --------------------------------------------------------------------------- errors


GARBAGE = [
    pytest.param(b"GET / HTTP/1.1\r\nHost: relay\r\n\r\n", id="http"),
    pytest.param(b"\x00\x00\x00\x00", id="length-0"),
    pytest.param((frames.MAX_FRAME + 1).to_bytes(4, "big") + b"H", id="length-over-64MiB"),
    pytest.param(b"\x00\x00\x00\x02Z\xc0", id="unknown-kind"),
    pytest.param(b"\x00\x00\x00\x02H\xc1", id="not-msgpack"),
]


def hello_frame(**body: Any) -> bytes:
    return frames.frame(frames.HELLO, body)


HANDSHAKES = [
    pytest.param(frames.frame(frames.QUERY, {}), "bad_handshake", id="query-first"),
    pytest.param(frames.frame(frames.COMMIT, {"seq": 1}), "bad_handshake", id="commit-first"),
    pytest.param(frames.frame(frames.HELLO, ["tail"]), "bad_handshake", id="not-a-map"),
    pytest.param(hello_frame(version=VERSION, start="earliest"), "bad_handshake", id="no-name"),
    pytest.param(hello_frame(version=VERSION, name=""), "bad_handshake", id="empty-name"),
    pytest.param(hello_frame(version=VERSION, name=7), "bad_handshake", id="name-not-str"),
    pytest.param(
        hello_frame(version=VERSION, name="t", types=["on_publish", "on_nothing"]),
        "bad_handshake",
        id="unknown-type",
    ),
    pytest.param(
        hello_frame(version=VERSION, name="t", types="on_publish"), "bad_handshake", id="types"
    ),
    pytest.param(
        hello_frame(version=VERSION, name="t", start="newest"), "bad_handshake", id="start"
    ),
    pytest.param(hello_frame(version=VERSION, name="t", start=-1), "bad_handshake", id="start-neg"),
    pytest.param(
        hello_frame(version=VERSION, name="t", start=True), "bad_handshake", id="start-bool"
    ),
    pytest.param(
        hello_frame(version=VERSION, name="t", start=1.5), "bad_handshake", id="start-float"
    ),
    pytest.param(hello_frame(version=1, name="t"), "unsupported_version", id="version-1"),
    pytest.param(hello_frame(version=2, name="t"), "unsupported_version", id="version-2"),
    pytest.param(
        hello_frame(version=str(VERSION), name="t"), "unsupported_version", id="version-str"
    ),
]


def expect_error_then_eof(raw, code: str) -> dict[str, Any]:
    got = raw.until_eof()
    assert [kind for kind, _ in got] == [frames.ERROR], got
    body = got[0][1]
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return body


@pytest.fixture
def watched(relay_broker):
    """A relay that requires the secret s3cret."""
    return relay_broker(relay={"secret": "s3cret"})


REFUSED = [pytest.param(g.values[0], "bad_frame", id=g.id) for g in GARBAGE] + HANDSHAKES


@pytest.mark.parametrize(("data", "code"), REFUSED)
def test_bad_handshakes_get_an_error_and_are_closed(watched, raw_consumer, data, code):
    raw = raw_consumer(watched.address)
    raw.send(data)
    expect_error_then_eof(raw, code)


def test_secret_required(watched, raw_consumer):
    for body in ({"name": "t"}, {"name": "t", "secret": "wrong"}, {"name": "t", "secret": ""}):
        raw = raw_consumer(watched.address)
        raw.hello(**body)
        error = expect_error_then_eof(raw, "unauthorized")
        assert "secret" in error["message"]

    async def scenario() -> None:
        with pytest.raises(RelayError) as caught:
            await watched.connect(start="latest", secret="wrong")
        assert caught.value.code == "unauthorized"
        async with await watched.connect(start="earliest", secret="s3cret") as client:
            assert client.start == 1

    asyncio.run(scenario())


def test_a_non_ascii_secret_is_unauthorized(watched, raw_consumer):
    raw = raw_consumer(watched.address)
    raw.hello(name="t", secret="s3crét")
    expect_error_then_eof(raw, "unauthorized")


def test_errors_leave_the_broker_and_other_consumers_alone(watched, raw_consumer):
    async def scenario() -> None:
        async with await watched.connect(start="latest", secret="s3cret") as client:
            stream = Stream(client)
            for data in [case.values[0] for case in REFUSED]:
                raw = raw_consumer(watched.address)
                await to_thread(raw.send, data)
                got = await to_thread(raw.until_eof)
                assert [kind for kind, _ in got] == [frames.ERROR]
            await to_thread(one_publish, watched, "still/here")
            events = await stream.until(lambda e: e["type"] == "on_publish")
            assert events[-1]["topic"] == "still/here"
            assert events[0]["seq"] == client.start
            info = await client.info()
            assert info["next_seq"] >= events[-1]["seq"]
        consumers = watched.plugin.server.consumers
        watched.server.wait_for(lambda: not consumers)  # every refused one is gone

    asyncio.run(scenario())


def test_no_hello_in_time_is_a_bad_handshake(relay_broker, raw_consumer):
    broker: RelayBroker = relay_broker()
    raw = raw_consumer(broker.address)
    raw.send(hello_frame(version=VERSION, name="slow")[:7])  # half a HELLO, then nothing
    plugin_server = broker.plugin.server
    assert plugin_server is not None
    broker.server.wait_for(lambda: len(plugin_server.consumers) == 1)
    broker.server.advance(HANDSHAKE_TIMEOUT)
    error = expect_error_then_eof(raw, "bad_handshake")
    assert "HELLO" in error["message"]


@pytest.mark.parametrize(
    ("start", "request_frame"),
    [
        pytest.param("latest", hello_frame(version=VERSION, name="again"), id="hello-twice"),
        pytest.param("latest", frames.frame(frames.WELCOME, {}), id="welcome-from-consumer"),
        pytest.param("latest", frames.frame(frames.COMMIT, {"seq": "7"}), id="commit-str"),
        pytest.param("latest", frames.frame(frames.COMMIT, [7]), id="commit-not-map"),
        pytest.param("latest", frames.frame(frames.READ, {"from": 1, "to": 5}), id="read-stream"),
        pytest.param(None, frames.frame(frames.READ, {"from": 1}), id="read-no-to"),
        pytest.param(
            None,
            frames.frame(frames.READ, {"from": 1, "to": 5, "types": ["on_nothing"]}),
            id="read-unknown-type",
        ),
    ],
)
def test_bad_requests_after_the_handshake(relay_broker, raw_consumer, start, request_frame):
    broker: RelayBroker = relay_broker()
    raw = raw_consumer(broker.address)
    raw.hello(name="asker", start=start)
    assert raw.frame()[0] == frames.WELCOME
    raw.send(request_frame)
    expect_error_then_eof(raw, "bad_request")


def test_commit_and_query_frames_on_a_raw_connection(relay_broker, raw_consumer):
    broker: RelayBroker = relay_broker()
    raw = raw_consumer(broker.address)
    raw.hello(name="raw", start=None)
    kind, welcome = raw.frame()
    assert kind == frames.WELCOME
    assert set(welcome) == {
        "version", "node", "epoch", "first_seq", "next_seq", "payloads", "committed", "start"
    }  # fmt: skip
    raw.send(frames.frame(frames.COMMIT, {"seq": 3}))
    assert raw.frame() == (frames.COMMITTED, {"seq": 3})
    raw.send(frames.frame(frames.QUERY, {}))
    kind, info = raw.frame()
    assert kind == frames.INFO
    assert info == {**{k: v for k, v in welcome.items() if k != "start"}, "committed": 3}


# --------------------------------------------------------------------------- positions


def test_a_read_at_next_seq_is_empty_past_it_out_of_range(relay_broker, raw_consumer):
    broker: RelayBroker = relay_broker()
    next_seq = flood(broker, 2)
    raw = raw_consumer(broker.address)
    raw.hello(name="future", start=None)
    assert raw.frame()[0] == frames.WELCOME
    raw.send(frames.frame(frames.READ, {"from": next_seq, "to": next_seq + 10}))
    assert raw.frame() == (frames.READ_END, {"next": next_seq})
    raw.send(frames.frame(frames.READ, {"from": next_seq + 100, "to": next_seq + 200}))
    kind, body = raw.frame()
    assert kind == frames.ERROR
    assert {k: body[k] for k in ("code", "requested", "first_seq", "next_seq")} == {
        "code": "out_of_range",
        "requested": next_seq + 100,
        "first_seq": 1,
        "next_seq": next_seq,
    }
    assert raw.until_eof() == []


def test_streaming_from_past_next_seq_is_out_of_range(relay_broker):
    """A position past the end is from another epoch (a relay without a spool that
    restarted): said so at once, not waited on."""
    broker: RelayBroker = relay_broker()
    next_seq = flood(broker, 2)

    async def scenario() -> None:
        async with await broker.connect(start=next_seq + 1000) as client:
            with pytest.raises(OutOfRange) as caught:
                await Stream(client).next()
            assert caught.value.details["requested"] == next_seq + 1000
            assert caught.value.details["next_seq"] == next_seq
        async with await broker.connect(start=next_seq) as client:  # the end: waits
            await to_thread(one_publish, broker)
            assert (await Stream(client).next())["seq"] == next_seq

    asyncio.run(scenario())


def test_large_payloads_come_in_frames_of_a_few_mib(relay_broker, raw_consumer):
    """An EVENTS frame carries about FRAME_BYTES of events (more only for one larger
    event), so 70 events of 1 MiB are readable: by RelayClient, and frame by frame."""
    broker: RelayBroker = relay_broker(relay={"hooks": ["on_publish"]})
    pub = RawClient(broker.host, broker.port)
    try:
        pub.connect(unique_id("big"))
        for i in range(70):
            pub.publish("big/x", bytes([i]) * (1 << 20), qos=1)  # 70 MiB of payloads
    finally:
        pub.close()

    async def scenario() -> list[dict[str, Any]]:
        async with await broker.connect(start="earliest") as client:
            return await Stream(client).take(70, timeout=10)

    events = asyncio.run(scenario())
    assert [e["seq"] for e in events] == list(range(1, 71))
    assert [e["payload"] for e in events] == [bytes([i]) * (1 << 20) for i in range(70)]

    raw = raw_consumer(broker.address)
    raw.hello(name="frames", start=1)
    assert raw.frame()[0] == frames.WELCOME
    seen = 0
    while seen < 70:
        kind, batch = raw.frame()
        assert kind == frames.EVENTS
        size = sum(len(msgpack.packb(values)) for values in batch)
        assert size <= frames.FRAME_BYTES + (1 << 20) + 1024, (len(batch), size)
        seen += len(batch)
    assert seen == 70


def test_events_of_mixed_sizes_stream_without_gaps(relay_broker):
    broker: RelayBroker = relay_broker(relay={"hooks": ["on_publish"]})
    pub = RawClient(broker.host, broker.port)
    try:
        pub.connect(unique_id("mixed"))
        pub.send(b"".join(publish_packet("big/x", b"x" * 3000) for _ in range(SEGMENT)))
        pub.send(b"".join(publish_packet("small/x", b"y" * 100) for _ in range(SEGMENT)))
        pub.disconnect()
    finally:
        pub.close()
    plugin = broker.plugin
    broker.server.wait_for(lambda: plugin.log.next_seq == 2 * SEGMENT + 1)

    async def scenario() -> list[int]:
        async with await broker.connect(start="earliest") as client:
            seqs: list[int] = []
            batches = client.batches()
            while len(seqs) < 2 * SEGMENT:
                seqs += [values[0] for values in await asyncio.wait_for(anext(batches), 5)]
            return seqs

    assert asyncio.run(scenario()) == list(range(1, 2 * SEGMENT + 1))


# --------------------------------------------------------------------------- answers


def test_commit_inside_the_event_loop_with_a_backlog(relay_broker):
    """The documented loop (commit after each event) with far more batches waiting than
    the client reads ahead: the COMMITTED answers behind them still come."""
    broker: RelayBroker = relay_broker(relay={"batch_events": 10})
    next_seq = flood(broker, 200)  # 403 events: 41 batches

    async def scenario() -> None:
        async with await broker.connect(name="committer", start="earliest") as client:
            seen = []
            async for event in client:
                seen.append(event)
                await asyncio.wait_for(client.commit(event["seq"] + 1), 3)
                if event["seq"] == next_seq - 1:
                    break
            assert_gap_free(seen, first=1)
            assert (await client.info())["committed"] == next_seq
        async with await broker.connect(name="committer", start="committed") as client:
            assert client.start == next_seq

    asyncio.run(scenario())


def test_info_while_a_long_read_is_served(relay_broker):
    """The relay answers QUERY at once, also while a READ waits for the consumer's
    socket (its READ_END comes later): the client pairs each answer with its request."""
    broker: RelayBroker = relay_broker()
    next_seq = flood(broker, 1000, payload=b"x" * 10_000)  # about 20 MB of events

    async def scenario() -> None:
        async with await broker.connect(name="reader", start=None) as client:
            reading = asyncio.ensure_future(client.read(1, next_seq))
            await asyncio.sleep(0)  # READ is sent
            consumer = broker.consumer("reader")
            # This loop reads nothing until the relay has stopped writing to it.
            broker.server.wait_for(lambda: consumer.paused and consumer.reading)
            info = await asyncio.wait_for(client.info(), 10)
            assert info["next_seq"] == next_seq
            events = await asyncio.wait_for(reading, 10)
            assert_gap_free(events, first=1)
            assert len(events) == next_seq - 1

    asyncio.run(scenario())


def test_events_frames_on_the_wire(relay_broker, raw_consumer):
    """The wire shape: EVENTS is a msgpack array of events, each an array starting with
    seq, ts, the type code, client_id."""
    broker: RelayBroker = relay_broker()
    flood(broker, 1)
    raw = raw_consumer(broker.address)
    raw.send(b"\x00\x00\x00\x19H" + msgpack.packb({"version": VERSION, "name": "w", "start": 1}))
    assert raw.frame()[0] == frames.WELCOME
    kind, events = raw.frame()
    assert kind == frames.EVENTS
    client_id = events[0][3]
    assert [[e[0], e[2], e[3]] for e in events] == [
        [1, 1, client_id],
        [2, 10, client_id],
        [3, 3, client_id],
        [4, 9, client_id],
        [5, 12, client_id],
    ]
    assert all(isinstance(e[1], int) for e in events)
