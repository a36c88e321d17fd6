"""The deciding hooks through a real broker: paho clients, a real aiohttp endpoint.

Every request is checked as VerneMQ sends it (method, headers, JSON body); results,
modifiers, the error policy and the cache are checked by what the MQTT clients see.
"""

from __future__ import annotations

import asyncio

from broker import admin
from broker.protocol import Property
from tests.broker.helpers import PUBACK, V5, V311, connect_packet, publish_packet, unique_id

from .conftest import NEXT, Answer, b64, plugin_of, refused_url

NOT_AUTHORIZED_V3, BAD_CREDENTIALS_V3 = 5, 4
NOT_AUTHORIZED_V5 = 0x87


def refused(raw_client, server, version: int = V311, **connect) -> int:
    """The CONNACK code a refused client gets, as sent (paho maps MQTT 3 codes)."""
    client = raw_client(server, version)
    code = client.connect(unique_id(), expect_code=None, **connect).reason_code
    assert code != 0
    return code


def check_request(recorded, hook: str) -> dict:
    assert recorded.method == "POST"
    assert recorded.hook == hook
    assert recorded.headers["Content-Type"] == "application/json"
    return recorded.json


# -- auth_on_register ----------------------------------------------------------------------


def test_register_body_and_ok(hook_server, webhooks_broker, paho_client):
    url = hook_server.answer("/reg", {"result": "ok"})
    server = webhooks_broker({"hook": "auth_on_register", "url": url})
    client = paho_client(server, client_id="dev-1", username="alice", password="s3cret")
    body = check_request(hook_server.expect("/reg"), "auth_on_register")
    assert isinstance(body.pop("peer_port"), int)
    assert body == {
        "peer_addr": "127.0.0.1",
        "mountpoint": "",
        "client_id": "dev-1",
        "username": "alice",
        "password": "s3cret",
        "clean_session": True,
        # VerneMQ's connection metadata: the listener (no client certificate over TCP).
        "listener_addr": "127.0.0.1",
        "listener_port": server.port,
        "listener_type": "mqtt",
    }
    client.disconnect()


def test_register_m5_body(hook_server, webhooks_broker, paho_client):
    url = hook_server.answer("/reg5", {"result": "ok"})
    server = webhooks_broker({"hook": "auth_on_register_m5", "url": url})
    paho_client(
        server,
        V5,
        client_id="dev-5",
        username="alice",
        clean=False,
        session_expiry=30,
        properties={"UserProperty": [("site", "lab")], "ReceiveMaximum": 10},
    )
    body = check_request(hook_server.expect("/reg5"), "auth_on_register_m5")
    body.pop("peer_port")
    assert body == {
        "peer_addr": "127.0.0.1",
        "mountpoint": "",
        "client_id": "dev-5",
        "username": "alice",
        "password": None,
        "listener_addr": "127.0.0.1",
        "listener_port": server.port,
        "listener_type": "mqtt",
        "clean_start": False,
        "properties": {
            "p_session_expiry_interval": 30,
            "p_receive_max": 10,
            "p_user_property": [{"key": b64("site"), "val": b64("lab")}],
        },
    }


def test_a_mountpoint_answered_alone_puts_the_client_on_that_tree(
    hook_server, webhooks_broker, paho_client
):
    # VerneMQ ignored a mountpoint returned without client_id (its issues 332, 476, 559).
    register = hook_server.answer("/reg", {"result": "ok", "modifiers": {"mountpoint": "t-a"}})
    publish = hook_server.answer("/pub", {"result": "ok"})
    server = webhooks_broker(
        {"hook": "auth_on_register", "url": register}, {"hook": "auth_on_publish", "url": publish}
    )
    client = paho_client(server, client_id="dev-m", username="alice")
    assert server.call(admin.client, server.broker, "dev-m", "t-a")["is_online"]
    client.publish("t/x", b"hi", 1)
    body = check_request(hook_server.expect("/pub"), "auth_on_publish")
    assert (body["mountpoint"], body["client_id"], body["topic"]) == ("t-a", "dev-m", "t/x")


