"""Several connections on one client id: `allow_multiple_sessions` with
`queue_deliver_mode` fanout (every connection gets each message) or balance (one does)."""

from __future__ import annotations

import random
import time

import pytest

from .helpers import (
    PUBLISH,
    SESSION_EXPIRY_INTERVAL,
    TIMEOUT,
    V5,
    V311,
    VERSIONS,
    WillSpec,
    unique_id,
)
from .test_shared import collect, publish_all


def persistent(version: int) -> dict:
    return {"clean": False, "session_expiry": 300} if version == V5 else {"clean": False}


@pytest.fixture
def fanout(start_broker):
    return start_broker(broker={"allow_multiple_sessions": True})


@pytest.fixture
def balance(start_broker):
    return start_broker(broker={"allow_multiple_sessions": True, "queue_deliver_mode": "balance"})


@pytest.mark.parametrize("version", VERSIONS)
def test_without_the_setting_a_second_connection_takes_over(broker, paho_client, version):
    client_id = unique_id()
    first = paho_client(broker, version, client_id)
    paho_client(broker, version, client_id)
    first.expect_disconnected()


@pytest.mark.parametrize("version", VERSIONS)
def test_fanout_every_connection_gets_every_message(fanout, paho_client, version):
    client_id = unique_id()
    first = paho_client(fanout, version, client_id)
    second = paho_client(fanout, version, client_id)
    assert first.subscribe("jobs/#", 1) == [1]  # one subscription for the client id
    payloads = publish_all(paho_client(fanout, version), "jobs/a", 5)
    assert collect([first], 5) == [payloads]
    assert collect([second], 5) == [payloads]


@pytest.mark.parametrize("version", VERSIONS)
def test_balance_each_message_goes_to_one_connection(balance, paho_client, version):
    client_id = unique_id()
    members = [paho_client(balance, version, client_id) for _ in range(2)]
    members[0].subscribe("jobs/#", 1)
    payloads = publish_all(paho_client(balance, version), "jobs/a", 40)
    first, second = collect(members, 40)
    assert sorted(first + second) == sorted(payloads)  # each exactly once
    assert first and second


@pytest.mark.parametrize("version", VERSIONS)
def test_joining_connection_sees_session_present_and_clean_start_is_ignored(
    fanout, paho_client, version
):
    client_id = unique_id()
    first = paho_client(fanout, version, client_id)
    first.subscribe("t", 1)
    second = paho_client(fanout, version, client_id, connect=False)
    assert second.connect(clean=True).session_present  # the others' queue is kept
    paho_client(fanout, version).publish("t", b"x", 1)
    assert second.expect_message().payload == b"x"
    assert first.expect_message().payload == b"x"


@pytest.mark.parametrize("version", VERSIONS)
def test_balance_unacked_message_goes_to_the_remaining_connection(
    balance, raw_client, paho_client, version
):
    client_id = unique_id()
    props = {SESSION_EXPIRY_INTERVAL: 300} if version == V5 else None
    silent = raw_client(balance, version)  # never acknowledges
    silent.connect(client_id, clean=False, properties=props)
    assert silent.subscribe(("work", 1)) == [1]
    publisher = paho_client(balance, version)
    publisher.publish("work", b"job-1", 1)  # the only connection gets it
    assert silent.expect(PUBLISH).payload == b"job-1"
    other = paho_client(balance, version, client_id, **persistent(version))
    silent.close()  # gone without PUBACK
    msg = other.expect_message()
    assert (msg.payload, msg.qos) == (b"job-1", 1)
    other.expect_no_message()


