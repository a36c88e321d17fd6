"""Kept auth_on_publish answers (hooks/decisions.py, broker/ingress.py) in a real broker
with real clients: the chain is asked once per (connection, topic, QoS, retain) while its
answer holds, and every way an answer stops holding takes effect for the connected
client's next message: its time (a plugin's cache_for, a token's exp), an ACL file
reload, `nautilus admin auth invalidate`."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from tests.broker.helpers import V5, VERSIONS
from tests.http.conftest import api, keyed_broker, keys_file
from tests.http.test_commands import admin
from tests.plugins.acl.helpers import write_acl

__all__ = ["keyed_broker", "keys_file"]  # fixtures, used by name

GATE = {"gate": {"enabled": True, "module": "tests.broker.kept_plugins:Gate"}}


def plugin(server: Any, name: str) -> Any:
    return dict(server.broker.plugins)[name]


def delivered(sub: Any, pub: Any, topic: str) -> bool:
    """Whether `pub`'s next message to `topic` reaches `sub` (a sentinel after it tells)."""
    pub.publish(topic, b"probe", qos=1)
    pub.publish("sentinel", b"end", qos=1)
    return any(m.topic == topic for m in sub.collect_until(b"end"))


def subscriber(paho_client: Any, server: Any) -> Any:
    sub = paho_client(server, V5)
    assert sub.subscribe("#", 1) == [1]
    return sub


@pytest.mark.parametrize("version", VERSIONS)
def test_the_chain_is_asked_once_while_its_answer_holds(start_broker, paho_client, version):
    server = start_broker(plugins=GATE)
    sub = subscriber(paho_client, server)
    pub = paho_client(server, version)
    for qos in (0, 1, 0, 1):
        for i in range(20):
            pub.publish("open", str(i).encode(), qos=qos)
    pub.publish("sentinel", b"end", qos=1)
    got = sub.collect_until(b"end")
    assert len(got) == 81
    assert plugin(server, "gate").asked == 3  # open at QoS 0, at QoS 1, sentinel at QoS 1


def test_a_plugin_that_says_nothing_is_asked_every_time(start_broker, paho_client):
    server = start_broker(plugins=GATE)
    gate = plugin(server, "gate")
    server.call(setattr, gate, "cache_for", None)
    sub = subscriber(paho_client, server)
    pub = paho_client(server, V5)
    for _ in range(10):
        pub.publish("open", b"x")
    pub.publish("sentinel", b"end", qos=1)
    assert len(sub.collect_until(b"end")) == 11
    assert gate.asked == 11


def test_a_kept_denial_is_a_denial(start_broker, paho_client):
    server = start_broker(plugins=GATE)
    sub = subscriber(paho_client, server)
    pub = paho_client(server, V5)
    assert not delivered(sub, pub, "closed")
    assert not delivered(sub, pub, "closed")
    assert plugin(server, "gate").asked == 2  # closed once, sentinel once


def test_an_answer_holds_for_its_time_only(start_broker, paho_client):
    server = start_broker(plugins=GATE)
    gate = plugin(server, "gate")
    server.call(setattr, gate, "cache_for", 30)
    sub = subscriber(paho_client, server)
    pub = paho_client(server, V5)
    assert delivered(sub, pub, "open")
    server.call(gate.allowed.discard, "open")
    assert delivered(sub, pub, "open")  # kept: the plugin promised 30 s
    server.advance(31)
    assert not delivered(sub, pub, "open")