def test_v4_endpoint_serves_mqtt5_clients_with_v4_bodies(hook_server, webhooks_broker, paho_client):
    url = hook_server.answer("/reg", {"result": "ok"})
    server = webhooks_broker({"hook": "auth_on_register", "url": url})
    paho_client(server, V5, username="alice")
    body = check_request(hook_server.expect("/reg"), "auth_on_register")
    assert "clean_session" in body and "properties" not in body


def test_register_error_and_reason(hook_server, webhooks_broker, raw_client):
    url = hook_server.answer("/reg", {"result": {"error": "not_allowed"}})
    server = webhooks_broker({"hook": "auth_on_register", "url": url})
    assert refused(raw_client, server, username="eve") == NOT_AUTHORIZED_V3
    assert refused(raw_client, server, V5, username="eve") == NOT_AUTHORIZED_V5
    # Nautilus reads the reason (VerneMQ answers 5 whatever the text).
    hook_server.answer("/reg", {"result": {"error": "invalid_credentials"}})
    assert refused(raw_client, server, username="eve") == BAD_CREDENTIALS_V3


def test_endpoints_in_name_order_next_then_ok(hook_server, webhooks_broker, paho_client):
    first = hook_server.answer("/first", NEXT)
    second = hook_server.answer("/second", {"result": "ok"})
    server = webhooks_broker(
        {"hook": "auth_on_register", "url": second, "name": "b-second"},
        {"hook": "auth_on_register", "url": first, "name": "a-first"},
    )
    paho_client(server, username="u")
    assert hook_server.expect("/first").hook == "auth_on_register"
    assert hook_server.expect("/second").hook == "auth_on_register"


def test_all_next_leaves_the_decision_to_the_chain(hook_server, webhooks_broker, raw_client):
    url = hook_server.answer("/reg", NEXT)
    server = webhooks_broker({"hook": "auth_on_register", "url": url})
    # No other plugin: the exhausted chain denies.
    assert refused(raw_client, server, username="u") == NOT_AUTHORIZED_V3
    assert hook_server.count("/reg") == 1


def test_register_username_modifier(hook_server, webhooks_broker, paho_client):
    reg = hook_server.answer("/reg", {"result": "ok", "modifiers": {"username": "bob"}})
    pub = hook_server.answer("/pub", {"result": "ok"})
    server = webhooks_broker(
        {"hook": "auth_on_register", "url": reg}, {"hook": "auth_on_publish", "url": pub}
    )
    client = paho_client(server, username="alice")
    assert hook_server.expect("/reg").json["username"] == "alice"
    client.publish("t/1", b"x", qos=1)
    assert hook_server.expect("/pub").json["username"] == "bob"


# -- the error policy: deny, never fall through ---------------------------------------------


def deny_case(hook_server, webhooks_broker, raw_client, endpoint: dict, path: str | None):
    fallback = hook_server.answer("/fallback", {"result": "ok"})
    server = webhooks_broker(
        {"hook": "auth_on_register", "name": "a", **endpoint},
        {"hook": "auth_on_register", "name": "b", "url": fallback},
    )
    assert refused(raw_client, server, username="u") == NOT_AUTHORIZED_V3
    if path is not None:
        hook_server.expect(path)
    assert hook_server.count("/fallback") == 0  # an error does not fall through
    return plugin_of(server)


def test_deny_on_timeout(hook_server, webhooks_broker, raw_client):
    url = hook_server.answer("/slow", Answer(hold=True))
    plugin = deny_case(
        hook_server, webhooks_broker, raw_client, {"url": url, "response_timeout": 200}, "/slow"
    )
    assert plugin.counters.timeouts == 1


def test_deny_on_http_500(hook_server, webhooks_broker, raw_client):
    url = hook_server.answer("/boom", Answer({"result": "ok"}, status=500))
    deny_case(hook_server, webhooks_broker, raw_client, {"url": url}, "/boom")


def test_deny_on_non_json(hook_server, webhooks_broker, raw_client):
    url = hook_server.answer("/html", Answer(b"<html>ok</html>"))
    deny_case(hook_server, webhooks_broker, raw_client, {"url": url}, "/html")


def test_deny_on_invalid_modifiers(hook_server, webhooks_broker, raw_client):
    url = hook_server.answer("/mods", {"result": "ok", "modifiers": {"no_such_thing": 1}})
    deny_case(hook_server, webhooks_broker, raw_client, {"url": url}, "/mods")