@pytest.mark.parametrize("version", VERSIONS)
def test_last_connection_gone_queues_for_the_next(fanout, raw_client, paho_client, version):
    client_id = unique_id()
    props = {SESSION_EXPIRY_INTERVAL: 300} if version == V5 else None
    first = paho_client(fanout, version, client_id, **persistent(version))
    first.subscribe("t", 1)
    silent = raw_client(fanout, version)
    silent.connect(client_id, clean=False, properties=props)
    publisher = paho_client(fanout, version)
    publisher.publish("t", b"seen-by-both", 1)
    assert first.expect_message().payload == b"seen-by-both"
    assert silent.expect(PUBLISH).payload == b"seen-by-both"
    first.disconnect()
    silent.close()  # the last one leaves with one message unacknowledged
    publisher.publish("t", b"while-offline", 1)
    back = paho_client(fanout, version, client_id, **persistent(version))
    got = [back.expect_message().payload, back.expect_message().payload]
    assert got == [b"seen-by-both", b"while-offline"]
    back.expect_no_message()


@pytest.mark.parametrize("version", VERSIONS)
def test_will_of_one_connection_is_published_while_others_stay(
    fanout, raw_client, paho_client, version
):
    client_id = unique_id()
    watcher = paho_client(fanout, version)
    watcher.subscribe("wills/#", 1)
    staying = paho_client(fanout, version, client_id)
    leaving = raw_client(fanout, version)
    leaving.connect(client_id, will=WillSpec("wills/x", b"gone", 1))
    leaving.close()  # network loss: the will is due
    assert watcher.expect_message().payload == b"gone"
    staying.subscribe("t", 0)  # the other connection is still served
    paho_client(fanout, version).publish("t", b"still-here", 0)
    assert staying.expect_message().payload == b"still-here"


def test_a_client_id_with_two_connections_is_one_online_session(fanout, paho_client):
    client_id = unique_id()
    paho_client(fanout, V5, client_id)
    paho_client(fanout, V5, client_id)
    online = fanout.call(lambda: [s.online for s in fanout.broker.registry.values()])
    assert online == [True]


def test_offline_queue_survives_a_restart_with_leveldb(start_broker, paho_client, tmp_path):
    sections = {
        "broker": {"allow_multiple_sessions": True, "queue_deliver_mode": "balance"},
        "store": {"backend": "leveldb", "path": str(tmp_path / "db")},
    }
    server = start_broker(**sections)
    client_id = unique_id()
    clients = [paho_client(server, V5, client_id, **persistent(V5)) for _ in range(2)]
    clients[0].subscribe("t", 1)
    for client in clients:
        client.disconnect()
    payloads = publish_all(paho_client(server, V5), "t", 3)
    server.stop()
    server = start_broker(**sections)
    back = paho_client(server, V5, client_id, **persistent(V5))
    assert collect([back], 3) == [payloads]


@pytest.mark.parametrize("mode", ["fanout", "balance"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_message_is_lost_while_connections_come_and_go(
    start_broker, raw_client, paho_client, mode, seed
):
    """At least once for the client id, whatever its connections do: a random run of
    publishes, joins, abrupt closes (with messages unread) and reads; in the end one
    connection collects everything that was not acknowledged."""
    server = start_broker(broker={"allow_multiple_sessions": True, "queue_deliver_mode": mode})
    rng = random.Random(seed)
    client_id = unique_id("churn")
    received: set[bytes] = set()

    def join():
        client = raw_client(server, V311)
        client.connect(client_id, clean=False)
        return client

    connected = [join()]
    assert connected[0].subscribe(("churn/t", 1)) == [1]
    publisher = paho_client(server, V311)
    published = []
    for step in range(60):
        action = rng.choice(["publish", "publish", "publish", "join", "close", "read"])
        if action == "publish" or not connected:
            payload = b"m%d" % step
            publisher.publish("churn/t", payload, 1)
            published.append(payload)
        elif action == "join" and len(connected) < 3:
            connected.append(join())
        elif action == "close":
            connected.pop(rng.randrange(len(connected))).close()
        else:
            received.update(rng.choice(connected).ack_available())
    for client in connected:
        client.close()
    last = join()
    deadline = time.monotonic() + TIMEOUT
    while not set(published) <= received:
        assert time.monotonic() < deadline, f"lost: {sorted(set(published) - received)}"
        received.update(last.ack_available())