def test_admin_auth_invalidate_forgets_kept_answers(keyed_broker, paho_client, tmp_path):
    server, key = keyed_broker(plugins=GATE)
    gate = plugin(server, "gate")
    sub = subscriber(paho_client, server)
    pub = paho_client(server, V5)
    assert delivered(sub, pub, "open")
    server.call(gate.allowed.discard, "open")
    assert delivered(sub, pub, "open")  # kept
    done = admin(server, "--json", "auth", "invalidate", "--all", key=key, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["table"] == [{"plugin": "broker", "clients": 1}]  # the publisher
    assert not delivered(sub, pub, "open")


def test_disabling_a_plugin_forgets_the_kept_answers(keyed_broker, paho_client):
    asked = {"asked": {"enabled": True, "module": "tests.broker.kept_plugins:Asked"}}
    server, key = keyed_broker(plugins={**asked, **GATE})
    sub = subscriber(paho_client, server)
    pub = paho_client(server, V5)
    assert delivered(sub, pub, "open")  # kept: asked says next, the gate allows
    api(server, "plugin/disable", key, method="POST", name="gate")
    pub.publish("open", b"while disabled", qos=1)  # asked alone: nobody allows it
    api(server, "plugin/enable", key, method="POST", name="gate")
    pub.publish("sentinel", b"end", qos=1)
    assert [m.payload for m in sub.collect_until(b"end")] == [b"end"]


def acl_broker(start_broker: Any, path: Any, **plugins: Any) -> Any:
    acl = {"enabled": True, "acl_file": str(path), "acl_reload_interval": 1}
    broker = {"allow_anonymous": "claims" not in plugins}  # claims: it authenticates
    return start_broker(broker=broker, plugins={**plugins, "acl": acl})


def reload_acl(server: Any, path: Any, text: str) -> None:
    """Rewrite the ACL file and wait until the plugin took the new rules."""
    acl = plugin(server, "acl")
    old = acl.rules
    write_acl(path, text)
    server.wait_for(lambda: acl.rules is not old)


def test_an_acl_reload_takes_effect_for_the_next_message(start_broker, paho_client, tmp_path):
    path = write_acl(tmp_path / "acl", "topic #\n")
    server = acl_broker(start_broker, path)
    sub = subscriber(paho_client, server)
    pub = paho_client(server, V5)
    assert delivered(sub, pub, "a/b")
    reload_acl(server, path, "topic read #\ntopic write sentinel\n")
    assert not delivered(sub, pub, "a/b")
    reload_acl(server, path, "topic #\n")
    assert delivered(sub, pub, "a/b")


def test_a_token_s_expiry_ends_the_kept_answer(start_broker, paho_client, tmp_path):
    path = write_acl(tmp_path / "acl", "topic #\n")
    claims = {"enabled": True, "module": "tests.plugins.acl.helpers:ClaimsFromPassword"}
    asked = {"enabled": True, "module": "tests.broker.kept_plugins:Asked"}
    server = acl_broker(start_broker, path, claims=claims, asked=asked)
    sub = paho_client(server, V5, username="u", password="{}")
    assert sub.subscribe("#", 1) == [1]
    token = json.dumps({"exp": int(time.time()) + 60})
    pub = paho_client(server, V5, username="u", password=token)
    counter = plugin(server, "asked")
    assert delivered(sub, pub, "a/b") and delivered(sub, pub, "a/b")
    before = counter.asked
    server.advance(61)  # past the token's exp: the answer made with its claims is gone
    assert delivered(sub, pub, "a/b")
    assert counter.asked == before + 2  # a/b asked again (and the sentinel's, also kept)


def test_a_rule_change_mid_flood_stops_the_denied_topic(start_broker, paho_client, tmp_path):
    """A QoS 0 flood to two topics on the fast path; the file is rewritten to deny one:
    within one reload interval it stops, and no message of it follows a marker the
    publisher sends once the new rules are in."""
    path = write_acl(tmp_path / "acl", "topic #\n")
    server = acl_broker(start_broker, path)
    sub = paho_client(server, V5)
    assert sub.subscribe("flood/#", 0) == [0]
    pub = paho_client(server, V5)
    mark = threading.Event()
    stop = threading.Event()

    def flood() -> None:
        assert pub.client is not None
        seq = 0
        while not stop.is_set():
            for topic in ("flood/a", "flood/b"):
                pub.client.publish(topic, str(seq).encode())
            seq += 1
            if mark.is_set():
                pub.client.publish("flood/a", b"marker")
                mark.clear()
            if seq % 200 == 0:
                pub.client.publish("flood/a", b"pace", qos=1).wait_for_publish(5)

    flooding = threading.Thread(target=flood, daemon=True)
    flooding.start()
    try:
        assert any(m.topic == "flood/b" for m in sub.collect_until(b"pace"))
        written = time.monotonic()
        reload_acl(server, path, "topic write flood/a\ntopic read flood/#\n")
        assert time.monotonic() - written < 1 + 1.5  # one interval, and the re-read's time
        mark.set()
        after = sub.collect_until(b"marker")  # in order: all sent before the marker
        later = sub.collect_until(b"pace") + sub.collect_until(b"pace")
    finally:
        stop.set()
        flooding.join(10)
    assert all(m.topic == "flood/a" for m in later)
    assert any(m.payload not in (b"pace", b"marker") for m in later)  # still flooding a
    assert after  # the flood went on through the reload
