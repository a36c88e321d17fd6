"""payloads.py both ways: contexts -> VerneMQ's request bodies, responses -> results."""

from __future__ import annotations

import json

import pytest

from broker.protocol import Property
from hooks import (
    NEXT,
    AuthContext,
    ClientContext,
    Error,
    Ok,
    PublishContext,
    RegisterContext,
    SubscribeContext,
    TopicRequest,
    UnsubscribeContext,
)
from plugins.webhooks.cache import ResultCache, request_key
from plugins.webhooks.payloads import (
    InvalidResponse,
    decode_properties,
    decode_response,
    encode_body,
    encode_properties,
    max_age,
    request_body,
)

from .conftest import b64


def register(**kw) -> RegisterContext:
    kw.setdefault("client_id", "c1")
    kw.setdefault("peer", ("192.168.1.7", 50123))
    return RegisterContext(**kw)


def publish(**kw) -> PublishContext:
    base = {"client_id": "c1", "username": "u", "topic": "a/b", "payload": b"\x00hi", "qos": 1}
    return PublishContext(**{**base, **kw})


# -- request bodies ----------------------------------------------------------------------


def test_auth_on_register_body():
    ctx = register(username="alice", password=b"secret", clean_start=False)
    ctx.listener_type, ctx.listener_addr, ctx.listener_port = "mqtts", "10.0.0.1", 8883
    ctx.client_cert = b"\x30\x82 DER"
    assert request_body("auth_on_register", ctx) == {
        "peer_addr": "192.168.1.7",
        "peer_port": 50123,
        "mountpoint": "",
        "client_id": "c1",
        "username": "alice",
        "password": "secret",
        "listener_addr": "10.0.0.1",
        "listener_port": 8883,
        "listener_type": "mqtts",
        "client_cert": b64(b"\x30\x82 DER"),
        "clean_session": False,
    }


def test_auth_on_register_body_without_credentials_has_nulls():
    body = request_body("auth_on_register", register())
    assert body["username"] is None and body["password"] is None
    assert json.loads(encode_body(body))["username"] is None


def test_password_bytes_that_are_not_utf8_stay_distinct():
    one = request_body("auth_on_register", register(password=b"\xff"))["password"]
    two = request_body("auth_on_register", register(password=b"\xfe"))["password"]
    assert one != two
    assert json.loads(encode_body({"p": one}))["p"].encode("utf-8", "surrogateescape") == b"\xff"


def test_auth_on_register_m5_body():
    props = {
        Property.SESSION_EXPIRY_INTERVAL: 60,
        Property.RECEIVE_MAXIMUM: 10,
        Property.USER_PROPERTY: [("k", "v"), ("k", "w")],
        Property.REQUEST_PROBLEM_INFORMATION: 0,
        Property.AUTHENTICATION_METHOD: "SCRAM",
        Property.AUTHENTICATION_DATA: b"\x01\x02",
    }
    ctx = register(username="alice", password=b"pw", clean_start=True, properties=props)
    assert request_body("auth_on_register_m5", ctx) == {
        "peer_addr": "192.168.1.7",
        "peer_port": 50123,
        "mountpoint": "",
        "client_id": "c1",
        "username": "alice",
        "password": "pw",
        "listener_addr": "",
        "listener_port": 0,
        "listener_type": "mqtt",
        "clean_start": True,
        "properties": {
            "p_session_expiry_interval": 60,
            "p_receive_max": 10,
            "p_user_property": [
                {"key": b64("k"), "val": b64("v")},
                {"key": b64("k"), "val": b64("w")},
            ],
            "p_request_problem_info": False,
            "p_authentication_method": "SCRAM",
            "p_authentication_data": b64(b"\x01\x02"),
        },
    }


def test_auth_on_publish_body_base64_and_options():
    ctx = publish(retain=True)
    body = {
        "username": "u",
        "mountpoint": "",
        "client_id": "c1",
        "qos": 1,
        "topic": "a/b",
        "payload": b64(b"\x00hi"),
        "retain": True,
    }
    assert request_body("auth_on_publish", ctx) == body
    plain = request_body("auth_on_publish", publish(payload=b"text"), base64_payload=False)
    assert plain["payload"] == "text"
    without = request_body("auth_on_publish", ctx, no_payload=True)
    assert "payload" not in without and without["retain"] is True
    # no_payload is for auth_on_publish only; on_publish always carries the payload
    assert "payload" in request_body("on_publish", ctx, no_payload=True)


