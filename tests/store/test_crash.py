"""The LevelDB store against real crashes: `python -m broker` killed with SIGKILL, then
started again on the same store path.

A PUBACK / PUBREC reaches a publisher only once what it acknowledges is on disk, so after
`kill -9` nothing acknowledged is lost: a persistent subscriber gets every message, online
or offline when the broker died (QoS 1 perhaps twice, QoS 2 never), a QoS 2 exchange goes
on where it stopped, in either direction, and retained messages are still there.
A store that cannot be used (locked by another broker, corrupt, or of an older layout)
stops start-up with one line on stderr, `nautilus: ...`, and a non-zero status.

Every wait is on an event (a packet, a log line, a process exit) with a timeout.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import plyvel
import pytest

from tests.broker.helpers import (
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    RawClient,
    ack_packet,
    publish_packet,
    unique_id,
)
from tests.test_cli import TIMEOUT, BrokerProcess, clean_env, write_config

HOST = "127.0.0.1"
REFUSAL_TIMEOUT = 10.0  # a refused start must end by itself well within this


# --------------------------------------------------------------------------- helpers


def store_config(tmp_path: Path, name: str = "nautilus.toml") -> Path:
    """A config on port 0 with the LevelDB store at tmp_path/store (same for every name)."""
    store = f'backend = "leveldb"\npath = "{tmp_path / "store"}"'
    config = write_config(tmp_path / name, store=store)
    # The default offline queue (1,000 messages) would drop part of test 2's 2,000.
    text = config.read_text(encoding="utf-8")
    config.write_text(
        text.replace("[broker]\n", "[broker]\nmax_offline_messages = 5000\n", 1),
        encoding="utf-8",
    )
    return config


def crash(broker: BrokerProcess) -> None:
    """kill -9: no shutdown code runs, only what is already on disk is left."""
    broker.proc.kill()
    broker.proc.wait(TIMEOUT)


def connect(broker: BrokerProcess, client_id: str | None = None, clean: bool = True) -> RawClient:
    raw = RawClient(HOST, broker.port)
    raw.connect(client_id or unique_id("c"), clean=clean)
    return raw


def persistent_subscriber(broker: BrokerProcess, topic: str, qos: int) -> tuple[str, RawClient]:
    """A connected subscriber with clean session off (granted `qos`) and its client id."""
    client_id = unique_id("sub")
    sub = connect(broker, client_id, clean=False)
    assert sub.subscribe((topic, qos)) == [qos]
    return client_id, sub


def resume(broker: BrokerProcess, client_id: str) -> RawClient:
    """Reconnect with clean session off; the session must have survived."""
    raw = RawClient(HOST, broker.port)
    connack = raw.connect(client_id, clean=False)
    assert connack.session_present, f"session {client_id!r} lost: {connack}"
    return raw


def publish_acknowledged(pub: RawClient, topic: str, payloads: list[bytes], window: int) -> None:
    """Publish each payload at QoS 1, `window` PUBLISHes on the wire at a time, and
    return once every one of them has its PUBACK."""
    for start in range(0, len(payloads), window):
        ids = list(range(start + 1, min(start + window, len(payloads)) + 1))
        pub.send(
            b"".join(publish_packet(topic, payloads[pid - 1], qos=1, packet_id=pid) for pid in ids)
        )
        acked = [pub.expect(PUBACK).packet_id for _ in ids]
        assert sorted(acked) == ids


def small_window_client(broker: BrokerProcess, rcvbuf: int = 2048) -> RawClient:
    """A RawClient whose socket got a small receive buffer before connecting (so a
    subscriber that never reads advertises a small TCP window)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(TIMEOUT)
    sock.connect((HOST, broker.port))
    raw = RawClient(HOST, broker.port)
    raw.sock.close()  # never sent anything: the broker just sees a connection close
    raw.sock = sock
    return raw


