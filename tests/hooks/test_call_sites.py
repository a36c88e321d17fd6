"""Every hook, end to end: a real broker, real clients, and the Recorder plugin (sample.py).

Each test checks that a hook fires at the right point with the right context (the `_m5`
variant for MQTT 5 clients) and that the broker does what the hook's answer says. The
rules are VerneMQ's (vmq_mqtt_fsm.erl / vmq_mqtt5_fsm.erl; shared/reference/vernemq.md
section 1). Waiting is on events: the Recorder's calls, a packet, or a sentinel message
that must arrive first if an unwanted one is not there. Event hooks fired before an
answer the broker sends (CONNACK, SUBACK, PUBREL) are checked as soon as that arrives.
"""

from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.broker.helpers import (
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SESSION_EXPIRY_INTERVAL,
    V5,
    V31,
    V311,
    VERSIONS,
    WillSpec,
    ack_packet,
    publish_packet,
    unique_id,
)

from .sample import Recorder

RECORDER = "tests.hooks.sample:Recorder"
USER_PROPERTY = 0x26
NOT_AUTHORIZED = {V311: 5, V5: 0x87}


def start(start_broker, broker: dict | None = None, **recorder) -> tuple:
    """A broker with the Recorder as its one plugin; returns (server, recorder)."""
    server = start_broker(
        broker=broker or {},
        plugins={"rec": {"enabled": True, "module": RECORDER, **recorder}},
    )
    plugin = dict(server.broker.plugins)["rec"]
    assert isinstance(plugin, Recorder)
    return server, plugin


def hook(name: str, version: int) -> str:
    """The hook a client of this version triggers: `name` or its `_m5` variant."""
    return f"{name}_m5" if version == V5 else name


def persistent(version: int, expiry: int = 60) -> dict:
    """RawClient.connect arguments for a session that outlives its connection."""
    return {
        "clean": False,
        "properties": {SESSION_EXPIRY_INTERVAL: expiry} if version == V5 else {},
    }


def sentinel_first(sub, sentinel: bytes) -> None:
    """The next message `sub` gets is the sentinel: nothing unwanted came before it."""
    msg = sub.expect_message()
    assert msg.payload == sentinel, f"expected only the sentinel, got {msg}"