def test_publish_m5_properties():
    props = {
        Property.PAYLOAD_FORMAT_INDICATOR: 1,
        Property.MESSAGE_EXPIRY_INTERVAL: 30,
        Property.CONTENT_TYPE: "text/plain",
        Property.RESPONSE_TOPIC: "r/1",
        Property.CORRELATION_DATA: b"\xca\xfe",
        Property.USER_PROPERTY: [("a", "b")],
        Property.SUBSCRIPTION_IDENTIFIER: [3, 7],
    }
    body = request_body("auth_on_publish_m5", publish(properties=props))
    assert body["properties"] == {
        "p_payload_format_indicator": "utf8",
        "p_message_expiry_interval": 30,
        "p_content_type": "text/plain",
        "p_response_topic": "r/1",
        "p_correlation_data": b64(b"\xca\xfe"),
        "p_user_property": [{"key": b64("a"), "val": b64("b")}],
        "p_subscription_id": [3, 7],
    }
    assert request_body("on_publish_m5", publish())["properties"] == {}
    assert "properties" not in request_body("on_publish", publish(properties=props))


def test_subscribe_bodies():
    topics = [
        TopicRequest(topic="a/+", qos=1, no_local=True, retain_handling=2),
        TopicRequest(topic="b/#", qos=0x87),
    ]
    ctx = SubscribeContext(client_id="c1", username=None, topics=topics)
    assert request_body("on_subscribe", ctx) == {
        "username": None,
        "mountpoint": "",
        "client_id": "c1",
        "topics": [{"topic": "a/+", "qos": 1}, {"topic": "b/#", "qos": 128}],
    }
    m5 = request_body("on_subscribe_m5", ctx)
    assert m5["topics"] == [
        {"topic": "a/+", "qos": 1, "no_local": True, "rap": False, "retain_handling": "dont_send"},
        {"topic": "b/#", "qos": 0x87},
    ]
    assert m5["properties"] == {}
    requested = SubscribeContext(client_id="c1", topics=[TopicRequest(topic="x", qos=2)])
    assert request_body("auth_on_subscribe_m5", requested)["topics"] == [
        {"topic": "x", "qos": 2, "no_local": False, "rap": False, "retain_handling": "send_retain"}
    ]


def test_unsubscribe_and_client_event_bodies():
    ctx = UnsubscribeContext(client_id="c1", username="u", topics=["a/b", "c/#"])
    assert request_body("on_unsubscribe", ctx) == {
        "username": "u",
        "mountpoint": "",
        "client_id": "c1",
        "topics": ["a/b", "c/#"],
    }
    assert request_body("on_unsubscribe_m5", ctx)["properties"] == {}
    client = ClientContext(client_id="c1", username="u")
    for hook in ("on_client_wakeup", "on_client_offline", "on_client_gone", "on_session_expired"):
        assert request_body(hook, client) == {"mountpoint": "", "client_id": "c1"}


def test_register_event_and_offline_bodies():
    ctx = register(username="u", password=b"never sent")
    assert request_body("on_register", ctx) == {
        "peer_addr": "192.168.1.7",
        "peer_port": 50123,
        "mountpoint": "",
        "client_id": "c1",
        "username": "u",
    }
    assert request_body("on_register_m5", ctx)["properties"] == {}
    assert request_body("on_offline_message", publish()) == {
        "mountpoint": "",
        "client_id": "c1",
        "qos": 1,
        "topic": "a/b",
        "payload": b64(b"\x00hi"),
        "retain": False,
    }
    dropped = request_body("on_message_drop", publish(reason="queue_full"))
    assert dropped["reason"] == "queue_full"
    failed = request_body("on_register_failed", register(reason="not_authorized"))
    assert failed["reason"] == "not_authorized" and "password" not in failed


def test_on_auth_m5_body():
    props = {Property.AUTHENTICATION_METHOD: "m", Property.AUTHENTICATION_DATA: b"\x00"}
    ctx = AuthContext(client_id="c1", username="u", properties=props)
    assert request_body("on_auth_m5", ctx) == {
        "username": "u",
        "mountpoint": "",
        "client_id": "c1",
        "properties": {"p_authentication_method": "m", "p_authentication_data": "AA=="},
    }


# -- responses ---------------------------------------------------------------------------


def answer(hook: str, doc, **kw):
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return decode_response(hook, data, **kw)


