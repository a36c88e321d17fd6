"""Heartbeats: the relay's own event, the broker's clock, appended while the broker is
quiet and when a reader asks for one, so that readers' event time moves on without
traffic (a Spark query's last windows close: tests/spark/test_windows.py)."""

from __future__ import annotations

import time

import msgpack
import pytest

from broker.config import ConfigError
from event_relay.cli import _types
from event_relay.config import RelayConfig, check
from event_relay.schema import CODES, HEARTBEAT, HOOK_NAMES, decode_event, expand
from spark_consumers.relay import RelayConnection
from tests.broker.helpers import unique_id

from .conftest import RELAY


def in_log(relay) -> list[dict]:
    """The relay's events (call it on the broker's loop: server.call, server.wait_for)."""
    records, _ = relay.log.read(relay.log.first_seq, 1_000_000)
    return [decode_event(e) for e in expand([msgpack.unpackb(r) for r in records])]


def logged(server, relay) -> list[dict]:
    result: list[dict] = server.call(lambda: in_log(relay))
    return result


def test_a_quiet_broker_appends_heartbeats_with_its_clock(start_broker, raw_client):
    server = start_broker(event_relay={**RELAY, "heartbeat_interval": 0.05})
    relay = dict(server.broker.plugins)["event_relay"]
    client = raw_client(server)
    client.connect(unique_id("before"))  # events, then quiet
    before = time.time_ns()
    server.wait_for(
        lambda: sum(e["type"] == "heartbeat" for e in in_log(relay) if e["ts"] > before) >= 2
    )
    events = logged(server, relay)
    beats = [e for e in events if e["type"] == "heartbeat"]
    assert all(
        (e["client_id"], e["mountpoint"], e["username"], e["session_id"]) == (None, "", None, None)
        for e in beats
    )
    assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[-1]["seq"] + 1))
    assert [e["ts"] for e in beats] == sorted(e["ts"] for e in beats)
    assert beats[-1]["ts"] <= time.time_ns()


def test_a_reader_that_asks_gets_a_heartbeat_after_everything_so_far(start_broker):
    server = start_broker(event_relay=RELAY)  # none by themselves
    relay = dict(server.broker.plugins)["event_relay"]
    host, port = relay.server.address
    connection = RelayConnection(f"{host}:{port}", "reader")
    try:
        plain = connection.info()
        asked = connection.info(heartbeat=True)
    finally:
        connection.close()
    assert asked["next_seq"] == plain["next_seq"] + 1
    last = logged(server, relay)[-1]
    assert (last["seq"], last["type"]) == (plain["next_seq"], "heartbeat")


def test_heartbeats_are_an_event_type_not_a_hook():
    assert CODES["heartbeat"] == HEARTBEAT and "heartbeat" not in HOOK_NAMES
    with pytest.raises(ConfigError, match=r"event_relay\.hooks: 'heartbeat' is not an event hook"):
        check(RelayConfig(hooks=["heartbeat"]))
    # `nautilus events tail` shows them only when asked.
    assert _types(None) == list(HOOK_NAMES)
    assert _types("heartbeat,on_publish") == ["heartbeat", "on_publish"]