def test_deny_on_connection_refused(hook_server, webhooks_broker, raw_client):
    plugin = deny_case(hook_server, webhooks_broker, raw_client, {"url": refused_url()}, None)
    assert plugin.counters.errors == 1


def test_client_gone_while_register_is_pending(
    hook_server, webhooks_broker, raw_client, paho_client
):
    url = hook_server.answer("/slow", Answer(hold=True))
    server = webhooks_broker({"hook": "auth_on_register", "url": url, "response_timeout": 300})
    leaver = raw_client(server)
    leaver.send(connect_packet("leaver", username="u"))
    hook_server.expect("/slow")
    leaver.close()  # the call is left to finish; its answer goes nowhere

    async def flows_done() -> None:
        while server.broker.tasks:
            await asyncio.wait(set(server.broker.tasks))

    server.call(flows_done)
    assert plugin_of(server).counters.timeouts == 1
    hook_server.answer("/slow", {"result": "ok"})
    paho_client(server, username="u").disconnect()  # the broker goes on


# -- auth_on_publish -----------------------------------------------------------------------


def test_publish_body_and_rewrite(hook_server, webhooks_broker, paho_client):
    def rewrite(recorded):
        if recorded.json["topic"] == "in/x":
            mods = {"topic": "out/x", "payload": b64(b"rewritten"), "qos": 0}
            return Answer({"result": "ok", "modifiers": mods})
        return Answer({"result": "ok"})

    url = hook_server.answer("/pub", rewrite)
    server = webhooks_broker({"hook": "auth_on_publish", "url": url}, anonymous=True)
    sub = paho_client(server)
    sub.subscribe("out/#", 1)
    pub = paho_client(server, client_id="pub-1")
    pub.publish("in/x", b"\x00original", qos=1, retain=False)
    body = check_request(hook_server.expect("/pub"), "auth_on_publish")
    assert body == {
        "username": None,
        "mountpoint": "",
        "client_id": "pub-1",
        "qos": 1,
        "topic": "in/x",
        "payload": b64(b"\x00original"),
        "retain": False,
    }
    msg = sub.expect_message()
    assert (msg.topic, msg.payload, msg.qos) == ("out/x", b"rewritten", 0)


def test_on_deliver_body_and_payload_rewrite(hook_server, webhooks_broker, paho_client):
    # VerneMQ's on_deliver webhook: the receiver's view; a payload modifier rewrites it.
    url = hook_server.answer(
        "/deliver", {"result": "ok", "modifiers": {"payload": b64(b"delivered differently")}}
    )
    server = webhooks_broker({"hook": "on_deliver", "url": url}, anonymous=True)
    sub = paho_client(server, client_id="receiver")
    sub.subscribe("dl/#", 1)
    pub = paho_client(server)
    pub.publish("dl/x", b"as published", qos=1)
    body = check_request(hook_server.expect("/deliver"), "on_deliver")
    assert (body["client_id"], body["topic"], body["payload"]) == (
        "receiver",
        "dl/x",
        b64(b"as published"),
    )
    assert sub.expect_message().payload == b"delivered differently"


def test_publish_m5_error_is_puback_0x87(hook_server, webhooks_broker, raw_client, paho_client):
    url = hook_server.answer("/pub", {"result": {"error": "forbidden"}})
    server = webhooks_broker({"hook": "auth_on_publish_m5", "url": url}, anonymous=True)
    sub = paho_client(server, V5)
    sub.subscribe("t/#", 1)
    pub = raw_client(server, V5)
    pub.connect("raw-pub")
    pub.send(publish_packet("t/1", b"x", qos=1, packet_id=7, version=V5))
    ack = pub.expect(PUBACK)
    assert (ack.packet_id, ack.reason_code) == (7, NOT_AUTHORIZED_V5)
    body = check_request(hook_server.expect("/pub"), "auth_on_publish_m5")
    assert body["properties"] == {}
    sub.expect_no_message()