def test_results():
    assert answer("auth_on_register", {"result": "ok"}) == Ok()
    assert answer("auth_on_register", {"result": "ok", "modifiers": {}}) == Ok()
    assert answer("auth_on_register", {"result": "ok", "modifiers": []}) == Ok()
    assert answer("auth_on_register", {"result": "next"}) is NEXT
    assert answer("auth_on_publish", {"result": {"error": "not_allowed"}}) == Error("not_allowed")
    assert answer("auth_on_publish", {"result": {}}) == Error("unknown_error")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"<html>oops</html>", "received_payload_not_json"),
        (b"", "received_payload_not_json"),
        (b'["ok"]', "invalid_response"),
        (b'{"result": "maybe"}', "invalid_response"),
        (b"{}", "invalid_response"),
        (b'{"result": "ok", "modifiers": "x"}', "invalid_modifiers"),
        (b'{"result": "ok", "modifiers": {"no_such": 1}}', "invalid_modifiers"),
        (b'{"result": "ok", "modifiers": {"max_inflight_messages": "10"}}', "invalid_modifiers"),
        (b'{"result": "ok", "modifiers": {"queue_type": "random"}}', "invalid_modifiers"),
    ],
)
def test_invalid_answers(data, reason):
    with pytest.raises(InvalidResponse) as caught:
        decode_response("auth_on_register", data)
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("hook", "modifiers"),
    [
        ("auth_on_register", {"upgrade_qos": True}),
        ("auth_on_register_m5", {"allow_publish": False}),
        ("auth_on_publish", {"throttle": 100}),
    ],
)
def test_a_modifier_nautilus_does_not_apply_is_refused_saying_so(hook, modifiers):
    with pytest.raises(InvalidResponse) as caught:
        answer(hook, {"result": "ok", "modifiers": modifiers})
    assert caught.value.reason == "invalid_modifiers"
    assert f"of {hook} is not supported by Nautilus: " in caught.value.detail


@pytest.mark.parametrize(
    "mods",
    [{"client_id": "c2", "mountpoint": ""}, {"client_id": "c2", "mountpoint": "tenant-a"}],
)
def test_a_mountpoint_goes_with_client_id_as_vernemq_wants(mods):
    assert answer("auth_on_register", {"result": "ok", "modifiers": mods}) == Ok(mods)


def test_a_mountpoint_alone_is_a_modifier_too():
    # VerneMQ ignored it (its issues 332, 476, 559, 1212); the broker moves the client.
    mods = {"mountpoint": "tenant-a"}
    assert answer("auth_on_register", {"result": "ok", "modifiers": mods}) == Ok(mods)
    with pytest.raises(InvalidResponse, match="invalid value"):
        answer("auth_on_register", {"result": "ok", "modifiers": {"mountpoint": "a/b"}})


def test_register_modifiers():
    mods = {"username": "bob", "max_inflight_messages": 5, "queue_type": "lifo"}
    assert answer("auth_on_register", {"result": "ok", "modifiers": mods}) == Ok(mods)
    with_props = {"result": "ok", "modifiers": {"properties": {"p_session_expiry_interval": 9}}}
    assert answer("auth_on_register_m5", with_props).modifiers == {
        "properties": {Property.SESSION_EXPIRY_INTERVAL: 9}
    }


def test_publish_modifiers_payload_base64():
    doc = {"result": "ok", "modifiers": {"topic": "new/t", "payload": b64(b"\x01\x02"), "qos": 0}}
    assert answer("auth_on_publish", doc) == Ok(
        {"topic": "new/t", "payload": b"\x01\x02", "qos": 0}
    )
    plain = {"result": "ok", "modifiers": {"payload": "text"}}
    assert answer("auth_on_publish", plain, base64_payload=False) == Ok({"payload": b"text"})
    with pytest.raises(InvalidResponse):
        answer("auth_on_publish", {"result": "ok", "modifiers": {"payload": "not base64!"}})
    with pytest.raises(InvalidResponse):
        answer("auth_on_publish", {"result": "ok", "modifiers": {"topic": "a/#"}})


def test_publish_m5_property_modifiers():
    doc = {
        "result": "ok",
        "modifiers": {
            "properties": {
                "p_user_property": [{"key": b64("k"), "val": b64("v")}],
                "p_payload_format_indicator": "unspecified",
                "p_correlation_data": b64(b"\x00"),
                "p_message_expiry_interval": 5,
            }
        },
    }
    assert answer("auth_on_publish_m5", doc).modifiers["properties"] == {
        Property.USER_PROPERTY: [("k", "v")],
        Property.PAYLOAD_FORMAT_INDICATOR: 0,
        Property.CORRELATION_DATA: b"\x00",
        Property.MESSAGE_EXPIRY_INTERVAL: 5,
    }
    for bad in (
        {"p_no_such": 1},
        {"p_session_expiry_interval": 5},  # not a PUBLISH property
        {"p_message_expiry_interval": -1},
        {"p_payload_format_indicator": 1},
        {"p_user_property": [{"key": "k"}]},
    ):
        with pytest.raises(InvalidResponse):
            answer("auth_on_publish_m5", {"result": "ok", "modifiers": {"properties": bad}})


def test_properties_round_trip():
    props = {
        Property.PAYLOAD_FORMAT_INDICATOR: 1,
        Property.USER_PROPERTY: [("k", "v")],
        Property.CORRELATION_DATA: b"\xff",
        Property.REQUEST_RESPONSE_INFORMATION: 1,
        Property.SUBSCRIPTION_IDENTIFIER: [4],
        Property.MAXIMUM_PACKET_SIZE: 1024,
    }
    assert decode_properties(encode_properties(props)) == props