# -- auth_on_register, on_register, on_register_failed ------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_auth_on_register_is_skipped_when_anonymous_is_allowed(start_broker, paho_client, version):
    server, rec = start(start_broker, {"allow_anonymous": True})
    client = paho_client(server, version)
    # on_register and on_client_wakeup fire before CONNACK; auth_on_register never did.
    assert rec.names(client_id=client.client_id) == [
        hook("on_register", version),
        "on_client_wakeup",
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_auth_on_register_context(start_broker, raw_client, version):
    server, rec = start(start_broker, {"allow_anonymous": False})
    raw = raw_client(server, version)
    client_id = unique_id("reg")
    props = {SESSION_EXPIRY_INTERVAL: 30} if version == V5 else None
    raw.connect(
        client_id, username="alice", password=b"s3cret", clean=True, properties=props, keepalive=30
    )
    ctx = rec.wait(hook("auth_on_register", version), client_id=client_id)
    assert (ctx.username, ctx.password, ctx.clean_start) == ("alice", b"s3cret", True)
    assert ctx.protocol_level == version
    assert ctx.peer == raw.sock.getsockname()[:2]
    if version == V5:
        assert ctx.properties[SESSION_EXPIRY_INTERVAL] == 30
    # VerneMQ's order at CONNECT: auth_on_register -> on_register -> on_client_wakeup.
    assert rec.names(client_id=client_id) == [
        hook("auth_on_register", version),
        hook("on_register", version),
        "on_client_wakeup",
    ]
    registered = rec.wait(hook("on_register", version), client_id=client_id)
    assert registered.username == "alice"
    assert registered.password is None  # only auth_on_register sees the password


REFUSALS = [
    # (answer, MQTT 3.1.1 CONNACK code, MQTT 5 reason code, on_register_failed reason)
    pytest.param("error", 5, 0x87, "not_authorized", id="error"),
    pytest.param(
        {"result": "error", "reason": "invalid_credentials"},
        4,
        0x86,
        "invalid_credentials",
        id="invalid_credentials",
    ),
    pytest.param(
        {"result": "error", "reason": "banned", "reason_code": 0x8A}, 5, 0x8A, "banned", id="0x8A"
    ),
    pytest.param("next", 5, 0x87, "plugin_chain_exhausted", id="exhausted"),
    pytest.param("raise", 5, 0x87, "plugin_crashed", id="crash"),
    pytest.param("none", 5, 0x87, "plugin_chain_exhausted", id="None-is-next"),
    pytest.param(
        {"modifiers": {"no_such_modifier": 1}}, 5, 0x87, "invalid_modifiers", id="bad-modifier"
    ),
    pytest.param(
        {"modifiers": {"upgrade_qos": True}}, 5, 0x87, "invalid_modifiers", id="unsupported"
    ),
]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("answer", "v3_code", "v5_code", "reason"), REFUSALS)
def test_a_refused_register(start_broker, raw_client, version, answer, v3_code, v5_code, reason):
    server, rec = start(
        start_broker, {"allow_anonymous": False}, answers={"auth_on_register": answer}
    )
    raw = raw_client(server, version)
    client_id = unique_id("refused")
    connack = raw.connect(client_id, username="mallory", password=b"guess", expect_code=None)
    assert connack.reason_code == (v5_code if version == V5 else v3_code)
    assert raw.expect_closed() == []
    failed = rec.wait("on_register_failed", client_id=client_id)
    assert (failed.reason, failed.username) == (reason, "mallory")
    assert rec.names(client_id=client_id) == [
        hook("auth_on_register", version),
        "on_register_failed",
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_none_lets_the_next_plugin_decide(start_broker, raw_client, version):
    def plugin(answer: str) -> dict:
        return {
            "enabled": True,
            "module": RECORDER,
            "hooks": ["auth_on_register"],
            "answers": {"auth_on_register": answer},
        }

    server = start_broker(
        broker={"allow_anonymous": False},
        plugins={"silent": plugin("none"), "judge": plugin("ok")},
    )
    client_id = unique_id("none")
    raw_client(server, version).connect(client_id)  # CONNACK 0: "judge" allowed it
    plugins = dict(server.broker.plugins)
    for name in ("silent", "judge"):  # the v4 method serves MQTT 5 clients too
        plugins[name].wait("auth_on_register", client_id=client_id)


@pytest.mark.parametrize("version", VERSIONS)
def test_on_register_failed_does_not_carry_the_password(start_broker, raw_client, version):
    # Events reach the event relay and its sidecars; Courier's on_register_failed is
    # (Peer, SubscriberId, User, CleanSession, Reason): no password, as on_register.
    server, rec = start(
        start_broker, {"allow_anonymous": False}, answers={"auth_on_register": "error"}
    )
    raw = raw_client(server, version)
    client_id = unique_id("leak")
    raw.connect(client_id, username="u", password=b"almost-right", expect_code=None)
    assert rec.wait("on_register_failed", client_id=client_id).password is None


@pytest.mark.parametrize("version", VERSIONS)
def test_no_auth_on_register_implementation_refuses(start_broker, raw_client, version):
    # VerneMQ: no_matching_hook_found -> CONNACK 5 (not authorized).
    server, rec = start(start_broker, {"allow_anonymous": False}, hooks=["on_register_failed"])
    raw = raw_client(server, version)
    client_id = unique_id("nohook")
    assert raw.connect(client_id, expect_code=None).reason_code == NOT_AUTHORIZED[version]
    assert rec.wait("on_register_failed", client_id=client_id).reason == "no_matching_hook_found"


def test_an_mqtt5_only_reason_code_is_not_authorized_for_mqtt311(start_broker, raw_client):
    # MQTT 3.1.1 CONNACK has codes 1-5 only [MQTT-3.2.2.3]; any other refusal is 5.
    answer = {"result": "error", "reason": "quota", "reason_code": 0x97}
    server, _ = start(
        start_broker, {"allow_anonymous": False}, answers={"auth_on_register": answer}
    )
    raw = raw_client(server, V311)
    assert raw.connect(unique_id(), expect_code=None).reason_code == 5


@pytest.mark.parametrize("version", VERSIONS)
def test_register_username_rewrite_is_seen_by_later_hooks(start_broker, raw_client, version):
    answers = {"auth_on_register": {"modifiers": {"username": "bob"}}}
    server, rec = start(start_broker, {"allow_anonymous": False}, answers=answers)
    raw = raw_client(server, version)
    client_id = unique_id("rename")
    raw.connect(client_id, username="alice", password=b"pw")
    assert rec.wait(hook("auth_on_register", version), client_id=client_id).username == "alice"
    raw.subscribe(("who/#", 1))
    raw.publish("who/1", b"x", qos=1)
    for name in ("on_register", "auth_on_subscribe", "on_subscribe", "auth_on_publish"):
        assert rec.wait(hook(name, version), client_id=client_id).username == "bob", name
    assert rec.wait("on_client_wakeup", client_id=client_id).username == "bob"
    assert rec.wait(hook("on_publish", version), client_id=client_id).username == "bob"


@pytest.mark.parametrize("version", VERSIONS)
def test_register_max_inflight_messages_is_applied(start_broker, raw_client, paho_client, version):
    sub_id = unique_id("window")
    answers = {
        "auth_on_register": [{"client_id": sub_id, "modifiers": {"max_inflight_messages": 1}}]
    }
    server, _ = start(start_broker, {"allow_anonymous": False}, answers=answers)
    sub = raw_client(server, version)
    sub.connect(sub_id)
    sub.subscribe(("win/#", 1))
    pub = paho_client(server, version)
    for i in range(3):
        pub.publish("win/t", f"m{i}".encode(), qos=1)  # routed once the PUBACK is back

    first = sub.expect(PUBLISH)
    assert first.payload == b"m0"
    session = server.broker.registry[sub_id]
    assert server.call(lambda: (len(session.inflight), len(session.queue))) == (1, 2)
    sub.ack(first)
    second = sub.expect(PUBLISH)
    sub.ack(second)
    third = sub.expect(PUBLISH)
    assert (second.payload, third.payload) == (b"m1", b"m2")
    # Without the modifier the broker's window (max_inflight_messages = 20) applies.
    other = raw_client(server, version)
    other_id = unique_id("nowindow")
    other.connect(other_id)
    assert server.call(lambda: server.broker.registry[other_id].window.size) == 20


@pytest.mark.parametrize("version", VERSIONS)
def test_the_will_is_checked_with_auth_on_publish_at_connect(start_broker, raw_client, version):
    answers = {"auth_on_publish": [{"topic": "will/refused", "result": "error"}]}
    server, rec = start(start_broker, answers=answers)  # anonymous: only the will is checked
    refused = raw_client(server, version)
    refused_id = unique_id("will-no")
    connack = refused.connect(
        refused_id, will=WillSpec("will/refused", b"bye", qos=1), expect_code=None
    )
    assert connack.reason_code == NOT_AUTHORIZED[version]
    assert refused.expect_closed() == []

    accepted = raw_client(server, version)
    accepted_id = unique_id("will-yes")
    accepted.connect(accepted_id, will=WillSpec("will/ok", b"bye", qos=2, retain=True))
    ctx = rec.wait(hook("auth_on_publish", version), client_id=accepted_id)
    assert (ctx.topic, ctx.payload, ctx.qos, ctx.retain) == ("will/ok", b"bye", 2, True)
    assert "auth_on_register" not in rec.names(client_id=accepted_id)


# -- auth_on_publish, on_publish ----------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_auth_on_publish_context(start_broker, paho_client, version):
    server, rec = start(start_broker)
    pub = paho_client(server, version)
    props = None
    if version == V5:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = ("k", "v")
    pub.publish("ctx/1", b"hello", qos=1, retain=True, properties=props)
    ctx = rec.wait(hook("auth_on_publish", version), client_id=pub.client_id)
    assert (ctx.topic, ctx.payload, ctx.qos, ctx.retain) == ("ctx/1", b"hello", 1, True)
    if version == V5:
        assert [tuple(p) for p in ctx.properties[USER_PROPERTY]] == [("k", "v")]
    done = rec.wait(hook("on_publish", version), client_id=pub.client_id)
    assert (done.topic, done.payload, done.qos, done.retain) == ("ctx/1", b"hello", 1, True)


def test_a_v4_implementation_serves_mqtt5_clients(start_broker, paho_client):
    server, rec = start(start_broker, hooks=["auth_on_publish", "on_publish"])
    pub = paho_client(server, V5)
    pub.publish("v4/1", b"x", qos=1)
    assert rec.names(client_id=pub.client_id)[:1] == ["auth_on_publish"]
    rec.wait("on_publish", client_id=pub.client_id)


def subscriber(paho_client, server, topic="t/#", version=V5):
    sub = paho_client(server, version)
    sub.subscribe(topic, 2)
    return sub


@pytest.mark.parametrize(
    ("qos", "ack", "answer", "code"),
    [
        (1, PUBACK, "error", 0x87),
        (2, PUBREC, "error", 0x87),
        (1, PUBACK, {"result": "error", "reason_code": 0x97}, 0x97),
        (1, PUBACK, "raise", 0x87),  # a crash is a denial, never an allow
        (2, PUBREC, "next", 0x87),
    ],
)
def test_a_refused_mqtt5_publish_is_answered_with_its_code(
    start_broker, raw_client, paho_client, qos, ack, answer, code
):
    answers = {"auth_on_publish": [{"topic": "t/no", **_rule(answer)}]}
    server, rec = start(start_broker, answers=answers)
    sub = subscriber(paho_client, server)
    raw = raw_client(server, V5)
    client_id = unique_id("pub5")
    raw.connect(client_id)
    raw.send(publish_packet("t/no", b"refused", qos=qos, packet_id=7, version=V5))
    reply = raw.expect(ack)
    assert (reply.packet_id, reply.reason_code) == (7, code)
    assert raw.is_open()
    raw.publish("t/yes", b"sentinel", qos=1)
    sentinel_first(sub, b"sentinel")
    assert [c.topic for c in rec.contexts("on_publish_m5", client_id=client_id)] == ["t/yes"]


def _rule(answer) -> dict:
    return {"result": answer} if isinstance(answer, str) else answer


@pytest.mark.parametrize("qos", [1, 2])
def test_a_refused_mqtt311_publish_disconnects(start_broker, raw_client, paho_client, qos):
    server, _ = start(
        start_broker, answers={"auth_on_publish": [{"topic": "t/no", "result": "error"}]}
    )
    sub = subscriber(paho_client, server)
    raw = raw_client(server, V311)
    raw.connect(unique_id("pub3"))
    raw.send(publish_packet("t/no", b"refused", qos=qos, packet_id=3))
    assert raw.expect_closed() == []  # no PUBACK / PUBREC: MQTT 3.1.1 has no refusal code
    paho_client(server, V311).publish("t/yes", b"sentinel", qos=1)
    sentinel_first(sub, b"sentinel")


def test_a_refused_mqtt5_qos0_publish_is_dropped_silently(start_broker, raw_client, paho_client):
    server, rec = start(
        start_broker, answers={"auth_on_publish": [{"topic": "t/no", "result": "error"}]}
    )
    sub = subscriber(paho_client, server)
    raw = raw_client(server, V5)
    client_id = unique_id("qos0")
    raw.connect(client_id)
    raw.send(publish_packet("t/no", b"refused", version=V5))
    raw.publish("t/yes", b"sentinel", qos=1)  # the PUBACK is the first packet back
    sentinel_first(sub, b"sentinel")
    assert rec.wait("auth_on_publish_m5", client_id=client_id, topic="t/no").qos == 0
    assert raw.is_open()


def test_a_refused_mqtt311_qos0_publish_disconnects(start_broker, raw_client, paho_client):
    # VerneMQ (vmq_mqtt_fsm dispatch_publish_qos0): "we have to close connection for 3.1.1",
    # as for QoS 1 and 2; reference/vernemq.md 1.3: "MQTT 3.1.1 unauthorised PUBLISH: the
    # client is disconnected". (Allowed by [MQTT-3.3.5-2].)
    server, _ = start(
        start_broker, answers={"auth_on_publish": [{"topic": "t/no", "result": "error"}]}
    )
    sub = subscriber(paho_client, server)
    raw = raw_client(server, V311)
    raw.connect(unique_id("qos0-3"))
    raw.send(publish_packet("t/no", b"refused"))
    assert not raw.is_open()  # the PINGREQ after it is never answered
    paho_client(server, V311).publish("t/yes", b"sentinel", qos=1)
    sentinel_first(sub, b"sentinel")


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_a_refused_mqtt31_publish_is_dropped_silently(start_broker, raw_client, paho_client, qos):
    # VerneMQ "pretends everything is ok for 3.1": the normal acknowledgement, no routing.
    server, _ = start(
        start_broker, answers={"auth_on_publish": [{"topic": "t/no", "result": "error"}]}
    )
    sub = subscriber(paho_client, server)
    raw = raw_client(server, V31)
    raw.connect(unique_id("v31"))
    raw.publish("t/no", b"refused", qos=qos)  # completes the QoS flow as if allowed
    raw.publish("t/yes", b"sentinel", qos=1)
    sentinel_first(sub, b"sentinel")
    assert raw.is_open()


@pytest.mark.parametrize("version", VERSIONS)
def test_publish_modifiers_change_what_subscribers_get(start_broker, paho_client, version):
    modifiers = {"topic": "out/x", "payload": b"changed", "qos": 2, "retain": True}
    answers = {"auth_on_publish": [{"topic": "in/x", "modifiers": modifiers}]}
    server, rec = start(start_broker, answers=answers)
    sub = subscriber(paho_client, server, "#", version)
    pub = paho_client(server, version)
    pub.publish("in/x", b"original", qos=1)
    msg = sub.expect_message()
    assert (msg.topic, msg.payload, msg.qos) == ("out/x", b"changed", 2)
    # on_publish comes with the new values, before the deliveries it causes (events tell
    # what happened in the order it happened).
    done = rec.wait(hook("on_publish", version), client_id=pub.client_id)
    assert (done.topic, done.payload, done.qos, done.retain) == ("out/x", b"changed", 2, True)
    rec.wait(hook("on_deliver", version), client_id=sub.client_id)
    names = rec.names()
    assert names.index(hook("on_publish", version)) < names.index(hook("on_deliver", version))
    # The retain modifier made it a retained message.
    late = paho_client(server, version)
    late.subscribe("out/#", 1)
    retained = late.expect_message()
    assert (retained.topic, retained.payload, retained.retain) == ("out/x", b"changed", True)


@pytest.mark.parametrize("qos", [0, 1])
def test_on_publish_is_not_fired_for_a_refused_publish(start_broker, raw_client, qos):
    server, rec = start(
        start_broker, answers={"auth_on_publish": [{"topic": "t/no", "result": "error"}]}
    )
    raw = raw_client(server, V5)
    client_id = unique_id("nopub")
    raw.connect(client_id)
    raw.send(publish_packet("t/no", b"x", qos=qos, packet_id=99 if qos else None, version=V5))
    if qos:  # its refusal first, so that raw.publish() below waits for its own PUBACK
        assert (raw.expect(PUBACK).packet_id, raw.stash) == (99, [])
    raw.publish("t/yes", b"y", qos=1)  # answered after the refused one was handled
    assert [c.topic for c in rec.contexts("on_publish_m5", client_id=client_id)] == ["t/yes"]


def test_without_an_authorization_plugin_publish_and_subscribe_are_allowed(
    start_broker, paho_client
):
    server, rec = start(start_broker, hooks=["on_publish", "on_subscribe"])
    assert not server.broker.hooks.chain("auth_on_publish")
    sub = paho_client(server, V5)
    assert sub.subscribe("free/#", 2) == [2]
    pub = paho_client(server, V311)
    pub.publish("free/1", b"x", qos=2)
    assert sub.expect_message().payload == b"x"
    assert rec.wait("on_subscribe", client_id=sub.client_id).topics[0].qos == 2
    assert rec.wait("on_publish", client_id=pub.client_id).topic == "free/1"


@pytest.mark.parametrize("version", VERSIONS)
def test_an_async_auth_on_publish_keeps_the_order_of_publishes(start_broker, paho_client, version):
    server, rec = start(
        start_broker, async_hooks=["auth_on_publish", "auth_on_publish_m5", "on_publish"]
    )
    assert not server.broker.hooks.chain(hook("auth_on_publish", version)).synchronous
    sub = subscriber(paho_client, server, "seq/#", version)
    pub = paho_client(server, version)
    payloads = [str(i).encode() for i in range(50)]
    infos = [pub.client.publish("seq/t", p, qos=1) for p in payloads]  # no wait in between
    for info in infos:
        info.wait_for_publish(5)
        assert info.is_published()
    assert [sub.expect_message().payload for _ in payloads] == payloads
    checked = rec.wait_count(hook("auth_on_publish", version), 50, client_id=pub.client_id)
    assert [c.payload for c in checked] == payloads
    rec.wait_count(hook("on_publish", version), 50, client_id=pub.client_id)


# -- auth_on_subscribe, on_subscribe, on_unsubscribe --------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_auth_on_subscribe_context(start_broker, paho_client, version):
    server, rec = start(start_broker)
    sub = paho_client(server, version)
    assert sub.subscribe([("s/1", 1), ("s/+/2", 2)]) == [1, 2]
    ctx = rec.wait(hook("auth_on_subscribe", version), client_id=sub.client_id)
    assert [(t.topic, t.qos) for t in ctx.topics] == [("s/1", 1), ("s/+/2", 2)]
    granted = rec.wait(hook("on_subscribe", version), client_id=sub.client_id)
    assert [(t.topic, t.qos) for t in granted.topics] == [("s/1", 1), ("s/+/2", 2)]


@pytest.mark.parametrize("version", VERSIONS)
def test_auth_on_subscribe_rewrites_per_topic(start_broker, paho_client, version):
    answers = {"auth_on_subscribe": {"modifiers": {"topics": [("s/1", 0), ("s/2", 128)]}}}
    server, rec = start(start_broker, answers=answers)
    sub = paho_client(server, version)
    assert sub.subscribe([("s/1", 2), ("s/2", 1)]) == [0, 0x80]
    granted = rec.wait(hook("on_subscribe", version), client_id=sub.client_id)
    assert [(t.topic, t.qos) for t in granted.topics] == [("s/1", 0), ("s/2", 0x80)]
    pub = paho_client(server, version)
    pub.publish("s/2", b"refused topic", qos=1)
    pub.publish("s/1", b"sentinel", qos=1)
    msg = sub.expect_message()
    assert (msg.topic, msg.payload, msg.qos) == ("s/1", b"sentinel", 0)


@pytest.mark.parametrize("version", VERSIONS)
def test_auth_on_subscribe_can_lower_the_granted_qos(start_broker, paho_client, version):
    answers = {"auth_on_subscribe": {"modifiers": {"topics": [("q/#", 1)]}}}
    server, rec = start(start_broker, answers=answers)
    sub = paho_client(server, version)
    assert sub.subscribe("q/#", 2) == [1]
    granted = rec.wait(hook("on_subscribe", version), client_id=sub.client_id)
    assert [(t.topic, t.qos) for t in granted.topics] == [("q/#", 1)]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("answer", "v5_code"),
    [("error", 0x87), ("next", 0x87), ({"result": "error", "reason_code": 0x97}, 0x97)],
)
def test_a_refused_subscribe_refuses_every_topic(
    start_broker, paho_client, version, answer, v5_code
):
    server, rec = start(start_broker, answers={"auth_on_subscribe": answer})
    sub = paho_client(server, version)
    code = v5_code if version == V5 else 0x80
    assert sub.subscribe([("r/1", 1), ("r/2", 0)]) == [code, code]
    assert hook("auth_on_subscribe", version) in rec.names(client_id=sub.client_id)
    session = server.broker.registry[sub.client_id]
    assert server.call(lambda: dict(session.subscriptions)) == {}


