"""What the relay records: every event type with its fields, as real MQTT clients (paho
3.1.1 and 5, raw sockets) cause them in a real broker with the passwd and ACL plugins; the
order of events; sampling by ACL label; payload modes.

Each scenario attaches a consumer at "latest" first, then does one MQTT step at a time
and awaits exactly the events that step causes, so order and gap-free numbering are
checked as they happen.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.broker.helpers import V5, V311, RawClient, publish_packet, unique_id

from .conftest import (
    PASSWORDS,
    UUID4,
    RelayBroker,
    Stream,
    assert_gap_free,
    fields,
    fleet_plugins,
)

to_thread = asyncio.to_thread


@pytest.fixture
def fleet(relay_broker, fleet_files):
    """Passwords required, ACL with labels, relay on; offline queues of one message."""
    return relay_broker(
        broker={"allow_anonymous": False, "max_offline_messages": 1},
        plugins=fleet_plugins(fleet_files),
    )


def peer(sock) -> dict[str, Any]:
    host, port = sock.getsockname()[:2]
    return {"peer_addr": host, "peer_port": port}


def common(event_type: str, client_id: str, username: str | None) -> dict[str, Any]:
    return {"type": event_type, "client_id": client_id, "mountpoint": "", "username": username}


def message(topic: str, qos: int, payload: bytes, retain: bool = False) -> dict[str, Any]:
    return {
        "topic": topic,
        "qos": qos,
        "retain": retain,
        "payload_size": len(payload),
        "payload": payload,
    }


class Clock:
    """ts of every event checked against the wall clock around the step that caused it."""

    def __init__(self) -> None:
        self.mark = time.time_ns()

    def step(self) -> None:
        self.mark = time.time_ns()

    def check(self, events: list[dict[str, Any]]) -> None:
        now = time.time_ns()
        for event in events:
            assert self.mark <= event["ts"] <= now, (self.mark, event, now)


# --------------------------------------------------------------------------- fields


def test_connect_subscribe_publish_deliver_unsubscribe_disconnect_fields(fleet, paho_client):
    async def scenario() -> None:
        async with await fleet.connect(start="latest") as client:
            stream = Stream(client)
            seen: list[dict[str, Any]] = []
            clock = Clock()

            async def expect(count: int) -> list[dict[str, Any]]:
                events = await stream.take(count)
                clock.check(events)
                seen.extend(events)
                clock.step()
                return events

            # A paho MQTT 3.1.1 subscriber (alice) and a paho MQTT 5 publisher (bob), whose
            # CONNECT carries a user property.
            sub = await to_thread(
                paho_client, fleet, V311, "sub-311", username="alice", password="alice-pw"
            )
            register, wakeup = await expect(2)
            assert fields(register) == {
                **common("on_register", "sub-311", "alice"),
                **peer(sub.client.socket()),
                "clean_start": True,
                "protocol_level": 4,
                "user_properties": [],
                "online": 1,
            }
            assert fields(wakeup) == common("on_client_wakeup", "sub-311", "alice")
            sub_session, sub_connected = register["session_id"], register["ts"]
            assert UUID4.match(sub_session), sub_session
            assert wakeup["session_id"] == sub_session

            pub = await to_thread(
                paho_client,
                fleet,
                V5,
                "pub-5",
                username="bob",
                password="bob-pw",
                properties={"UserProperty": [("origin", "test"), ("fleet", "north")]},
            )
            register, wakeup = await expect(2)
            assert fields(register) == {
                **common("on_register", "pub-5", "bob"),
                **peer(pub.client.socket()),
                "clean_start": True,
                "protocol_level": 5,
                "user_properties": [["origin", "test"], ["fleet", "north"]],
                "online": 2,
            }
            assert fields(wakeup) == common("on_client_wakeup", "pub-5", "bob")
            pub_session, pub_connected = register["session_id"], register["ts"]
            assert UUID4.match(pub_session) and pub_session != sub_session
            assert wakeup["session_id"] == pub_session

            # One filter allowed by the rule labelled "fleet", one refused (128).
            codes = await to_thread(sub.subscribe, [("ev/#", 2), ("secret/#", 1)])
            assert codes == [2, 128]
            (subscribe,) = await expect(1)
            assert fields(subscribe) == {
                **common("on_subscribe", "sub-311", "alice"),
                "topics": [["ev/#", 2, "fleet", "ev/#"], ["secret/#", 128, "", ""]],
            }
            assert subscribe["session_id"] == sub_session

            # QoS 0, 1, 2: on_publish (the publisher's), then on_deliver (the receiver's,
            # with the publisher's label), then on_delivery_complete for QoS 1 and 2 only.
            for qos in (0, 1, 2):
                payload = f"payload {qos}".encode()
                topic = f"ev/q{qos}"
                await to_thread(pub.publish, topic, payload, qos)
                received = await to_thread(sub.expect_message)
                assert (received.topic, received.payload, received.qos) == (topic, payload, qos)
                events = await expect(3 if qos else 2)
                assert fields(events[0]) == {
                    **common("on_publish", "pub-5", "bob"),
                    **message(topic, qos, payload),
                    "acl_name": "fleet",
                    "acl_pattern": "ev/#",
                }
                assert events[0]["session_id"] == pub_session
                delivery = {
                    **message(topic, qos, payload),
                    "acl_name": "fleet",
                    "persisted": False,
                }
                assert fields(events[1]) == {
                    **common("on_deliver", "sub-311", "alice"),
                    **delivery,
                }
                if qos:
                    assert fields(events[2]) == {
                        **common("on_delivery_complete", "sub-311", "alice"),
                        **delivery,
                    }
                assert all(e["session_id"] == sub_session for e in events[1:])

            # A pattern rule: its pattern with %c substituted; nobody subscribed, so the
            # message is dropped (Courier: the publisher's client id).
            await to_thread(pub.publish, "clients/pub-5/status", b"up", 1)
            published, dropped = await expect(2)
            assert fields(published) == {
                **common("on_publish", "pub-5", "bob"),
                **message("clients/pub-5/status", 1, b"up"),
                "acl_name": "own",
                "acl_pattern": "clients/pub-5/#",
            }
            assert fields(dropped) == {
                **common("on_message_drop", "pub-5", "bob"),
                **message("clients/pub-5/status", 1, b"up"),
                "reason": "no_matching_subscribers",
                "acl_name": "own",
            }

            # A retained publish: retain travels in on_publish.
            await to_thread(pub.publish, "plain/kept", b"r", 0, True)
            published, dropped = await expect(2)
            assert fields(published) == {
                **common("on_publish", "pub-5", "bob"),
                **message("plain/kept", 0, b"r", retain=True),
                "acl_name": "",
                "acl_pattern": "plain/#",
            }
            assert (dropped["type"], dropped["reason"]) == (
                "on_message_drop",
                "no_matching_subscribers",
            )

            assert await to_thread(sub.unsubscribe, "ev/#") == []  # MQTT 3.1.1: no codes
            (unsubscribe,) = await expect(1)
            assert fields(unsubscribe) == {
                **common("on_unsubscribe", "sub-311", "alice"),
                "topics": ["ev/#"],
            }
            assert unsubscribe["session_id"] == sub_session

            # Normal disconnects: clean sessions are gone.
            await to_thread(sub.disconnect)
            (gone,) = await expect(1)
            assert fields(gone) == {
                **common("on_client_gone", "sub-311", "alice"),
                "reason": "normal_disconnect",
                "connected_ts": sub_connected,  # how long the session lasted
                "online": 1,
            }
            assert gone["session_id"] == sub_session
            await to_thread(pub.disconnect)
            (gone,) = await expect(1)
            assert fields(gone) == {
                **common("on_client_gone", "pub-5", "bob"),
                "reason": "normal_disconnect",
                "connected_ts": pub_connected,
                "online": 0,
            }
            assert gone["session_id"] == pub_session

            assert_gap_free(seen, first=client.start)

    asyncio.run(scenario())


def test_persistent_session_offline_message_wakeup_queue_full_and_tcp_closed(fleet, paho_client):
    """A persistent session goes offline, gets an offline message, overflows its queue
    of one (queue_full), wakes up under a new session id, gets the message, and leaves
    without DISCONNECT (tcp_closed)."""

    async def scenario() -> None:
        async with await fleet.connect(start="latest") as client:
            stream = Stream(client)
            seen: list[dict[str, Any]] = []

            async def expect(count: int) -> list[dict[str, Any]]:
                events = await stream.take(count)
                seen.extend(events)
                return events

            keeper = RawClient(fleet.host, fleet.port)
            try:
                await to_thread(
                    keeper.connect, "keeper", clean=False, username="alice", password=b"alice-pw"
                )
                register, wakeup = await expect(2)
                assert fields(register) == {
                    **common("on_register", "keeper", "alice"),
                    **peer(keeper.sock),
                    "clean_start": False,
                    "protocol_level": 4,
                    "user_properties": [],
                    "online": 1,
                }
                first_session, first_connected = register["session_id"], register["ts"]
                assert await to_thread(keeper.subscribe, ("ev/keep", 1)) == [1]
                (subscribe,) = await expect(1)
                assert subscribe["topics"] == [["ev/keep", 1, "fleet", "ev/#"]]
                await to_thread(keeper.disconnect)
                (offline,) = await expect(1)
                assert fields(offline) == {
                    **common("on_client_offline", "keeper", "alice"),
                    "reason": "normal_disconnect",
                    "connected_ts": first_connected,
                    "online": 0,
                }
                assert offline["session_id"] == first_session
            finally:
                keeper.close()

            pub = await to_thread(
                paho_client, fleet, V311, "pub-311", username="bob", password="bob-pw"
            )
            await expect(2)  # its register and wakeup
            await to_thread(pub.publish, "ev/keep", b"kept", 1)
            published, queued = await expect(2)
            assert published["type"] == "on_publish"
            # Offline events carry the last connection's session id and username.
            assert fields(queued) == {
                **common("on_offline_message", "keeper", "alice"),
                **message("ev/keep", 1, b"kept"),
            }
            assert queued["session_id"] == first_session
            await to_thread(pub.publish, "ev/keep", b"overflow", 1)
            published, queued, dropped = await expect(3)
            assert (published["type"], queued["type"]) == ("on_publish", "on_offline_message")
            assert fields(dropped) == {
                **common("on_message_drop", "keeper", "alice"),
                **message("ev/keep", 1, b"overflow"),
                "reason": "queue_full",
                "acl_name": "fleet",  # the publisher's label
            }
            assert dropped["session_id"] == first_session

            back = RawClient(fleet.host, fleet.port)
            try:
                connack = await to_thread(
                    back.connect, "keeper", clean=False, username="alice", password=b"alice-pw"
                )
                assert connack.session_present
                register, wakeup, deliver = await expect(3)
                assert fields(register) == {
                    **common("on_register", "keeper", "alice"),
                    **peer(back.sock),
                    "clean_start": False,
                    "protocol_level": 4,
                    "user_properties": [],
                    "online": 2,  # pub-311 too
                }
                second_session, second_connected = register["session_id"], register["ts"]
                assert UUID4.match(second_session) and second_session != first_session
                assert wakeup["type"] == "on_client_wakeup"
                assert wakeup["session_id"] == second_session
                assert fields(deliver) == {
                    **common("on_deliver", "keeper", "alice"),
                    **message("ev/keep", 1, b"kept"),
                    "acl_name": "fleet",
                    "persisted": False,  # the memory store: nothing on disk
                }
                assert deliver["session_id"] == second_session
                queued_message = await to_thread(back.expect, 3)  # PUBLISH
                back.ack(queued_message)
                (complete,) = await expect(1)
                assert complete["type"] == "on_delivery_complete"
                assert complete["session_id"] == second_session
            finally:
                back.close()  # no DISCONNECT
            (offline,) = await expect(1)
            assert fields(offline) == {
                **common("on_client_offline", "keeper", "alice"),
                "reason": "tcp_closed",
                "connected_ts": second_connected,
                "online": 1,
            }
            assert offline["session_id"] == second_session
            assert_gap_free(seen, first=client.start)

    asyncio.run(scenario())


@pytest.mark.parametrize("version", [V311, V5], ids=["v311", "v5"])
def test_session_taken_over(fleet, paho_client, version):
    async def scenario() -> None:
        async with await fleet.connect(start="latest") as client:
            stream = Stream(client)
            first = await to_thread(
                paho_client, fleet, version, "twin", username="bob", password="bob-pw"
            )
            register, _ = await stream.take(2)
            old_session, old_connected = register["session_id"], register["ts"]
            await to_thread(paho_client, fleet, version, "twin", username="bob", password="bob-pw")
            if version == V5:
                await to_thread(first.expect_disconnected)
            gone, register, wakeup = await stream.take(3)
            assert fields(gone) == {
                **common("on_client_gone", "twin", "bob"),
                "reason": "session_taken_over",
                "connected_ts": old_connected,
                "online": 0,  # the new connection registers next
            }
            assert gone["session_id"] == old_session
            assert (register["type"], wakeup["type"]) == ("on_register", "on_client_wakeup")
            assert register["session_id"] != old_session
            assert wakeup["session_id"] == register["session_id"]

    asyncio.run(scenario())


@pytest.mark.parametrize("version", [V311, V5], ids=["v311", "v5"])
def test_bad_password_gives_on_register_failed(fleet, raw_client, paho_client, version):
    async def scenario() -> None:
        async with await fleet.connect(start="latest") as client:
            stream = Stream(client)
            intruder = raw_client(fleet, version)
            connack = await to_thread(
                intruder.connect,
                "intruder",
                expect_code=None,
                username="bob",
                password=b"not-" + PASSWORDS["bob"].encode(),
            )
            assert connack.reason_code == (0x86 if version == V5 else 4)
            (failed,) = await stream.take(1)
            assert fields(failed) == {
                **common("on_register_failed", "intruder", "bob"),
                **peer(intruder.sock),
                "clean_start": True,
                "protocol_level": version,
                "reason": "invalid_credentials",
            }
            assert UUID4.match(failed["session_id"])
            # Nothing else: the next event is the sentinel's (a good login).
            await to_thread(
                paho_client, fleet, version, "friend", username="bob", password="bob-pw"
            )
            register = await stream.next()
            assert (register["type"], register["client_id"]) == ("on_register", "friend")
            assert register["seq"] == failed["seq"] + 1

    asyncio.run(scenario())


def test_session_expiry_gives_on_session_expired(fleet, paho_client):
    async def scenario() -> None:
        async with await fleet.connect(start="latest") as client:
            stream = Stream(client)
            mortal = await to_thread(
                paho_client,
                fleet,
                V5,
                "mortal",
                username="alice",
                password="alice-pw",
                session_expiry=30,
            )
            register, _ = await stream.take(2)
            await to_thread(mortal.disconnect)
            (offline,) = await stream.take(1)
            assert fields(offline) == {
                **common("on_client_offline", "mortal", "alice"),
                "reason": "normal_disconnect",
                "connected_ts": register["ts"],
                "online": 0,
            }
            await to_thread(fleet.server.advance, 31)
            clock_end = time.time_ns()
            (expired,) = await stream.take(1)
            assert fields(expired) == common("on_session_expired", "mortal", "alice")
            assert expired["session_id"] == register["session_id"]
            assert expired["seq"] == offline["seq"] + 1
            assert offline["ts"] <= expired["ts"] <= clock_end

    asyncio.run(scenario())


# --------------------------------------------------------------------------- order


def test_one_clients_events_in_order_and_publish_before_its_deliveries(relay_broker, paho_client):
    """Many clients at once: per client, register / wakeup before subscribe before
    publish before deliver before offline / gone; each on_publish before the on_deliver
    events it caused."""
    broker: RelayBroker = relay_broker()
    subs = [paho_client(broker, V311 if i % 2 else V5) for i in range(3)]
    for sub in subs:
        assert sub.subscribe("order/#", 1) == [1]
    pubs = [paho_client(broker, V5 if i % 2 else V311) for i in range(2)]
    for round_ in range(5):
        for index, pub in enumerate(pubs):
            pub.publish(f"order/{index}", f"{index}:{round_}".encode(), 1)
    for sub in subs:
        got = {(m.topic, m.payload) for m in (sub.expect_message() for _ in range(10))}
        assert len(got) == 10
    for client in subs + pubs:
        client.disconnect()
    last_client = (subs + pubs)[-1].client_id
    events = broker.read_all(
        until=lambda e: e["type"] == "on_client_gone" and e["client_id"] == last_client
    )
    assert_gap_free(events, first=1)

    rank = {
        "on_register": 0,
        "on_client_wakeup": 1,
        "on_subscribe": 2,
        "on_publish": 3,
        "on_deliver": 3,
        "on_delivery_complete": 3,
        "on_client_offline": 4,
        "on_client_gone": 4,
    }
    by_client: dict[str, list[str]] = {}
    for event in events:
        by_client.setdefault(event["client_id"], []).append(event["type"])
    for client in subs + pubs:
        types = by_client[client.client_id]
        ranks = [rank[t] for t in types]
        assert ranks == sorted(ranks), (client.client_id, types)
        assert types[:2] == ["on_register", "on_client_wakeup"]
        assert types[-1] == "on_client_gone"
    for sub in subs:
        types = by_client[sub.client_id]
        assert types.count("on_deliver") == types.count("on_delivery_complete") == 10
    publish_seq = {
        (e["topic"], e["payload"]): e["seq"] for e in events if e["type"] == "on_publish"
    }
    assert len(publish_seq) == 10
    deliveries = [e for e in events if e["type"] == "on_deliver"]
    assert len(deliveries) == 30
    for delivery in deliveries:
        assert publish_seq[(delivery["topic"], delivery["payload"])] < delivery["seq"]
    for complete in (e for e in events if e["type"] == "on_delivery_complete"):
        matching = [
            d
            for d in deliveries
            if (d["client_id"], d["payload"]) == (complete["client_id"], complete["payload"])
        ]
        assert len(matching) == 1 and matching[0]["seq"] < complete["seq"]


# --------------------------------------------------------------------------- sampling


def publish_both(server, user: tuple[str, bytes]) -> RawClient:
    """A raw MQTT 3.1.1 publisher (logged in), to metered/x (label metered) and
    plain/x (no label) alternately, 20 each, acknowledged."""
    pub = RawClient(server.host, server.port)
    pub.connect(unique_id("pub"), username=user[0], password=user[1])
    for i in range(20):
        pub.publish("metered/x", str(i).encode(), qos=1)
        pub.publish("plain/x", str(i).encode(), qos=1)
    return pub


@pytest.mark.parametrize(("percentage", "metered_events"), [(0, 0), (100, 20)], ids=["0%", "100%"])
def test_sampling_by_acl_label(relay_broker, fleet_files, percentage, metered_events):
    broker = relay_broker(
        relay={"hooks": ["on_publish"], "sample": {"on_publish": {"metered": percentage}}},
        broker={"allow_anonymous": False},
        plugins=fleet_plugins(fleet_files),
    )
    pub = publish_both(broker, ("bob", b"bob-pw"))
    try:
        pub.publish("ev/sentinel", b"end", qos=1)
    finally:
        pub.close()
    events = broker.read_all(until=lambda e: e["topic"] == "ev/sentinel")
    assert_gap_free(events, first=1)  # a sampled-out event takes no sequence number
    assert {e["type"] for e in events} == {"on_publish"}
    metered = [e for e in events if e["topic"] == "metered/x"]
    plain = [e for e in events if e["topic"] == "plain/x"]
    assert len(metered) == metered_events
    assert all(e["acl_name"] == "metered" for e in metered)
    assert [e["payload"] for e in plain] == [str(i).encode() for i in range(20)]  # no label
    assert broker.plugin.sampled_out == 20 - metered_events


def test_sampling_deliveries_by_the_publishers_label(relay_broker, fleet_files, paho_client):
    broker = relay_broker(
        relay={
            "hooks": ["on_publish", "on_deliver", "on_delivery_complete"],
            "sample": {"on_deliver": {"metered": 0}, "on_delivery_complete": {"metered": 0}},
        },
        broker={"allow_anonymous": False},
        plugins=fleet_plugins(fleet_files),
    )
    sub = paho_client(broker, V311, username="alice", password="alice-pw")
    assert sub.subscribe([("metered/#", 1), ("plain/#", 1)]) == [1, 1]
    publish_both(broker, ("bob", b"bob-pw")).close()
    assert len([sub.expect_message() for _ in range(40)]) == 40
    sub.publish("ev/sentinel", b"end", qos=1)
    events = broker.read_all(until=lambda e: e["topic"] == "ev/sentinel")
    counts: dict[tuple[str, str], int] = {}
    for event in events:
        key = (event["type"], event["topic"])
        counts[key] = counts.get(key, 0) + 1
    assert counts == {
        ("on_publish", "metered/x"): 20,  # on_publish has no rule: all relayed
        ("on_publish", "plain/x"): 20,
        ("on_deliver", "plain/x"): 20,
        ("on_delivery_complete", "plain/x"): 20,
        ("on_publish", "ev/sentinel"): 1,
    }


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("full", {"payload_size": 5, "payload": b"hello"}),
        ("size", {"payload_size": 5, "payload": None}),
        ("none", {"payload_size": None, "payload": None}),
    ],
)
def test_payload_modes(relay_broker, raw_client, mode, expected):
    broker = relay_broker(relay={"payloads": mode})
    sub = raw_client(broker)
    sub.connect(unique_id("sub"))
    assert sub.subscribe(("pay/#", 1)) == [1]
    pub = raw_client(broker)
    pub.connect(unique_id("pub"))
    pub.publish("pay/x", b"hello", qos=1)
    sub.ack(sub.expect(3))
    sub.send(publish_packet("pay/end", b"", qos=0))

    events = broker.read_all(until=lambda e: e.get("topic") == "pay/end")
    for kind in ("on_publish", "on_deliver", "on_delivery_complete"):
        (event,) = [e for e in events if e["type"] == kind and e["topic"] == "pay/x"]
        assert {k: event[k] for k in ("payload_size", "payload")} == expected, kind

    async def welcome_payloads() -> str:
        async with await broker.connect(start=None) as client:
            return client.payloads

    assert asyncio.run(welcome_payloads()) == mode


def test_a_message_only_a_shared_group_takes_is_not_dropped(relay_broker):
    """ "No subscribers" is said of a message that matches neither a subscription nor a
    shared group (Routing.publish tells the ingress, which does not match it again)."""
    broker = relay_broker()
    sub, pub = RawClient(broker.host, broker.port), RawClient(broker.host, broker.port)
    try:
        sub.connect(unique_id("member"))
        assert sub.subscribe(("$share/g/shared/#", 1)) == [1]
        pub.connect(unique_id("pub"))
        pub.publish("shared/x", b"taken", qos=1)
        pub.publish("nobody/x", b"dropped", qos=1)
        pub.publish("shared/end", b"end", qos=1)
        events = broker.read_all(lambda e: e["type"] == "on_deliver" and e["topic"] == "shared/end")
    finally:
        sub.close()
        pub.close()
    dropped = [(e["topic"], e["reason"]) for e in events if e["type"] == "on_message_drop"]
    assert dropped == [("nobody/x", "no_matching_subscribers")]
    delivered = [e["topic"] for e in events if e["type"] == "on_deliver"]
    assert delivered == ["shared/x", "shared/end"]