def test_subscribe_v4_topics_form():
    doc = {"result": "ok", "topics": [{"topic": "a/1", "qos": 1}, {"topic": "a/2", "qos": 128}]}
    assert answer("auth_on_subscribe", doc) == Ok({"topics": [("a/1", 1), ("a/2", 128)]})
    # v4 ignores "modifiers", m5 ignores the top-level "topics"
    assert answer("auth_on_subscribe", {"result": "ok", "modifiers": {"x": 1}}) == Ok()
    assert answer("auth_on_subscribe_m5", doc) == Ok()


def test_subscribe_m5_modifiers_form():
    topics = [
        {"topic": "a/1", "qos": 0, "no_local": True, "rap": True, "retain_handling": "dont_send"},
        {"topic": "a/2", "qos": 135},
    ]
    doc = {"result": "ok", "modifiers": {"topics": topics}}
    assert answer("auth_on_subscribe_m5", doc) == Ok({"topics": [("a/1", 0), ("a/2", 135)]})
    bad = {
        "result": "ok",
        "modifiers": {"topics": [{"topic": "a", "qos": 0, "retain_handling": 1}]},
    }
    with pytest.raises(InvalidResponse):
        answer("auth_on_subscribe_m5", bad)
    with pytest.raises(InvalidResponse):
        answer("auth_on_subscribe", {"result": "ok", "topics": [{"topic": "a"}]})


def test_unsubscribe_topics():
    assert answer("on_unsubscribe", {"result": "ok", "topics": ["x/y"]}) == Ok({"topics": ["x/y"]})
    m5 = {"result": "ok", "modifiers": {"topics": ["x/y"]}}
    assert answer("on_unsubscribe_m5", m5) == Ok({"topics": ["x/y"]})
    with pytest.raises(InvalidResponse):
        answer("on_unsubscribe", {"result": "ok", "topics": [{"topic": "x"}]})


def test_on_auth_m5_modifiers():
    for code in ("continue_authentication", 24):
        doc = {
            "result": "ok",
            "modifiers": {
                "properties": {"p_authentication_method": "m", "p_authentication_data": "AQ=="},
                "reason_code": code,
            },
        }
        assert answer("on_auth_m5", doc).modifiers == {
            "properties": {
                Property.AUTHENTICATION_METHOD: "m",
                Property.AUTHENTICATION_DATA: b"\x01",
            },
            "reason_code": 24,
        }
    assert answer("on_auth_m5", {"result": "ok", "modifiers": {"reason_code": "success"}}) == Ok(
        {"reason_code": 0}
    )


def test_max_age():
    assert max_age("max-age=45") == 45
    assert max_age("  max-age=45,sthelse") == 45
    assert max_age("public, Max-Age=7") == 7
    assert max_age("max-age=") is None
    assert max_age("max-age=x") is None
    assert max_age("max-age=0") is None
    assert max_age("no-cache") is None
    assert max_age(None) is None


# -- cache -------------------------------------------------------------------------------


def test_cache_key_leaves_out_payload_and_peer_port():
    one = request_body("auth_on_register", register(peer=("10.0.0.1", 1000), password=b"p"))
    two = request_body("auth_on_register", register(peer=("10.0.0.1", 2000), password=b"p"))
    other = request_body("auth_on_register", register(peer=("10.0.0.1", 1000), password=b"q"))
    key = request_key("http://e", "auth_on_register", one)
    assert key == request_key("http://e", "auth_on_register", two)
    assert key != request_key("http://e", "auth_on_register", other)
    assert key != request_key("http://f", "auth_on_register", one)
    a = request_body("auth_on_publish", publish(payload=b"1"))
    b = request_body("auth_on_publish", publish(payload=b"2"))
    assert request_key("u", "auth_on_publish", a) == request_key("u", "auth_on_publish", b)


def test_cache_expiry_bound_and_payload_modifier():
    now = [1000.0]
    cache = ResultCache(2, clock=lambda: now[0])
    cache.put("a", {"topic": "t", "payload": b"x"}, 10)
    assert cache.get("a") == ({"topic": "t"}, 10.0)  # the payload modifier is not kept
    now[0] += 10
    assert cache.get("a") is None and len(cache) == 0  # expired: removed on lookup
    cache.put("a", {}, 10)
    cache.put("b", {}, 10)
    cache.put("c", {}, 10)
    assert len(cache) == 2 and cache.get("a") is None and cache.evictions == 1
    now[0] += 4
    assert cache.get("c") == ({}, 6.0)  # with the seconds it has left
    assert (cache.hits, cache.misses) == (2, 2)
    disabled = ResultCache(0)
    disabled.put("a", {}, 10)
    assert disabled.get("a") is None
