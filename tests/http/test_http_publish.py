"""POST /api/v1/publish (VerneMQ's vmq_http_pub, "on-behalf-of"): a real broker with
`allow_anonymous = false`, the passwd plugin (auth_on_register) and the acl plugin
(auth_on_publish), and real paho subscribers. An allowed message arrives as a PUBLISH from
a client would (QoS, retain, User Properties, binary payload, shared groups); a refused
one is answered 401 / 403 with the plugin's reason and delivered to nobody."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from broker.http.access import PUBLISH
from broker.http.api_keys import ApiKeys
from plugins.passwd.hashes import make_hash
from tests.broker.helpers import V5, PahoClient
from tests.cluster.nodes import cluster_of
from tests.hooks.test_call_sites import RECORDER

from .conftest import Reply, basic, error, get, table

ACL = """\
user gateway
topic write sensors/#
user reader
topic read sensors/#
topic read $share/g/sensors/#
"""
BINARY = bytes(range(256))
SWC = {"sync_interval": 0.3}  # a joining node's first exchange within a test's time


@pytest.fixture
def secured(keyed_broker, keys_file, tmp_path):
    """(server, a publish-scope key): logins gateway / g-pass and reader / r-pass."""
    passwd = tmp_path / "passwd"
    passwd.write_text(f"gateway:{make_hash(b'g-pass')}\nreader:{make_hash(b'r-pass')}\n")
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    server, _ = keyed_broker(
        broker={"allow_anonymous": False, "systree_enabled": False},
        plugins={
            "passwd": {"enabled": True, "password_file": str(passwd)},
            "acl": {"enabled": True, "acl_file": str(acl)},
        },
    )
    return server, ApiKeys(str(keys_file)).add(scope=PUBLISH)


def post(
    server, key: str, body: bytes, content_type: str, method: str = "POST", **query: str
) -> Reply:
    headers = {"Content-Type": content_type, **basic(key)}
    return get(server, "/api/v1/publish", method=method, headers=headers, query=query, data=body)


def post_json(server, key: str, fields: dict[str, Any], **query: str) -> Reply:
    return post(server, key, json.dumps(fields).encode(), "application/json", **query)


def gateway(**fields: Any) -> dict[str, Any]:
    return {"client_id": "gw-1", "user": "gateway", "password": "g-pass", **fields}


def reader(paho_client, server, topic: str = "sensors/#"):
    client = paho_client(server, V5, username="reader", password="r-pass")
    assert client.subscribe(topic, 1) == [1]
    return client


def test_an_allowed_publish_reaches_subscribers_as_an_mqtt_one_would(secured, paho_client):
    server, key = secured
    sub = reader(paho_client, server)
    member = reader(paho_client, server, "$share/g/sensors/#")  # a shared group's
    fields = gateway(
        topic="sensors/t1",
        payload=base64.b64encode(BINARY).decode(),
        qos=1,
        retain=True,
        user_properties=[{"site": "north"}, {"unit": "C"}],
    )
    reply = post_json(server, key, fields, encoding="base64")
    (row,) = table(reply)  # the message as published
    assert row == {
        "topic": "sensors/t1",
        "qos": 1,
        "retain": True,
        "client_id": "gw-1",
        "mountpoint": "",
        "username": "gateway",
    }
    got = sub.expect_message()
    assert (got.topic, got.payload, got.qos, got.retain) == ("sensors/t1", BINARY, 1, False)
    assert got.properties.UserProperty == [("site", "north"), ("unit", "C")]
    assert member.expect_message().payload == BINARY

    # Retained: a subscriber that comes later gets it.
    late = reader(paho_client, server)
    kept = late.expect_message()
    assert (kept.topic, kept.payload, kept.retain) == ("sensors/t1", BINARY, True)

    # The other shape: the parameters in the query, the body as the payload (and PUT).
    raw = post(
        server,
        key,
        b"\x00raw body\xff",
        "application/octet-stream",
        method="PUT",
        topic="sensors/t2",
        client_id="gw-2",
        user="gateway",
        password="g-pass",
    )
    assert table(raw)[0]["topic"] == "sensors/t2"
    got = sub.expect_message()
    assert (got.topic, got.payload, got.qos) == ("sensors/t2", b"\x00raw body\xff", 0)


def test_refused_credentials_or_topics_are_401_or_403_and_delivered_to_nobody(secured, paho_client):
    server, key = secured
    sub = reader(paho_client, server)
    wrong_password = post_json(server, key, gateway(topic="sensors/a", password="nope"))
    assert error(wrong_password, 401) == "invalid_credentials"
    nobody = gateway(topic="sensors/b", user="mallory", password="x")
    assert error(post_json(server, key, nobody), 401) == "plugin_chain_exhausted"
    no_login = post_json(server, key, {"topic": "sensors/c", "payload": "x"})
    assert error(no_login, 401) == "plugin_chain_exhausted"
    read_only = gateway(topic="sensors/d", user="reader", password="r-pass")
    assert error(post_json(server, key, read_only), 403) == "plugin_chain_exhausted"
    elsewhere = gateway(topic="elsewhere/e", payload="x")
    assert error(post_json(server, key, elsewhere), 403) == "plugin_chain_exhausted"

    assert table(post_json(server, key, gateway(topic="sensors/ok", payload="ok")))
    assert sub.expect_message().payload == b"ok"  # the first it got: none of the refused


def test_a_bad_request_is_400_saying_what(secured):
    server, key = secured
    cases = [
        ({"payload": "x"}, "topic is required"),
        ({"topic": "sensors/#"}, "'sensors/#' is not a topic to publish to"),
        ({"topic": "$SYS/x"}, "the $SYS tree is the broker's"),
        ({"topic": "a", "qos": 3}, "qos: expected 0, 1 or 2, got 3"),
        ({"topic": "a", "retain": "maybe"}, 'retain: expected true or false, got "maybe"'),
        ({"topic": "a", "user_properties": {"a": "b"}}, "user_properties: expected"),
        ({"topic": "a", "payload": "*", "encoding": "base64"}, "payload: not base64"),
        ({"topic": "a", "payload": "x", "encoding": "hex"}, "encoding: expected plain or base64"),
        ({"topic": 7}, "topic: expected text, got 7"),
    ]
    for fields, says in cases:
        assert error(post_json(server, key, gateway(**fields)), 400).startswith(says), fields
    not_json = post(server, key, b"{nope", "application/json")
    assert error(not_json, 400) == "the body is not JSON"
    assert error(post(server, key, b"", "text/plain"), 400) == "topic is required"


def test_a_publish_to_one_node_reaches_a_subscriber_on_another(
    start_broker, keys_file, tmp_path, paho_client
):
    """Two nodes of a leaderless (swc) cluster in this process: the message goes where
    the subscription is, as an MQTT publish on node a would."""
    key = ApiKeys(str(keys_file)).add(scope=PUBLISH)

    def node(name: str, seeds: list[str]):
        return start_broker(
            broker={"node_name": name, "systree_enabled": False},
            http={"address": "127.0.0.1:0", "api_keys_file": str(keys_file)},
            store={"path": str(tmp_path / name)},
            cluster={"address": "127.0.0.1:0", "metadata": "swc", "seeds": seeds, "swc": SWC},
        )

    a = node("a", [])
    host, port = cluster_of(a).address
    b = node("b", [f"{host}:{port}"])
    sub = paho_client(b)
    assert sub.subscribe("far/#", 1) == [1]
    a.wait_for(lambda: a.broker.routing.has_subscribers("far/x"))  # replicated to a

    assert table(post_json(a, key, {"topic": "far/x", "payload": "over there", "qos": 1}))
    got = sub.expect_message()
    assert (got.topic, got.payload, got.qos) == ("far/x", b"over there", 1)


def test_the_hooks_see_a_client_and_their_modifiers_apply(keyed_broker, paho_client):
    """tests/hooks/sample.py's Recorder as the one plugin (its auth_on_register async):
    the MQTT 5 hooks are called with what the request said, and what they change is what
    is published."""
    answers = {  # for the request's client only (the subscriber is let in as it is)
        "auth_on_register": {
            "client_id": "gw-1",
            "modifiers": {"client_id": "renamed", "max_message_size": 8},
        },
        "auth_on_publish": {"topic": "asked/t", "modifiers": {"topic": "rewritten/t", "qos": 0}},
    }
    recorder = {"async_hooks": ["auth_on_register_m5"], "answers": answers}
    server, key = keyed_broker(
        broker={"allow_anonymous": False, "systree_enabled": False},
        plugins={"rec": {"enabled": True, "module": RECORDER, **recorder}},
    )
    plugin = dict(server.broker.plugins)["rec"]
    sub = paho_client(server, V5)
    assert sub.subscribe("rewritten/#", 1) == [1]

    fields = gateway(topic="asked/t", payload="12345678", qos=1)
    assert table(post_json(server, key, fields))[0] == {
        "topic": "rewritten/t",
        "qos": 0,
        "retain": False,
        "client_id": "renamed",
        "mountpoint": "",
        "username": "gateway",
    }
    got = sub.expect_message()
    assert (got.topic, got.payload, got.qos) == ("rewritten/t", b"12345678", 0)
    register = plugin.wait("auth_on_register_m5", client_id="gw-1")
    assert (register.username, register.password) == ("gateway", b"g-pass")
    assert (register.protocol_level, register.listener_type) == (5, "http")
    assert register.peer[0] == register.listener_addr == "127.0.0.1"
    assert register.listener_port == server.broker.http.address[1]
    asked = plugin.wait("auth_on_publish_m5", client_id="renamed")
    assert (asked.topic, asked.qos, asked.session_id) == ("asked/t", 1, register.session_id)
    assert plugin.wait("on_publish_m5", client_id="renamed").topic == "rewritten/t"
    assert "on_register_m5" not in plugin.names(client_id="renamed")  # no session made

    too_large = post_json(server, key, gateway(topic="asked/t", payload="123456789"))
    assert error(too_large, 400) == "the payload is larger than this client's limit (8)"


def test_a_publish_goes_to_the_mountpoint_it_names(keyed_broker, paho_client):
    """The request's `mountpoint` is the tree it publishes in (docs/operations.md,
    Mountpoints): a subscriber on that listener's tree gets it, the default tree's not."""
    listeners = [{"address": "127.0.0.1:0"}, {"address": "127.0.0.1:0", "mountpoint": "t-a"}]
    server, key = keyed_broker(listeners=listeners)
    default = paho_client(server, V5)
    default.subscribe("#", 1)
    tenant = PahoClient(*server.broker.listening[1], V5)
    try:
        tenant.connect()
        tenant.subscribe("#", 1)
        reply = post_json(server, key, {"topic": "x/y", "payload": "hi", "mountpoint": "t-a"})
        assert table(reply)[0]["mountpoint"] == "t-a"
        got = tenant.expect_message()
        assert (got.topic, got.payload) == ("x/y", b"hi")
        default.expect_no_message()
        bad = post_json(server, key, {"topic": "x", "payload": "", "mountpoint": "a/b"})
        assert "mountpoint" in error(bad, 400)
    finally:
        tenant.close()