@pytest.mark.parametrize("version", VERSIONS)
def test_on_subscribe_is_not_fired_for_a_refused_subscribe(start_broker, paho_client, version):
    # VerneMQ fires on_subscribe only after a successful subscribe (vmq_mqtt_fsm: inside
    # the auth-success fun, after vmq_reg:subscribe); an Error answer gets none.
    server, rec = start(start_broker, answers={"auth_on_subscribe": "error"})
    sub = paho_client(server, version)
    sub.subscribe("r/1", 1)  # SUBACK is sent after the on_subscribe call would be made
    assert rec.names(client_id=sub.client_id)[-1] == hook("auth_on_subscribe", version)


@pytest.mark.parametrize("version", VERSIONS)
def test_on_unsubscribe_rewrites_the_topics(start_broker, paho_client, version):
    answers = {"on_unsubscribe": {"modifiers": {"topics": ["u/a"]}}}
    server, rec = start(start_broker, answers=answers)
    sub = paho_client(server, version)
    sub.subscribe([("u/a", 1), ("u/b", 1)])
    codes = sub.unsubscribe("u/b")  # rewritten: u/a goes, u/b stays
    if version == V5:
        assert codes == [0]
    ctx = rec.wait(hook("on_unsubscribe", version), client_id=sub.client_id)
    assert ctx.topics == ["u/b"]
    pub = paho_client(server, version)
    pub.publish("u/a", b"unsubscribed", qos=1)
    pub.publish("u/b", b"sentinel", qos=1)
    sentinel_first(sub, b"sentinel")


