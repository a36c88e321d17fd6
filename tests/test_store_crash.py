"""The LevelDB store against real crashes: `python -m broker` killed with SIGKILL and
started again on the same store (docs/storage.md). Nothing acknowledged is lost, online
or offline; QoS 2 exchanges continue where they stopped; a store that cannot be used
stops start-up with one line."""

from __future__ import annotations

import signal
from pathlib import Path

import plyvel

from tests.broker.helpers import (
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    RawClient,
    ack_packet,
    publish_packet,
    unique_id,
)
from tests.test_cli import BrokerProcess, nautilus, start_process, write_config

__all__ = ["start_process"]  # the fixture, used by name

HOST = "127.0.0.1"


def store_config(tmp_path: Path) -> Path:
    store = f'backend = "leveldb"\npath = "{tmp_path / "store"}"'
    config = write_config(tmp_path / "nautilus.toml", store=store)
    # Offline queues of 1,000 (the default) would drop, counted, what the tests queue.
    config.write_text(
        config.read_text().replace("[broker]\n", "[broker]\nmax_offline_messages = -1\n")
    )
    return config


def crash(broker: BrokerProcess) -> None:
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait()


def client(broker: BrokerProcess, client_id: str = "", clean: bool = True) -> RawClient:
    raw = RawClient(HOST, broker.port)
    raw.connect(client_id or unique_id("c"), clean=clean)
    return raw


def persistent_subscriber(broker: BrokerProcess, topic: str, qos: int) -> tuple[str, RawClient]:
    """A subscriber with clean session off, still connected, and its client id."""
    client_id = unique_id("sub")
    sub = client(broker, client_id, clean=False)
    sub.subscribe((topic, qos))
    return client_id, sub


def resume(broker: BrokerProcess, client_id: str) -> RawClient:
    """Connect again with clean session off; the session must be there."""
    back = RawClient(HOST, broker.port)
    assert back.connect(client_id, clean=False).session_present
    return back


def test_kill_9_keeps_what_was_acknowledged_for_a_connected_subscriber(tmp_path, start_process):
    # The subscriber is connected and reads nothing: 20 messages in flight, the rest
    # queued. Before layout 2 a crash lost all of them (only offline queues were written).
    config = store_config(tmp_path)
    broker = start_process(config)
    sub_id, _ = persistent_subscriber(broker, "crash/online", 1)
    pub = client(broker)
    for i in range(300):
        pub.publish("crash/online", b"%d" % i, qos=1)  # waits for each PUBACK
    crash(broker)

    broker = start_process(config)
    back = resume(broker, sub_id)
    got: set[bytes] = set()
    while len(got) < 300:  # the ones in flight come again (DUP): QoS 1 may repeat
        pkt = back.expect(PUBLISH)
        back.ack(pkt)
        got.add(pkt.payload)
    assert got == {b"%d" % i for i in range(300)}


def test_kill_9_keeps_an_offline_queue_in_order(tmp_path, start_process):
    config = store_config(tmp_path)
    broker = start_process(config)
    sub_id, sub = persistent_subscriber(broker, "crash/offline", 1)
    sub.disconnect()
    pub = client(broker)
    for i in range(2000):
        pub.publish("crash/offline", b"%d" % i, qos=1)
    crash(broker)

    broker = start_process(config)
    back = resume(broker, sub_id)
    got = []
    for _ in range(2000):
        pkt = back.expect(PUBLISH)
        back.ack(pkt)
        got.append(pkt.payload)
    assert got == [b"%d" % i for i in range(2000)]


