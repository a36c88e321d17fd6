"""Event hooks through a real broker: each body as VerneMQ posts it, and a slow or broken
endpoint never holding up the clients."""

from __future__ import annotations

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.broker.helpers import V5, V311

from .conftest import Answer, b64, plugin_of, settle_events


def events(hook_server, *hooks: str) -> list[dict]:
    return [{"hook": hook, "url": hook_server.answer(f"/{hook}", {})} for hook in hooks]


def body_of(hook_server, hook: str) -> dict:
    recorded = hook_server.expect(f"/{hook}")
    assert recorded.method == "POST"
    assert recorded.hook == hook
    assert recorded.headers["Content-Type"] == "application/json"
    return recorded.json


def test_v4_event_bodies(hook_server, webhooks_broker, paho_client):
    hooks = (
        "on_register",
        "on_client_wakeup",
        "on_subscribe",
        "on_publish",
        "on_unsubscribe",
        "on_offline_message",
        "on_client_offline",
        "on_client_gone",
    )
    server = webhooks_broker(
        *events(hook_server, *hooks),
        anonymous=True,
        broker={"persistent_client_expiration": "1h"},
    )
    sub = paho_client(server, V311, "ev-sub", clean=False)
    assert body_of(hook_server, "on_client_wakeup") == {"mountpoint": "", "client_id": "ev-sub"}
    register = body_of(hook_server, "on_register")
    assert isinstance(register.pop("peer_port"), int)
    assert register == {
        "peer_addr": "127.0.0.1",
        "mountpoint": "",
        "client_id": "ev-sub",
        "username": None,
    }

    assert sub.subscribe("ev/#", 1) == [1]
    assert body_of(hook_server, "on_subscribe") == {
        "username": None,
        "mountpoint": "",
        "client_id": "ev-sub",
        "topics": [{"topic": "ev/#", "qos": 1}],
    }
    sub.unsubscribe("no/such")
    assert body_of(hook_server, "on_unsubscribe") == {
        "username": None,
        "mountpoint": "",
        "client_id": "ev-sub",
        "topics": ["no/such"],
    }

    pub = paho_client(server, V311, "ev-pub")
    pub.publish("ev/1", b"\x01online", qos=1, retain=False)
    assert body_of(hook_server, "on_publish") == {
        "username": None,
        "mountpoint": "",
        "client_id": "ev-pub",
        "qos": 1,
        "topic": "ev/1",
        "payload": b64(b"\x01online"),
        "retain": False,
    }
    assert sub.expect_message().payload == b"\x01online"

    sub.disconnect()
    assert body_of(hook_server, "on_client_offline") == {"mountpoint": "", "client_id": "ev-sub"}
    pub.publish("ev/2", b"queued", qos=1)
    body_of(hook_server, "on_publish")
    assert body_of(hook_server, "on_offline_message") == {
        "mountpoint": "",
        "client_id": "ev-sub",
        "qos": 1,
        "topic": "ev/2",
        "payload": b64(b"queued"),
        "retain": False,
    }
    pub.disconnect()  # a clean session ends with its connection
    assert body_of(hook_server, "on_client_gone") == {"mountpoint": "", "client_id": "ev-pub"}


def test_m5_event_bodies(hook_server, webhooks_broker, paho_client):
    hooks = ("on_register_m5", "on_subscribe_m5", "on_publish_m5", "on_session_expired")
    server = webhooks_broker(*events(hook_server, *hooks), anonymous=True)
    sub = paho_client(
        server, V5, "ev5", session_expiry=1, properties={"UserProperty": [("k", "v")]}
    )
    register = body_of(hook_server, "on_register_m5")
    register.pop("peer_port")
    assert register == {
        "peer_addr": "127.0.0.1",
        "mountpoint": "",
        "client_id": "ev5",
        "username": None,
        "properties": {
            "p_session_expiry_interval": 1,
            "p_user_property": [{"key": b64("k"), "val": b64("v")}],
        },
    }
    sub.subscribe("m5/#", 2)
    assert body_of(hook_server, "on_subscribe_m5")["topics"] == [
        {
            "topic": "m5/#",
            "qos": 2,
            "no_local": False,
            "rap": False,
            "retain_handling": "send_retain",
        }
    ]
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = "text/plain"
    props.UserProperty = [("a", "b")]
    sub.publish("m5/x", b"hi", qos=1, properties=props)
    published = body_of(hook_server, "on_publish_m5")
    assert published["payload"] == b64(b"hi")
    assert published["properties"] == {
        "p_content_type": "text/plain",
        "p_user_property": [{"key": b64("a"), "val": b64("b")}],
    }
    sub.disconnect()
    # The session outlives its connection by one second, then the event comes.
    assert body_of(hook_server, "on_session_expired") == {"mountpoint": "", "client_id": "ev5"}


def test_failing_event_endpoint_does_not_hold_up_clients(hook_server, webhooks_broker, paho_client):
    url = hook_server.answer("/on_publish", Answer({}, status=500))
    server = webhooks_broker({"hook": "on_publish", "url": url}, anonymous=True)
    client = paho_client(server)
    for i in range(3):
        client.publish("t", str(i).encode(), qos=1)
        hook_server.expect("/on_publish")
    settle_events(server)
    plugin = plugin_of(server)
    assert server.call(lambda: (plugin.counters.requests, plugin.counters.errors)) == (3, 3)


def test_events_beyond_the_bound_are_dropped_and_counted(hook_server, webhooks_broker, paho_client):
    url = hook_server.answer("/on_publish", Answer(hold=True))  # never answers
    server = webhooks_broker(
        {"hook": "on_publish", "url": url}, anonymous=True, max_pending_events=2
    )
    client = paho_client(server)
    for i in range(5):
        client.publish("t", str(i).encode(), qos=1)  # every PUBACK comes at once
    hook_server.expect("/on_publish")
    hook_server.expect("/on_publish")
    plugin = plugin_of(server)
    assert server.call(lambda: (len(plugin._events), plugin.counters.events_dropped)) == (2, 3)
    hook_server.expect_none("/on_publish")