@pytest.mark.parametrize("version", VERSIONS)
def test_an_on_unsubscribe_error_is_ignored(start_broker, paho_client, version):
    server, _ = start(start_broker, answers={"on_unsubscribe": "error"})
    sub = paho_client(server, version)
    sub.subscribe([("u/a", 1), ("u/b", 1)])
    sub.unsubscribe("u/a")
    pub = paho_client(server, version)
    pub.publish("u/a", b"unsubscribed", qos=1)
    pub.publish("u/b", b"sentinel", qos=1)
    sentinel_first(sub, b"sentinel")


# -- delivery: on_deliver, on_delivery_complete --------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_on_deliver_rewrites_the_payload_for_one_subscriber(start_broker, paho_client, version):
    chosen_id = unique_id("chosen")
    answers = {"on_deliver": [{"client_id": chosen_id, "modifiers": {"payload": b"just for you"}}]}
    server, rec = start(start_broker, answers=answers)
    chosen = paho_client(server, version, chosen_id)
    chosen.subscribe("d/#", 1)
    other = subscriber(paho_client, server, "d/#", version)
    pub = paho_client(server, version)
    pub.publish("d/1", b"for everyone", qos=1)
    assert chosen.expect_message().payload == b"just for you"
    assert other.expect_message().payload == b"for everyone"
    ctx = rec.wait(hook("on_deliver", version), client_id=chosen_id)
    assert (ctx.topic, ctx.payload, ctx.qos) == ("d/1", b"for everyone", 1)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_async_on_deliver_rewrites_and_keeps_the_order(start_broker, paho_client, version):
    # An async on_deliver (a webhook, say) runs per session in a task, one delivery after
    # the other: the rewrite applies and the subscriber sees the publisher's order.
    answers = {"on_deliver": [{"topic": "ad/3", "modifiers": {"payload": b"three!"}}]}
    server, rec = start(start_broker, answers=answers, async_hooks=["on_deliver", "on_deliver_m5"])
    sub = subscriber(paho_client, server, "ad/#", version)
    pub = paho_client(server, version)
    for i in range(1, 21):
        pub.publish(f"ad/{i}", str(i).encode(), qos=1 if i % 2 else 0)
    got = [sub.expect_message() for _ in range(20)]
    assert [m.topic for m in got] == [f"ad/{i}" for i in range(1, 21)]
    assert got[2].payload == b"three!" and got[3].payload == b"4"
    assert len(rec.contexts(hook("on_deliver", version))) == 20


