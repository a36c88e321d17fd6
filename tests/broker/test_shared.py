"""Shared subscriptions `$share/<group>/<filter>` (MQTT 5 section 4.8.2; VerneMQ also
offers them to MQTT 3.1.1 clients): one member of each group gets each message."""

from __future__ import annotations

import contextlib
import queue
import random
import time

import pytest

from .helpers import (
    DISCONNECT,
    PUBLISH,
    QUIET,
    SESSION_EXPIRY_INTERVAL,
    TIMEOUT,
    V5,
    V311,
    VERSIONS,
    subscribe_packet,
    unique_id,
)

SHARED_SUBSCRIPTION_AVAILABLE = 0x2A
TOPIC_FILTER_INVALID = 0x8F
PROTOCOL_ERROR = 0x82


def collect(clients, count: int) -> list[list[bytes]]:
    """Payloads received by each client until `count` arrived in all, then a quiet
    period in which nothing more may arrive (each message goes to one member only)."""
    got: list[list[bytes]] = [[] for _ in clients]
    deadline = time.monotonic() + TIMEOUT
    while sum(map(len, got)) < count:
        assert time.monotonic() < deadline, f"only {sum(map(len, got))} of {count} arrived"
        for i, client in enumerate(clients):
            with contextlib.suppress(queue.Empty):
                got[i].append(client.messages.get(timeout=0.02).payload)
    for client in clients:
        client.expect_no_message(QUIET / len(clients))
    return got


def publish_all(publisher, topic: str, count: int, qos: int = 1) -> list[bytes]:
    payloads = [b"m%d" % i for i in range(count)]
    for payload in payloads:
        publisher.publish(topic, payload, qos)
    return payloads


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("policy", ["random", "prefer_local", "local_only", "round_robin"])
def test_messages_are_split_between_members(start_broker, paho_client, version, policy):
    server = start_broker(broker={"shared_subscription_policy": policy})
    members = [paho_client(server, version) for _ in range(2)]
    for member in members:
        assert member.subscribe("$share/g/jobs/+", 1) == [1]
    publisher = paho_client(server, version)
    payloads = publish_all(publisher, "jobs/a", 20)
    first, second = collect(members, 20)
    assert sorted(first + second) == sorted(payloads)  # each exactly once
    assert first and second
    if policy == "round_robin":
        assert first == payloads[0::2]
        assert second == payloads[1::2]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_group_and_normal_subscriber_gets_every_message(broker, paho_client, version):
    a, b, c, normal = (paho_client(broker, version) for _ in range(4))
    a.subscribe("$share/one/t/#", 1)
    b.subscribe("$share/one/t/#", 1)
    c.subscribe("$share/two/t/#", 1)
    normal.subscribe("t/#", 1)
    payloads = publish_all(paho_client(broker, version), "t/x", 10)
    first, second = collect([a, b], 10)
    assert sorted(first + second) == sorted(payloads)
    assert collect([c], 10) == [payloads]
    assert collect([normal], 10) == [payloads]


@pytest.mark.parametrize("version", VERSIONS)
def test_offline_member_is_used_only_when_none_is_online(broker, paho_client, version):
    offline_id = unique_id("offline")
    kw = {"session_expiry": 300} if version == V5 else {}
    offline = paho_client(broker, version, offline_id, clean=False, **kw)
    offline.subscribe("$share/g/t", 1)
    offline.disconnect()
    online = paho_client(broker, version)
    online.subscribe("$share/g/t", 1)
    publisher = paho_client(broker, version)
    payloads = publish_all(publisher, "t", 5)
    assert collect([online], 5) == [payloads]
    online.disconnect()  # a clean session: it leaves the group
    later = publish_all(publisher, "t", 3)
    offline = paho_client(broker, version, offline_id, clean=False, **kw)
    assert collect([offline], 3) == [later]