def refused(tmp_path: Path, config: Path) -> str:
    """Run `python -m broker --config config`, which must exit non-zero by itself with
    exactly one line on stderr, `nautilus: ...`, and no traceback; return that line."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "broker", "--config", str(config)],
        cwd=tmp_path,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=REFUSAL_TIMEOUT,
    )
    elapsed = time.monotonic() - started
    assert result.returncode != 0, (result, elapsed)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nautilus: "), result.stderr
    return lines[0]


def database_files(directory: Path) -> dict[str, bytes]:
    """The LevelDB files, without its lock file and info logs (LOCK, LOG, LOG.old)."""
    kept = (p for p in directory.iterdir() if not p.name.startswith(("LOCK", "LOG")))
    return {p.name: p.read_bytes() for p in kept}


# --------------------------------------------------------------------------- kill -9


def test_online_slow_subscriber_gets_every_acknowledged_message_after_kill_9(
    tmp_path, start_process
):
    # Connected, clean session off, subscribed at QoS 1, and never reads again: the broker
    # has 20 messages in flight to it and the rest queued in memory when it dies.
    config = store_config(tmp_path)
    broker = start_process(config)
    sub_id = unique_id("slow")
    sub = small_window_client(broker)
    sub.connect(sub_id, clean=False)
    assert sub.subscribe(("crash/online", 1)) == [1]

    pub = connect(broker)
    payloads = [b"online-%d" % i for i in range(300)]  # below the 500 high-water mark
    publish_acknowledged(pub, "crash/online", payloads, window=50)
    crash(broker)
    sub.close()
    pub.close()

    broker = start_process(config)
    back = resume(broker, sub_id)  # no SUBSCRIBE: the subscription was kept too
    got: set[bytes] = set()
    while len(got) < len(payloads):  # in-flight ones may come twice (DUP): QoS 1
        pkt = back.expect(PUBLISH)
        assert (pkt.topic, pkt.qos) == ("crash/online", 1), pkt
        back.ack(pkt)
        got.add(pkt.payload)
    assert got == set(payloads)


def test_offline_subscriber_gets_2000_acknowledged_messages_in_order_after_kill_9(
    tmp_path, start_process
):
    config = store_config(tmp_path)
    broker = start_process(config)
    sub_id = unique_id("offline")
    sub = connect(broker, sub_id, clean=False)
    assert sub.subscribe(("crash/offline", 1)) == [1]
    sub.disconnect()  # returns once the broker closed it: the session is offline

    pub = connect(broker)
    payloads = [b"offline-%d" % i for i in range(2000)]
    publish_acknowledged(pub, "crash/offline", payloads, window=200)
    crash(broker)
    pub.close()

    broker = start_process(config)
    back = resume(broker, sub_id)
    got = []
    for _ in payloads:  # nothing was in flight: each exactly once, in order
        pkt = back.expect(PUBLISH)
        assert (pkt.topic, pkt.qos, pkt.dup) == ("crash/offline", 1, False), pkt
        back.ack(pkt)
        got.append(pkt.payload)
    assert got == payloads
    back.expect_silence()  # and nothing more


def test_inbound_qos2_publish_resent_after_kill_9_is_delivered_once(tmp_path, start_process):
    # PUBLISH (id 7) -> PUBREC, then the broker dies before the PUBREL. After the restart
    # the publisher resends the PUBLISH with DUP, then PUBREL: the message is routed once.
    config = store_config(tmp_path)
    broker = start_process(config)
    sub_id, sub = persistent_subscriber(broker, "crash/in2", 2)
    sub.disconnect()

    pub_id = unique_id("pub")
    pub = connect(broker, pub_id, clean=False)
    pub.send(publish_packet("crash/in2", b"exactly once", qos=2, packet_id=7))
    assert pub.expect(PUBREC).packet_id == 7
    crash(broker)
    pub.close()

    broker = start_process(config)
    pub = resume(broker, pub_id)
    pub.send(publish_packet("crash/in2", b"exactly once", qos=2, packet_id=7, dup=True))
    assert pub.expect(PUBREC).packet_id == 7
    pub.send(ack_packet(PUBREL, 7))
    assert pub.expect(PUBCOMP).packet_id == 7
    pub.publish("crash/in2", b"sentinel", qos=1)  # queued behind anything routed before

    back = resume(broker, sub_id)
    got = []
    while not got or got[-1][0] != b"sentinel":
        pkt = back.expect(PUBLISH)
        back.ack(pkt)  # QoS 2: PUBREC, PUBREL, PUBCOMP
        got.append((pkt.payload, pkt.qos))
    assert got == [(b"exactly once", 2), (b"sentinel", 1)]


def test_outbound_qos2_resends_pubrel_not_publish_after_kill_9(tmp_path, start_process):
    # The subscriber answered PUBREC and read the broker's PUBREL but sent no PUBCOMP when
    # the broker died: after the restart the broker sends PUBREL again, never the PUBLISH.
    config = store_config(tmp_path)
    broker = start_process(config)
    sub_id, sub = persistent_subscriber(broker, "crash/out2", 2)
    pub = connect(broker)
    pub.publish("crash/out2", b"exactly once", qos=2)
    delivered = sub.expect(PUBLISH)
    assert (delivered.payload, delivered.qos) == (b"exactly once", 2)
    sub.send(ack_packet(PUBREC, delivered.packet_id))
    assert sub.expect(PUBREL).packet_id == delivered.packet_id
    crash(broker)
    sub.close()
    pub.close()

    broker = start_process(config)
    back = resume(broker, sub_id)
    first = back.read_packet()
    assert first is not None, "connection closed instead of PUBREL"
    assert (first.type, first.packet_id) == (PUBREL, delivered.packet_id), first
    back.send(ack_packet(PUBCOMP, delivered.packet_id))
    pub = connect(broker)
    pub.publish("crash/out2", b"sentinel", qos=1)
    after = back.expect(PUBLISH)  # a resent "exactly once" would come before it
    assert after.payload == b"sentinel", after


def test_outbound_qos2_unanswered_publish_is_resent_with_its_packet_id_after_kill_9(
    tmp_path, start_process
):
    # The broker sent the PUBLISH and died before the subscriber's PUBREC: after the
    # restart the same PUBLISH comes again (DUP, same packet id), and once only.
    config = store_config(tmp_path)
    broker = start_process(config)
    sub_id, sub = persistent_subscriber(broker, "crash/out1", 2)
    pub = connect(broker)
    pub.publish("crash/out1", b"exactly once", qos=2)
    delivered = sub.expect(PUBLISH)  # not answered
    crash(broker)
    sub.close()
    pub.close()

    broker = start_process(config)
    back = resume(broker, sub_id)
    again = back.expect(PUBLISH)
    assert (again.payload, again.packet_id, again.dup) == (
        b"exactly once",
        delivered.packet_id,
        True,
    ), again
    back.ack(again)  # PUBREC, PUBREL, PUBCOMP
    pub = connect(broker)
    pub.publish("crash/out1", b"sentinel", qos=1)
    assert back.expect(PUBLISH).payload == b"sentinel"


def test_retained_message_survives_kill_9(tmp_path, start_process):
    config = store_config(tmp_path)
    broker = start_process(config)
    pub = connect(broker)
    pub.publish("crash/retained", b"kept", qos=1, retain=True)  # waits for the PUBACK
    crash(broker)
    pub.close()

    broker = start_process(config)
    late = connect(broker)
    assert late.subscribe(("crash/#", 1)) == [1]
    pkt = late.expect(PUBLISH)
    assert (pkt.topic, pkt.payload, pkt.qos, pkt.retain) == ("crash/retained", b"kept", 1, True)


# --------------------------------------------------------------------------- refusals


def test_store_locked_by_a_running_broker_is_refused_in_one_line(tmp_path, start_process):
    first = start_process(store_config(tmp_path))
    second = store_config(tmp_path, "second.toml")  # its own ephemeral port, same store
    line = refused(tmp_path, second)
    assert "in use by another process" in line, line
    assert str(tmp_path / "store") in line, line
    # The first broker is unharmed and still serves on its store.
    client = connect(first)
    client.publish("locked/still", b"works", qos=1)
    assert first.proc.poll() is None


@pytest.mark.parametrize("damaged", ["MANIFEST-*", "CURRENT"])
def test_corrupt_store_is_refused_in_one_line_and_left_alone(tmp_path, start_process, damaged):
    config = store_config(tmp_path)
    broker = start_process(config)
    connect(broker).publish("corrupt/r", b"on disk", qos=1, retain=True)
    assert broker.stop() == 0
    messages = tmp_path / "store" / "messages"
    targets = sorted(messages.glob(damaged))
    assert targets, sorted(p.name for p in messages.iterdir())
    for target in targets:
        target.write_bytes(b"\xffthis is no LevelDB file\x00" * 40)
    before = database_files(messages)

    line = refused(tmp_path, config)
    assert "corrupt" in line, line
    assert database_files(messages) == before  # "nothing was changed"


def test_store_of_the_older_layout_is_refused_in_one_line(tmp_path):
    config = store_config(tmp_path)
    (tmp_path / "store").mkdir()
    path = str(tmp_path / "store" / "messages")
    db = plyvel.DB(path, create_if_missing=True)
    db.put(b"s/x", b"{}")  # a layout-1 session record, and no b"v" key
    db.close()

    line = refused(tmp_path, config)
    assert "older Nautilus" in line, line
    db = plyvel.DB(path)
    try:  # refused, not upgraded: the old data is as it was
        assert dict(db.iterator()) == {b"s/x": b"{}"}
    finally:
        db.close()


def test_a_mountpoints_session_and_retained_message_survive_kill_9(tmp_path, start_process):
    # A mountpoint's session keys are framed in the store (broker/store/leveldb.py), a
    # retained message finds its tree from its key: both as they were after the crash.
    config = store_config(tmp_path)
    text = config.read_text(encoding="utf-8")
    config.write_text(
        text.replace('address = "127.0.0.1:0"\n', 'address = "127.0.0.1:0"\nmountpoint = "t-a"\n'),
        encoding="utf-8",
    )
    broker = start_process(config)
    sub_id = unique_id("tree")
    sub = connect(broker, sub_id, clean=False)
    assert sub.subscribe(("crash/tree", 1)) == [1]
    sub.disconnect()
    pub = connect(broker)
    payloads = [b"tree-%d" % i for i in range(500)]
    publish_acknowledged(pub, "crash/tree", payloads, window=100)
    pub.send(publish_packet("crash/kept", b"retained", qos=1, packet_id=1, retain=True))
    assert pub.expect(PUBACK).packet_id == 1
    crash(broker)
    pub.close()
    db = plyvel.DB(str(tmp_path / "store" / "messages"))
    try:  # the tree's names, as the store keeps them
        assert db.get(b"s/t-a\0" + sub_id.encode()) is not None
        assert any(True for _ in db.iterator(prefix=b"q/\0t-a\0" + sub_id.encode() + b"\0"))
        assert db.get(b"r/\0t-a/crash/kept") is not None
    finally:
        db.close()

    broker = start_process(config)
    back = resume(broker, sub_id)
    got = []
    for _ in payloads:
        pkt = back.expect(PUBLISH)
        assert (pkt.topic, pkt.qos) == ("crash/tree", 1), pkt
        back.ack(pkt)
        got.append(pkt.payload)
    assert got == payloads
    fresh = connect(broker)
    assert fresh.subscribe(("crash/#", 1)) == [1]
    kept = fresh.expect(PUBLISH)
    assert (kept.topic, kept.payload, kept.retain) == ("crash/kept", b"retained", True)