@pytest.mark.parametrize("version", VERSIONS)
def test_on_delivery_complete_on_puback_and_pubrec(start_broker, raw_client, paho_client, version):
    server, rec = start(start_broker)
    sub = raw_client(server, version)
    sub_id = unique_id("complete")
    sub.connect(sub_id)
    sub.subscribe(("dc/#", 2))
    pub = paho_client(server, version)

    pub.publish("dc/1", b"one", qos=1)
    first = sub.expect(PUBLISH)
    assert rec.contexts("on_delivery_complete", client_id=sub_id) == []
    sub.send(ack_packet(PUBACK, first.packet_id))
    done = rec.wait("on_delivery_complete", client_id=sub_id)
    assert (done.topic, done.payload, done.qos) == ("dc/1", b"one", 1)

    pub.publish("dc/2", b"two", qos=2)
    second = sub.expect(PUBLISH)
    sub.send(ack_packet(PUBREC, second.packet_id))
    assert sub.expect(PUBREL).packet_id == second.packet_id
    # Courier: fired on PUBREC for QoS 2, so already before our PUBREL came back.
    [_, done] = rec.contexts("on_delivery_complete", client_id=sub_id)
    assert (done.topic, done.payload, done.qos) == ("dc/2", b"two", 2)
    sub.send(ack_packet(PUBCOMP, second.packet_id))
    assert sub.is_open()