@pytest.mark.parametrize("version", VERSIONS)
def test_no_retained_messages_on_shared_subscribe(broker, paho_client, version):
    publisher = paho_client(broker, version)
    publisher.publish("r/t", b"kept", 1, retain=True)
    member = paho_client(broker, version)
    assert member.subscribe("$share/g/r/#", 1) == [1]
    member.expect_no_message()
    normal = paho_client(broker, version)
    normal.subscribe("r/#", 1)
    assert normal.expect_message().payload == b"kept"
    publisher.publish("r/t", b"live", 1)
    assert member.expect_message().payload == b"live"


@pytest.mark.parametrize("version", VERSIONS)
def test_unsubscribe_leaves_the_group(broker, paho_client, version):
    a, b = paho_client(broker, version), paho_client(broker, version)
    a.subscribe("$share/g/t", 1)
    b.subscribe("$share/g/t", 1)
    codes = a.unsubscribe("$share/g/t")
    if version == V5:
        assert codes == [0]
        assert a.unsubscribe("$share/g/t") == [0x11]  # no subscription existed
    payloads = publish_all(paho_client(broker, version), "t", 6)
    assert collect([a, b], 6) == [[], payloads]
    b.unsubscribe("$share/g/t")
    publish_all(paho_client(broker, version), "t", 1)
    a.expect_no_message()
    b.expect_no_message()
    assert broker.call(lambda: broker.broker.router.group_count) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_invalid_share_names(broker, raw_client, version):
    client = raw_client(broker, version)
    client.connect(unique_id())
    bad = ["$share/g", "$share/g/", "$share//t", "$share/g+/t", "$share/#/t", "$share/g/a/#/b"]
    codes = client.subscribe(*[(f, 1) for f in bad], ("$share/g/ok/+", 1))
    failure = TOPIC_FILTER_INVALID if version == V5 else 0x80
    assert codes == [failure] * len(bad) + [1]


def test_v5_suback_grants_qos_and_subscription_ids_work(broker, paho_client):
    member = paho_client(broker, V5)
    assert member.subscribe("$share/g/s/+", 2, sub_id=7) == [2]
    assert member.subscribe("$share/g/q0", 0) == [0]
    publisher = paho_client(broker, V5)
    publisher.publish("s/1", b"x", 1)
    msg = member.expect_message()
    assert (msg.payload, msg.qos, msg.subscription_ids) == (b"x", 1, [7])


def test_no_local_on_shared_subscription_is_a_protocol_error(broker, raw_client):
    client = raw_client(broker, V5)
    client.connect(unique_id(), version=V5)
    client.send(subscribe_packet(1, [("$share/g/t", 0x04 | 1)], version=V5))
    packets = client.expect_closed()
    assert [(p.type, p.reason_code) for p in packets] == [(DISCONNECT, PROTOCOL_ERROR)]


def test_connack_announces_shared_subscriptions(broker, raw_client):
    client = raw_client(broker, V5)
    connack = client.connect(unique_id(), version=V5)
    # Absent means available [MQTT-3.2.2.3.15]; it must not say 0.
    assert connack.properties.get(SHARED_SUBSCRIPTION_AVAILABLE, 1) == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_unacked_message_goes_to_another_member_when_a_session_ends(
    start_broker, raw_client, paho_client, version
):
    server = start_broker(broker={"shared_subscription_policy": "round_robin"})
    silent = raw_client(server, version)  # never acknowledges
    props = {SESSION_EXPIRY_INTERVAL: 0} if version == V5 else None
    silent.connect(unique_id("silent"), clean=True, properties=props)
    assert silent.subscribe(("$share/g/work", 1)) == [1]
    other = paho_client(server, version)
    assert other.subscribe("$share/g/work", 1) == [1]
    publisher = paho_client(server, version)
    publisher.publish("work", b"job-1", 1)  # round robin: the first member, the silent one
    pkt = silent.expect(PUBLISH)
    assert (pkt.payload, pkt.qos) == (b"job-1", 1)
    other.expect_no_message()
    silent.close()  # gone without PUBACK; its clean session ends
    msg = other.expect_message()
    assert (msg.payload, msg.qos) == (b"job-1", 1)
    other.expect_no_message()