def test_an_inbound_qos2_message_is_routed_once_across_a_crash(tmp_path, start_process):
    # PUBLISH and PUBREC happened, then the broker died before PUBREL: the publisher
    # resends the PUBLISH (DUP) after the restart, and it must not be routed again.
    config = store_config(tmp_path)
    broker = start_process(config)
    sub_id, sub = persistent_subscriber(broker, "crash/q2", 2)
    sub.disconnect()
    pub_id = unique_id("pub")
    pub = client(broker, pub_id, clean=False)
    pub.send(publish_packet("crash/q2", b"once", qos=2, packet_id=7))
    assert pub.expect(PUBREC).packet_id == 7
    crash(broker)

    broker = start_process(config)
    pub = resume(broker, pub_id)
    pub.send(publish_packet("crash/q2", b"once", qos=2, packet_id=7, dup=True))
    assert pub.expect(PUBREC).packet_id == 7
    pub.send(ack_packet(PUBREL, 7))
    assert pub.expect(PUBCOMP).packet_id == 7
    pub.publish("crash/q2", b"sentinel", qos=1)
    back = resume(broker, sub_id)
    got = []
    while not got or got[-1] != b"sentinel":
        pkt = back.expect(PUBLISH)
        back.ack(pkt)
        got.append(pkt.payload)
    assert got == [b"once", b"sentinel"]


def test_an_outbound_qos2_exchange_continues_with_pubrel_after_a_crash(tmp_path, start_process):
    # The subscriber answered PUBREC and got PUBREL, then the broker died before PUBCOMP:
    # after the restart the broker sends PUBREL again, never the PUBLISH.
    config = store_config(tmp_path)
    broker = start_process(config)
    sub_id, sub = persistent_subscriber(broker, "crash/out", 2)
    pub = client(broker)
    pub.publish("crash/out", b"exactly once", qos=2)
    delivered = sub.expect(PUBLISH)
    sub.send(ack_packet(PUBREC, delivered.packet_id))
    assert sub.expect(PUBREL).packet_id == delivered.packet_id
    crash(broker)

    broker = start_process(config)
    back = resume(broker, sub_id)
    assert back.expect(PUBREL).packet_id == delivered.packet_id
    assert not back.stash  # no PUBLISH came before it
    back.send(ack_packet(PUBCOMP, delivered.packet_id))
    pub = client(broker)
    pub.publish("crash/out", b"sentinel", qos=1)
    assert back.expect(PUBLISH).payload == b"sentinel"


def test_a_retained_message_survives_kill_9(tmp_path, start_process):
    config = store_config(tmp_path)
    broker = start_process(config)
    client(broker).publish("crash/retained", b"kept", qos=1, retain=True)
    crash(broker)
    broker = start_process(config)
    late = client(broker)
    late.subscribe(("crash/#", 1))
    pkt = late.expect(PUBLISH)
    assert (pkt.topic, pkt.payload, pkt.retain) == ("crash/retained", b"kept", True)


def refused(tmp_path: Path, config: Path) -> str:
    """Start the command on `config` and expect a one-line refusal; return the line."""
    result = nautilus("--config", str(config), cwd=tmp_path)
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nautilus: "), result.stderr
    return lines[0]


def test_a_store_in_use_by_another_broker_is_refused_in_one_line(tmp_path, start_process):
    config = store_config(tmp_path)
    start_process(config)
    assert "in use by another process" in refused(tmp_path, config)


def test_a_corrupt_store_is_refused_in_one_line_and_left_alone(tmp_path, start_process):
    config = store_config(tmp_path)
    start_process(config).stop()
    messages = tmp_path / "store" / "messages"
    for manifest in messages.glob("MANIFEST-*"):
        manifest.write_bytes(b"\xffnot a manifest\x00" * 64)
    before = data_files(messages)
    assert "corrupt" in refused(tmp_path, config)
    assert data_files(messages) == before


def data_files(directory: Path) -> dict[str, bytes]:
    """The database's files, without LevelDB's own lock and info logs (LOG, LOG.old)."""
    return {
        p.name: p.read_bytes()
        for p in directory.iterdir()
        if not p.name.startswith(("LOCK", "LOG"))
    }


def test_a_store_of_the_older_layout_is_refused_in_one_line(tmp_path):
    config = store_config(tmp_path)
    (tmp_path / "store").mkdir()
    db = plyvel.DB(str(tmp_path / "store" / "messages"), create_if_missing=True)
    db.put(b"s/old-session", b"{}")
    db.close()
    assert "older Nautilus" in refused(tmp_path, config)