# -- sessions: wakeup, offline, gone, expired, offline messages, drops ---------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_on_client_offline_for_a_persistent_session(start_broker, raw_client, version):
    server, rec = start(start_broker)
    client_id = unique_id("persist")
    raw = raw_client(server, version)
    raw.connect(client_id, username="pat", **persistent(version))
    assert rec.wait("on_client_wakeup", client_id=client_id).username == "pat"
    raw.disconnect()
    assert rec.wait("on_client_offline", client_id=client_id).username == "pat"
    again = raw_client(server, version)
    assert again.connect(client_id, **persistent(version)).session_present
    rec.wait_count("on_client_wakeup", 2, client_id=client_id)
    assert rec.names(client_id=client_id) == [
        hook("on_register", version),
        "on_client_wakeup",
        "on_client_offline",
        hook("on_register", version),
        "on_client_wakeup",
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_on_client_gone_for_a_clean_session(start_broker, raw_client, version):
    server, rec = start(start_broker)
    client_id = unique_id("clean")
    raw = raw_client(server, version)
    raw.connect(client_id, username="cy", clean=True)
    raw.close()  # network loss, no DISCONNECT
    assert rec.wait("on_client_gone", client_id=client_id).username == "cy"
    assert rec.contexts("on_client_offline", client_id=client_id) == []


def test_on_session_expired(start_broker, raw_client):
    server, rec = start(start_broker)
    client_id = unique_id("expire")
    raw = raw_client(server, V5)
    raw.connect(client_id, **persistent(V5, expiry=1))
    raw.disconnect()
    rec.wait("on_client_offline", client_id=client_id)
    rec.wait("on_session_expired", client_id=client_id, timeout=5)
    assert client_id not in server.call(lambda: set(server.broker.registry))


@pytest.mark.parametrize("version", VERSIONS)
def test_on_offline_message(start_broker, raw_client, paho_client, version):
    server, rec = start(start_broker)
    client_id = unique_id("away")
    raw = raw_client(server, version)
    raw.connect(client_id, **persistent(version))
    raw.subscribe(("away/#", 2))
    raw.disconnect()
    pub = paho_client(server, version)
    pub.publish("away/1", b"while you were out", qos=2)
    ctx = rec.wait("on_offline_message", client_id=client_id)
    assert (ctx.topic, ctx.payload, ctx.qos) == ("away/1", b"while you were out", 2)


@pytest.mark.parametrize("version", VERSIONS)
def test_on_message_drop_when_the_offline_queue_is_full(
    start_broker, raw_client, paho_client, version
):
    server, rec = start(start_broker, {"max_offline_messages": 1})
    client_id = unique_id("full")
    raw = raw_client(server, version)
    raw.connect(client_id, **persistent(version))
    raw.subscribe(("full/#", 1))
    raw.disconnect()
    pub = paho_client(server, version)
    pub.publish("full/1", b"kept", qos=1)
    pub.publish("full/1", b"dropped", qos=1)
    dropped = rec.wait("on_message_drop", client_id=client_id)
    assert (dropped.reason, dropped.payload, dropped.topic) == ("queue_full", b"dropped", "full/1")
    # on_offline_message comes first for both (VerneMQ: before any drop or size check).
    offline = rec.wait_count("on_offline_message", 2, client_id=client_id)
    assert [c.payload for c in offline] == [b"kept", b"dropped"]