def test_publish_no_payload_and_plain_payload(hook_server, webhooks_broker, paho_client):
    bare = hook_server.answer("/bare", NEXT)
    plain = hook_server.answer("/plain", {"result": "ok"})
    server = webhooks_broker(
        {"hook": "auth_on_publish", "url": bare, "name": "1", "no_payload": True},
        {"hook": "auth_on_publish", "url": plain, "name": "2", "base64_payload": False},
        anonymous=True,
    )
    paho_client(server).publish("t", b"hello", qos=1)
    assert "payload" not in hook_server.expect("/bare").json
    assert hook_server.expect("/plain").json["payload"] == "hello"


# -- auth_on_subscribe ---------------------------------------------------------------------


def test_subscribe_v4_topics_rewrite_and_128(hook_server, webhooks_broker, paho_client):
    topics = [{"topic": "b/1", "qos": 1}, {"topic": "a/2", "qos": 128}]
    url = hook_server.answer("/sub", {"result": "ok", "topics": topics})
    server = webhooks_broker({"hook": "auth_on_subscribe", "url": url}, anonymous=True)
    sub = paho_client(server, client_id="sub-1")
    assert sub.subscribe([("a/1", 2), ("a/2", 0)]) == [1, 128]
    body = check_request(hook_server.expect("/sub"), "auth_on_subscribe")
    assert body == {
        "username": None,
        "mountpoint": "",
        "client_id": "sub-1",
        "topics": [{"topic": "a/1", "qos": 2}, {"topic": "a/2", "qos": 0}],
    }
    paho_client(server).publish("b/1", b"to the rewritten filter", qos=1)
    assert sub.expect_message().payload == b"to the rewritten filter"


def test_subscribe_m5_modifiers_and_reason_code(hook_server, webhooks_broker, paho_client):
    topics = [{"topic": "a/1", "qos": 0}, {"topic": "a/2", "qos": 135}]
    url = hook_server.answer("/sub5", {"result": "ok", "modifiers": {"topics": topics}})
    server = webhooks_broker({"hook": "auth_on_subscribe_m5", "url": url}, anonymous=True)
    sub = paho_client(server, V5)
    assert sub.subscribe([("a/1", 1), ("a/2", 1)]) == [0, 135]
    body = check_request(hook_server.expect("/sub5"), "auth_on_subscribe_m5")
    assert body["topics"][0] == {
        "topic": "a/1",
        "qos": 1,
        "no_local": False,
        "rap": False,
        "retain_handling": "send_retain",
    }
    assert body["properties"] == {}


# -- on_unsubscribe ------------------------------------------------------------------------


def test_unsubscribe_rewrite(hook_server, webhooks_broker, paho_client):
    url = hook_server.answer("/unsub", {"result": "ok", "topics": ["real/#"]})
    server = webhooks_broker({"hook": "on_unsubscribe", "url": url}, anonymous=True)
    sub = paho_client(server, client_id="unsub-1")
    sub.subscribe("real/#", 1)
    sub.unsubscribe("alias")
    body = check_request(hook_server.expect("/unsub"), "on_unsubscribe")
    assert body == {
        "username": None,
        "mountpoint": "",
        "client_id": "unsub-1",
        "topics": ["alias"],
    }
    paho_client(server).publish("real/x", b"gone", qos=1)
    sub.expect_no_message()


# -- the cache -----------------------------------------------------------------------------


def test_cache_max_age_skips_the_endpoint_until_expiry(hook_server, webhooks_broker, paho_client):
    cached = Answer({"result": "ok"}, headers={"Cache-Control": "max-age=60"})
    url = hook_server.answer("/reg", cached)
    server = webhooks_broker({"hook": "auth_on_register", "url": url})
    plugin = plugin_of(server)
    paho_client(server, client_id="same", username="u", password="p").disconnect()
    assert hook_server.count("/reg") == 1
    # Same question from another port: answered from the cache.
    paho_client(server, client_id="same", username="u", password="p").disconnect()
    assert hook_server.count("/reg") == 1
    # Another password is another question.
    paho_client(server, client_id="same", username="u", password="other").disconnect()
    assert hook_server.count("/reg") == 2
    # Sixty-one seconds later the entry has expired.
    clock = plugin.cache.clock
    server.call(setattr, plugin.cache, "clock", lambda: clock() + 61)
    paho_client(server, client_id="same", username="u", password="p").disconnect()
    assert hook_server.count("/reg") == 3