def test_v311_client_may_share(broker, paho_client):
    member = paho_client(broker, V311)
    assert member.subscribe("$share/g/a/b", 1) == [1]
    paho_client(broker, V5).publish("a/b", b"hello", 1)
    assert member.expect_message().payload == b"hello"


@pytest.mark.parametrize("version", VERSIONS)
def test_register_modifier_sets_the_publishers_own_policy(start_broker, paho_client, version):
    # VerneMQ's shared_subscription_policy modifier applies to what that client publishes.
    round_robin = {"shared_subscription_policy": "round_robin"}
    answer = {"result": "ok", "modifiers": round_robin, "client_id": "rr-publisher"}
    server = start_broker(
        broker={"shared_subscription_policy": "random", "allow_anonymous": False},
        plugins={
            "rec": {
                "enabled": True,
                "module": "tests.hooks.sample:Recorder",
                "hooks": ["auth_on_register", "auth_on_register_m5"],
                "answers": {"auth_on_register": [answer, "ok"]},
            }
        },
    )
    members = [paho_client(server, version) for _ in range(2)]
    for member in members:
        member.subscribe("$share/g/jobs", 1)
    payloads = publish_all(paho_client(server, version, "rr-publisher"), "jobs", 20)
    first, second = collect(members, 20)
    assert sorted([first, second]) == sorted([payloads[0::2], payloads[1::2]])


def test_restored_queue_still_hands_shared_messages_to_the_group(
    start_broker, paho_client, tmp_path
):
    """A shared message waiting in an offline member's stored queue goes to another member
    when that session ends, after a restart too."""
    sections = {"store": {"backend": "leveldb", "path": str(tmp_path / "db")}}
    server = start_broker(**sections)
    member_id = unique_id("member")
    member = paho_client(server, V5, member_id, clean=False, session_expiry=300)
    member.subscribe("$share/g/work", 1)
    member.disconnect()
    paho_client(server, V5).publish("work", b"job-1", 1)  # only the offline member's queue
    server.stop()
    server = start_broker(**sections)
    other = paho_client(server, V5)
    other.subscribe("$share/g/work", 1)
    other.expect_no_message()
    paho_client(server, V5, member_id, clean=True)  # ends the stored session
    msg = other.expect_message()
    assert (msg.payload, msg.qos) == (b"job-1", 1)


@pytest.mark.parametrize("policy", ["random", "round_robin"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_message_is_lost_while_members_come_and_go(
    start_broker, raw_client, paho_client, policy, seed
):
    """At least once for the group while it has a member: a random run of publishes,
    members joining, members leaving abruptly with messages unread (their clean sessions
    end, the unacknowledged messages go to another member) and reads."""
    server = start_broker(broker={"shared_subscription_policy": policy})
    rng = random.Random(seed)
    received: set[bytes] = set()

    def join():
        member = raw_client(server, V311)
        member.connect(unique_id("member"))
        assert member.subscribe(("$share/g/churn", 1)) == [1]
        return member

    members = [join()]
    publisher = paho_client(server, V311)
    published = []
    for step in range(60):
        action = rng.choice(["publish", "publish", "publish", "join", "leave", "read"])
        if action == "join" and len(members) < 3:
            members.append(join())
        elif action == "leave" and len(members) > 1:
            members.pop(rng.randrange(len(members))).close()
        elif action == "read":
            received.update(rng.choice(members).ack_available())
        else:
            payload = b"m%d" % step
            publisher.publish("churn", payload, 1)
            published.append(payload)
    deadline = time.monotonic() + TIMEOUT
    while not set(published) <= received:
        assert time.monotonic() < deadline, f"lost: {sorted(set(published) - received)}"
        for member in members:
            received.update(member.ack_available())
