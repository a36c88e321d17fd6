"""The broker's promise for acknowledged messages, with the event relay on the message path.

Promised (docs/event-relay.md, "Durability"; tests/broker/test_flow_control.py and
tests/store/test_crash.py test the same without the relay): a QoS 1/2 message the broker
acknowledged (PUBACK / PUBREC) reaches its subscribers, under overload and across
`kill -9`; and the relay tells every one of them, once: an on_publish, an on_deliver per
delivery and an on_delivery_complete per acknowledged delivery, numbered without a gap.
With `durability = "acknowledged"` an acknowledged message's on_publish is in the spool
before its PUBACK leaves, so it survives `kill -9`; with `"spool"` every event a consumer
was sent is on disk (a process crash takes none of them back); with `"none"` the log
starts again, as a new epoch.

Tested here, with real brokers and sockets:
- an open-loop flood (QoS 1 and QoS 2) at a subscriber that reads nothing at first, in
  process, with the compiled and with the Python recorder: every message arrives once and
  in order, nothing is dropped, every one is acknowledged once, and the relay has, gap-free,
  one on_publish, one on_deliver and one on_delivery_complete per message, in order;
- a real broker process with the LevelDB store and the relay, killed with SIGKILL right
  after the last PUBACK, for each durability: the persistent subscriber gets every
  acknowledged message after the restart, and the relay keeps what its durability
  promises.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

from event_relay.client import RelayClient
from tests.broker.helpers import (
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    TIMEOUT,
    RawClient,
    ack_packet,
    publish_packet,
    unique_id,
)
from tests.broker.test_flow_control import (
    WINDOW,
    metrics,
    open_publisher,
    qos1_flood,
    receive,
    send_in_background,
    subscriber,
)
from tests.store.test_crash import resume, small_window_client
from tests.test_cli import BrokerProcess

from .conftest import RelayBroker, Stream, assert_gap_free
from .test_durability import (
    crash,
    everything_and_info,
    publish_acknowledged,
    relay_address,
    relay_config,
)
from .test_records import RECORDERS, with_recorder

MESSAGE_EVENTS = ("on_publish", "on_deliver", "on_delivery_complete")


def qos2_flood(topic: str, count: int) -> bytes:
    """`count` QoS 2 PUBLISHes with packet ids 1..count (none released before all are
    sent: the broker keeps up to receive_max_broker, 65,535, unreleased)."""
    return b"".join(publish_packet(topic, b"%d" % i, qos=2, packet_id=i + 1) for i in range(count))


def acks(client: RawClient, kind: int, count: int) -> list[int | None]:
    """The packet ids of the next `count` packets, each of type `kind`."""
    return [client.expect(kind).packet_id for _ in range(count)]


def message_events(events: list[dict[str, Any]], topic: str) -> dict[str, list[dict[str, Any]]]:
    """The per-message events about `topic`, by type, each list in sequence order."""
    return {
        kind: [e for e in events if e["type"] == kind and e.get("topic") == topic]
        for kind in MESSAGE_EVENTS
    }


def relay_broker_with(
    relay_broker: Callable[..., RelayBroker], keys: dict[str, Any]
) -> Callable[..., RelayBroker]:
    """The relay_broker fixture with these event_relay keys added (for with_recorder,
    which sets the recorder's)."""

    def start(relay: dict[str, Any] | None = None, **sections: Any) -> RelayBroker:
        return relay_broker(relay={**(relay or {}), **keys}, **sections)

    return start


@pytest.mark.parametrize("durability", ["none", "acknowledged"])
@pytest.mark.parametrize("qos", [1, 2])
@pytest.mark.parametrize("recorder", RECORDERS)
def test_open_loop_flood_loses_nothing_it_acknowledged_and_relays_every_message(
    relay_broker, tmp_path, recorder, qos, durability
):
    # As test_flow_control.py's flood: a device writes 5,000 QoS 1 or 2 PUBLISHes in one
    # write at a subscriber that reads nothing for now, the broker holds it at the queue's
    # high-water mark, then the subscriber reads and acknowledges everything. Meanwhile the
    # recorder is called for each publish, delivery (queued ones when the queue drains) and
    # completion, and with acknowledged durability it is sealed and the spool fsynced
    # before each turn's acknowledgements.
    relay = {"durability": durability, "spool_path": str(tmp_path / "spool")}
    broker = with_recorder(relay_broker_with(relay_broker, relay), recorder)
    server = broker.server
    count = 5000
    topic = f"promise/flood{qos}"
    start = broker.next_seq()
    sub = subscriber(broker, topic, qos)  # a small receive buffer, and reads nothing yet
    pub = open_publisher(broker)
    flood = qos1_flood(topic, count) if qos == 1 else qos2_flood(topic, count)
    sending = send_in_background(pub, flood)
    # The subscriber's queue reached its high-water mark: the publisher is held.
    server.wait_for(lambda: server.broker.metrics.flow_publisher_held >= 1)

    sent = [b"%d" % i for i in range(count)]
    assert receive(sub, count) == sent  # every one, once, in order (QoS 2: whole flow)
    assert sub.is_open()  # and nothing more before the PINGRESP
    sending.join(TIMEOUT)
    assert not sending.is_alive()
    if qos == 1:
        assert acks(pub, PUBACK, count) == [i % 65535 + 1 for i in range(count)]
    else:
        assert acks(pub, PUBREC, count) == list(range(1, count + 1))
        pub.send(b"".join(ack_packet(PUBREL, i) for i in range(1, count + 1)))
        assert acks(pub, PUBCOMP, count) == list(range(1, count + 1))
    assert pub.is_open()  # no acknowledgement more than the messages
    assert metrics(server)["queue_message_drop"] == 0

    completed = 0

    def last_completion(event: dict[str, Any]) -> bool:
        nonlocal completed
        completed += event["type"] == "on_delivery_complete" and event.get("topic") == topic
        return completed == count

    events = broker.read_all(until=last_completion, start=start)
    assert_gap_free(events, first=start)
    (subscribed,) = [e for e in events if e["type"] == "on_subscribe"]
    assert subscribed["topics"] == [[topic, qos, "", ""]]
    sub_id = subscribed["client_id"]
    found = message_events(events, topic)
    publishes = found["on_publish"]
    assert [e["payload"] for e in publishes] == sent  # once each, in publish order
    assert len({e["client_id"] for e in publishes}) == 1
    assert publishes[0]["client_id"] != sub_id
    assert {(e["qos"], e["retain"], e["payload_size"] == len(e["payload"])) for e in publishes} == {
        (qos, False, True)
    }
    for kind in ("on_deliver", "on_delivery_complete"):
        assert [e["payload"] for e in found[kind]] == sent, kind
        assert {(e["client_id"], e["qos"], e["persisted"]) for e in found[kind]} == {
            (sub_id, qos, False)
        }, kind
    # Each message's events in the order they happened: published, delivered, completed.
    for publish, deliver, complete in zip(*found.values(), strict=True):
        assert publish["seq"] < deliver["seq"] < complete["seq"], (publish, deliver, complete)
    assert not [e for e in events if e["type"] == "on_message_drop"]


# --------------------------------------------------------------------------- kill -9


DURABLE_TOPIC = "durable/x"  # test_durability.publish_acknowledged's
PUBLISH_WINDOW = 25  # QoS 1 PUBLISHes on the wire at a time
NO_LINE = re.compile(r"(?!)")  # matches nothing: BrokerProcess.wait_for reads to the end


def publish_then_crash(proc: BrokerProcess, count: int) -> list[bytes]:
    """Publish `count` QoS 1 messages and kill -9 the broker right after the last PUBACK;
    the payloads acknowledged (every one)."""
    try:
        return publish_acknowledged(proc.port, count, window=PUBLISH_WINDOW)
    finally:
        crash(proc)


async def watch_until_crash(proc: BrokerProcess, count: int) -> tuple[list[bytes], str, list]:
    """A consumer streams the relay from the earliest event while `count` messages are
    published and the broker is killed: (acknowledged payloads, the relay's epoch, the
    events the consumer was sent before the crash)."""
    seen: list[dict[str, Any]] = []
    async with await RelayClient.connect(
        *relay_address(proc), name="watcher", start="earliest"
    ) as client:

        async def collect() -> None:
            async for event in client:  # ends when the connection does
                seen.append(event)

        collecting = asyncio.create_task(collect())
        acked = await asyncio.to_thread(publish_then_crash, proc, count)
        await asyncio.wait_for(collecting, TIMEOUT)
        return acked, client.epoch, seen


@pytest.mark.parametrize("durability", ["none", "spool", "acknowledged"])
def test_acknowledged_messages_and_their_events_survive_kill_9(tmp_path, start_process, durability):
    config = relay_config(tmp_path, durability)  # the LevelDB store and the relay
    first = start_process(config)
    # Persistent, subscribed at QoS 1, connected and reading nothing: when the broker dies
    # it has some messages in flight to it and the rest queued.
    sub_id = unique_id("slow")
    sub = small_window_client(first)
    sub.connect(sub_id, clean=False)
    assert sub.subscribe((DURABLE_TOPIC, 1)) == [1]
    acked, epoch, seen = asyncio.run(watch_until_crash(first, 300))
    assert len(acked) == 300
    sub.close()

    second = start_process(config)
    kept, info = asyncio.run(everything_and_info(relay_address(second), "probe"))
    published = [e["payload"] for e in kept if e["type"] == "on_publish"]
    if durability == "none":  # memory only: a new log
        assert info["epoch"] != epoch
        assert (info["first_seq"], kept, published) == (1, [], [])
    else:
        assert info["epoch"] == epoch
        assert_gap_free(kept, first=1)
        # Every event a consumer was sent had been written to the spool: it is still
        # there, under the same sequence number.
        assert kept[: len(seen)] == seen
        assert published == acked[: len(published)]  # no duplicate, none out of order
        if durability == "acknowledged":  # every acknowledged publish was on disk first
            assert published == acked
        else:
            # Every loop turn's events are written at its end, and the publisher sent each
            # window only once it had the last one's PUBACKs, so only the last window's
            # turn may have been cut short by the crash.
            assert len(published) >= len(acked) - PUBLISH_WINDOW

    # The subscriber comes back without subscribing: every acknowledged message arrives,
    # those in flight at the crash again with DUP (QoS 1: they may come twice).
    back = resume(second, sub_id)
    got: dict[bytes, bool] = {}  # payload -> DUP when it first came
    while got.keys() != set(acked):
        pkt = back.expect(PUBLISH)
        assert (pkt.topic, pkt.qos, pkt.payload in acked) == (DURABLE_TOPIC, 1, True), pkt
        back.ack(pkt)
        got.setdefault(pkt.payload, pkt.dup)
    resent = {payload for payload, dup in got.items() if dup}
    assert 0 < len(resent) <= WINDOW

    # The relay tells the restarted broker's deliveries (a resend is no new delivery: its
    # on_deliver was before the crash) and one completion per acknowledged message.
    after = asyncio.run(completions(second, info["next_seq"], sub_id, set(acked)))
    assert_gap_free(after, first=info["next_seq"])
    to_sub = message_events([e for e in after if e["client_id"] == sub_id], DURABLE_TOPIC)
    assert sorted(e["payload"] for e in to_sub["on_delivery_complete"]) == sorted(acked)
    delivered = [(e["payload"], e["persisted"]) for e in to_sub["on_deliver"]]
    assert sorted(delivered) == sorted((payload, True) for payload in set(acked) - resent)
    if durability != "none":  # the first deliveries, made while routing: in the spool
        before = message_events([e for e in kept if e["client_id"] == sub_id], DURABLE_TOPIC)
        assert sorted(e["payload"] for e in before["on_deliver"]) == sorted(resent)

    assert second.stop() == 0  # and it shuts down cleanly after the crash
    with pytest.raises(AssertionError, match="stderr closed"):  # read all it wrote
        second.wait_for(NO_LINE)
    assert not any("Traceback" in line for line in second.lines), second.lines


async def completions(
    proc: BrokerProcess, start: int, client_id: str, payloads: set[bytes]
) -> list[dict[str, Any]]:
    """The events from `start` up to the on_delivery_complete to `client_id` that
    completes `payloads`."""
    done: set[bytes] = set()

    def complete(event: dict[str, Any]) -> bool:
        if event["type"] == "on_delivery_complete" and event["client_id"] == client_id:
            done.add(event["payload"])
        return done >= payloads

    async with await RelayClient.connect(*relay_address(proc), name="after", start=start) as client:
        return await Stream(client).until(complete)
