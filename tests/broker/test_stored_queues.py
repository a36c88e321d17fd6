"""Queues kept in the LevelDB store (docs/storage.md): a stored backlog is read in chunks
as it drains, new messages join it in order, a restart reads no queue, and what a
persistent session has in flight is written before it is acknowledged. Crashes of a real
process are in tests/store/."""

from __future__ import annotations

from .helpers import PUBLISH, V311, unique_id

QUEUED = 2500  # more than one chunk of 1,000 read from the store


def leveldb(tmp_path) -> dict:
    return {
        "store": {"backend": "leveldb", "path": str(tmp_path / "db")},
        "broker": {"max_offline_messages": -1, "max_inflight_messages": 50},
    }


def persistent_subscriber(raw_client, server, client_id: str, topic: str):
    sub = raw_client(server, V311)
    sub.connect(client_id, clean=False)
    sub.subscribe((topic, 1))
    sub.disconnect()


def session_of(server, client_id: str):
    return server.call(lambda: server.broker.registry[client_id])


def test_a_backlog_of_several_chunks_arrives_in_order_with_newer_messages_after_it(
    start_broker, raw_client, paho_client, tmp_path
):
    server = start_broker(**leveldb(tmp_path))
    client_id = unique_id("chunks")
    persistent_subscriber(raw_client, server, client_id, "chunks/t")
    pub = paho_client(server, V311)
    for i in range(QUEUED):
        pub.publish("chunks/t", b"%d" % i, qos=1)
    session = session_of(server, client_id)
    assert server.call(lambda: (len(session.queue), session.on_disk)) == (0, QUEUED)

    sub = raw_client(server, V311)
    assert sub.connect(client_id, clean=False).session_present
    got = []
    for i in range(QUEUED + 10):
        if i == 100:  # while the stored backlog drains, new messages join its end
            for j in range(10):
                pub.publish("chunks/t", b"new-%d" % j, qos=1)
        pkt = sub.expect(PUBLISH)
        sub.ack(pkt)
        got.append(pkt.payload)
    assert got == [b"%d" % i for i in range(QUEUED)] + [b"new-%d" % j for j in range(10)]
    server.wait_for(lambda: not (session.queue or session.on_disk or session.inflight))


def test_a_restart_reads_no_queue_until_its_client_connects(
    start_broker, raw_client, paho_client, tmp_path
):
    sections = leveldb(tmp_path)
    server = start_broker(**sections)
    client_id = unique_id("lazy")
    persistent_subscriber(raw_client, server, client_id, "lazy/t")
    pub = paho_client(server, V311)
    for i in range(QUEUED):
        pub.publish("lazy/t", b"%d" % i, qos=1)
    pub.disconnect()
    server.stop()

    server = start_broker(**sections)
    session = session_of(server, client_id)
    assert server.call(lambda: (len(session.queue), session.on_disk)) == (0, QUEUED)
    sub = raw_client(server, V311)
    assert sub.connect(client_id, clean=False).session_present
    got = []
    for _ in range(QUEUED):
        pkt = sub.expect(PUBLISH)
        sub.ack(pkt)
        got.append(pkt.payload)
    assert got == [b"%d" % i for i in range(QUEUED)]


def test_a_message_for_an_online_persistent_session_is_stored_before_its_puback(
    start_broker, raw_client, paho_client, tmp_path
):
    # The subscriber is connected and does not acknowledge: the message went out at once,
    # so it is stored as one in-flight record that carries it, by the time the publisher
    # has its PUBACK. Acknowledging it deletes the record.
    server = start_broker(**leveldb(tmp_path))
    client_id = unique_id("online")
    sub = raw_client(server, V311)
    sub.connect(client_id, clean=False)
    sub.subscribe(("online/t", 1))
    pub = paho_client(server, V311)
    pub.publish("online/t", b"kept", qos=1)  # returns once the PUBACK arrived
    store = server.broker.store

    def in_flight() -> list[bytes]:
        records = store.load_inflight(client_id)
        return [entry.delivery.message.payload for *_, entry in records if entry and entry.delivery]

    assert server.call(in_flight) == [b"kept"]
    pkt = sub.expect(PUBLISH)
    assert pkt.payload == b"kept"
    sub.ack(pkt)
    server.wait_for(lambda: in_flight() == [])


def test_qos0_messages_in_a_stored_backlog_are_delivered_too(
    start_broker, raw_client, paho_client, tmp_path
):
    # A backlog read from the store that holds QoS 0 messages (queued while the client
    # was online) goes out chunk after chunk without acknowledgements asking for more.
    sections = leveldb(tmp_path)
    sections["broker"]["max_msgs_per_drain_step"] = 100
    server = start_broker(**sections)
    client_id = unique_id("q0")
    sub = raw_client(server, V311)
    sub.connect(client_id, clean=False)
    sub.subscribe(("q0/t", 0))
    session = session_of(server, client_id)
    writer = server.call(lambda: session.outlet)
    server.call(writer.pause)  # what the transport's pause_writing does
    pub = paho_client(server, V311)
    for i in range(450):  # below the queue's high-water mark: the publisher is not held
        pub.publish("q0/t", b"%d" % i, qos=1)  # delivered at QoS 0, its subscription's
    server.wait_for(lambda: len(session.queue) == 450)
    sub.disconnect()  # the queue stays in the store
    back = raw_client(server, V311)
    back.connect(client_id, clean=False)
    got = [back.expect(PUBLISH).payload for _ in range(450)]
    assert got == [b"%d" % i for i in range(450)]