def test_cache_keeps_only_ok(hook_server, webhooks_broker, raw_client):
    denied = Answer({"result": {"error": "no"}}, headers={"Cache-Control": "max-age=60"})
    url = hook_server.answer("/reg", denied)
    server = webhooks_broker({"hook": "auth_on_register", "url": url})
    for _ in range(2):
        raw_client(server).connect("x", username="u", expect_code=NOT_AUTHORIZED_V3)
    assert hook_server.count("/reg") == 2


def test_cached_publish_ignores_payload(hook_server, webhooks_broker, paho_client):
    cached = Answer({"result": "ok"}, headers={"Cache-Control": "max-age=60"})
    url = hook_server.answer("/pub", cached)
    server = webhooks_broker({"hook": "auth_on_publish", "url": url}, anonymous=True)
    client = paho_client(server)
    client.publish("t/1", b"one", qos=1)
    client.publish("t/1", b"two", qos=1)
    assert hook_server.count("/pub") == 1
    client.publish("t/2", b"three", qos=1)
    assert hook_server.count("/pub") == 2


def test_the_broker_keeps_a_publish_answer_for_its_max_age(
    hook_server, webhooks_broker, paho_client
):
    """auth_on_publish with max-age: the broker keeps the answer for the connection
    (hooks/decisions.py), so not even the plugin's cache is asked until it expires."""
    cached = Answer({"result": "ok"}, headers={"Cache-Control": "max-age=60"})
    url = hook_server.answer("/pub", cached)
    server = webhooks_broker({"hook": "auth_on_publish", "url": url}, anonymous=True)
    plugin = plugin_of(server)
    client = paho_client(server)
    for payload in (b"one", b"two", b"three"):
        client.publish("t/1", payload, qos=1)
    assert hook_server.count("/pub") == 1 and plugin.cache.hits == 0
    server.advance(61)  # the broker's answer has expired (the plugin's clock has not)
    client.publish("t/1", b"four", qos=1)
    assert hook_server.count("/pub") == 1 and plugin.cache.hits == 1


def test_a_payload_modifier_is_the_first_messages_only(hook_server, webhooks_broker, paho_client):
    changed = Answer(
        {"result": "ok", "modifiers": {"payload": b64(b"new")}},
        headers={"Cache-Control": "max-age=60"},
    )
    url = hook_server.answer("/pub", changed)
    server = webhooks_broker({"hook": "auth_on_publish", "url": url}, anonymous=True)
    plugin = plugin_of(server)
    client = paho_client(server)
    for payload in (b"one", b"two", b"three"):
        client.publish("t/1", payload, qos=1)
    # The payload modifier is the first message's only: VerneMQ's cache keeps the answer
    # without it (asked for the second), and the broker keeps that (the third).
    assert hook_server.count("/pub") == 1 and plugin.cache.hits == 1


# -- on_auth_m5 (MQTT 5 enhanced authentication) ------------------------------------------


def test_on_auth_m5_end_to_end(hook_server, webhooks_broker, raw_client):
    """A real MQTT 5 CONNECT with an Authentication Method: the endpoint gets VerneMQ's
    body, its answer's data goes back in the CONNACK; a refusal refuses the connection."""
    method = Property.AUTHENTICATION_METHOD
    data = Property.AUTHENTICATION_DATA
    welcome = {"p_authentication_method": "TOKEN", "p_authentication_data": b64(b"welcome")}
    url = hook_server.answer(
        "/auth", {"result": "ok", "modifiers": {"reason_code": "success", "properties": welcome}}
    )
    server = webhooks_broker({"hook": "on_auth_m5", "url": url}, anonymous=True)
    client = raw_client(server, V5)
    connack = client.connect("dev-a", properties={method: "TOKEN", data: b"secret"}, expect_code=0)
    body = check_request(hook_server.expect("/auth"), "on_auth_m5")
    assert body == {
        "username": None,
        "mountpoint": "",
        "client_id": "dev-a",
        "properties": {"p_authentication_method": "TOKEN", "p_authentication_data": b64(b"secret")},
    }
    assert (connack.properties[method], connack.properties[data]) == ("TOKEN", b"welcome")

    hook_server.answer("/auth", {"result": {"error": "not_authorized"}})
    code = refused(raw_client, server, V5, properties={method: "TOKEN", data: b"wrong"})
    assert code == NOT_AUTHORIZED_V5
