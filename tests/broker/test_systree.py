"""The $SYS tree: metrics published under $SYS/<node>/... every systree_interval.

The network tests use real paho clients; the cadence tests drive a fake loop's clock by
hand, so no test waits for a timer longer than the broker's one-second minimum interval.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from broker.config import config_from_dict
from broker.message import Message
from broker.metrics import Metrics
from broker.server import Broker
from broker.systree import SysTree, check_node_name

from .helpers import TIMEOUT, V5

GAUGES = [
    "active_mqtt_connections",
    "active_mqttws_connections",
    "total_active_connections",
    "queue_processes",
    "sessions_offline",
    "router_subscriptions",
    "retain_messages",
    "gc_pause_seconds_max",
    "gc_frozen_objects",
]
NAMES = [*Metrics().snapshot(), *GAUGES]  # the order of one round
DECIMAL = re.compile(rb"0|[1-9][0-9]*|[0-9]+\.[0-9]{6}")  # (seconds: gc_pause_seconds_max)


def sys_topic(name: str, node: str = "nautilus") -> str:
    return f"$SYS/{node}/{name.replace('_', '/')}"


def install(server, **kwargs) -> SysTree:
    """Replace the broker's $SYS tree by one with these settings (on the broker's loop)."""

    def swap() -> SysTree:
        server.broker.systree.stop()
        server.broker.systree = SysTree(server.broker, **kwargs)
        server.broker.systree.start()
        return server.broker.systree

    return server.call(swap)


def wait_for_round(client, node: str, want: dict[str, int]) -> dict[str, bytes]:
    """The first complete round of $SYS values (name -> payload) that has the `want`ed
    values; rounds arrive in NAMES order, so a round ends with its last name."""
    first, last = sys_topic(NAMES[0], node), sys_topic(NAMES[-1], node)
    by_topic = {sys_topic(name, node): name for name in NAMES}
    deadline = time.monotonic() + TIMEOUT
    current: dict[str, bytes] = {}
    while time.monotonic() < deadline:
        msg = client.expect_message(max(deadline - time.monotonic(), 0.01))
        if msg.topic == first:
            current = {}
        current[by_topic[msg.topic]] = msg.payload
        complete = msg.topic == last and len(current) == len(NAMES)
        if complete and all(current[name] == b"%d" % value for name, value in want.items()):
            return current
    raise AssertionError(f"no round with {want}; the last one: {current}")


# --------------------------------------------------------------------------- with clients


def test_sys_subscriber_receives_every_metric(start_broker, paho_client):
    server = start_broker(broker={"systree_interval": 1, "node_name": "n1"})
    sub = paho_client(server)
    sub.subscribe("$SYS/#", 0)
    pub = paho_client(server)
    for i in range(3):
        pub.publish("plain/t", b"%d" % i, qos=1)
    got = wait_for_round(sub, "n1", {"mqtt_publish_received": 3})
    assert list(got) == NAMES
    assert all(DECIMAL.fullmatch(payload) for payload in got.values()), got


def test_values_are_the_broker_counters_and_state(broker, paho_client):
    sub = paho_client(broker)
    sub.subscribe("$SYS/#", 0)
    offline = paho_client(broker, clean=False)
    offline.subscribe("off/t", 1)
    offline.disconnect()
    pub = paho_client(broker, V5)
    pub.publish("kept/1", b"a", qos=1, retain=True)
    pub.publish("kept/2", b"b", qos=1, retain=True)
    pub.publish("off/t", b"queued", qos=1)
    install(broker, interval=0.05, node="unit")
    got = wait_for_round(
        sub,
        "unit",
        {
            "mqtt_publish_received": 3,
            "mqtt_connect_received": 3,
            "active_mqtt_connections": 2,
            "active_mqttws_connections": 0,
            "total_active_connections": 2,
            "queue_processes": 3,
            "sessions_offline": 1,
            "router_subscriptions": 2,
            "retain_messages": 2,
        },
    )
    assert int(got["bytes_received"]) > 0


@pytest.mark.parametrize("version", [4, V5])
def test_wildcard_subscribers_get_no_sys_topics(broker, paho_client, version):
    # [MQTT-4.7.2-1]: '#' and '+' at the first level do not match topics starting with '$'.
    wild = paho_client(broker, version)
    wild.subscribe([("#", 0), ("+/nautilus/mqtt/publish/received", 0)])
    sub = paho_client(broker)
    sub.subscribe("$SYS/+/mqtt/publish/received", 0)
    install(broker, interval=0.05)
    sub.expect_message()  # a round was routed, to `wild` too if it matched
    pub = paho_client(broker)
    pub.publish("plain/t", b"sentinel", qos=1)
    assert [m.topic for m in wild.collect_until(b"sentinel")] == ["plain/t"]


@pytest.mark.parametrize("retain", [True, False])
def test_retain_flag_follows_config(broker, paho_client, retain):
    server = broker
    topic = sys_topic("mqtt_publish_received")
    live = paho_client(server, V5)
    live.subscribe(topic, options=SubscribeOptions(qos=0, retainAsPublished=True))
    install(server, interval=0.05, retain=retain)
    msg = live.expect_message()
    assert (msg.topic, msg.retain) == (topic, retain)
    assert DECIMAL.fullmatch(msg.payload)
    kept = server.call(
        lambda: [
            m.topic for m in server.broker.retained.matching("$SYS/#", server.broker.loop.time())
        ]
    )
    assert (len(kept) == len(NAMES)) if retain else kept == []
    if retain:
        late = paho_client(server)
        late.subscribe(topic, 0)
        msg = late.expect_message()
        assert (msg.topic, msg.retain) == (topic, True)


def test_qos_follows_config(broker, paho_client):
    sub = paho_client(broker)
    sub.subscribe("$SYS/+/retain/messages", 2)
    install(broker, interval=0.05, qos=1)
    msg = sub.expect_message()
    assert (msg.payload, msg.qos) == (b"0", 1)


@pytest.mark.parametrize(
    ("settings", "running"),
    [
        ({}, True),
        ({"systree_interval": 0}, False),
        ({"systree_enabled": False}, False),
    ],
)
def test_interval_zero_or_disabled_publishes_nothing(start_broker, settings, running):
    server = start_broker(broker=settings)
    assert server.call(lambda: server.broker.systree.running) is running
    server.stop()
    assert not server.broker.systree.running  # stopped with the broker


# --------------------------------------------------------------------------- by hand


@dataclass
class FakeHandle:
    when: float
    callback: object
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeLoop:
    """The two loop methods SysTree uses, with a clock the test moves."""

    now: float = 1000.0
    handles: list[FakeHandle] = field(default_factory=list)

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback) -> FakeHandle:
        handle = FakeHandle(when, callback)
        self.handles.append(handle)
        return handle

    def advance(self, seconds: float) -> None:
        """Move the clock, firing each due handle once per pass (as a late loop does)."""
        self.now += seconds
        due = [h for h in self.handles if h.when <= self.now and not h.cancelled]
        self.handles = [h for h in self.handles if h not in due and not h.cancelled]
        for handle in due:
            handle.callback()


@pytest.fixture
def idle_broker():
    """A Broker that is built but never started, publishing into a list."""
    loop = asyncio.new_event_loop()
    broker = Broker(config_from_dict({"store": {"backend": "memory"}}), loop=loop)
    broker.loop = FakeLoop()
    broker.published = []
    broker.publish = broker.published.append
    yield broker
    loop.close()


def test_rounds_follow_the_interval_and_stop(idle_broker):
    tree = SysTree(idle_broker, interval=20)
    tree.start()
    tree.start()  # idempotent: one timer
    idle_broker.loop.advance(19.9)
    assert idle_broker.published == []
    idle_broker.loop.advance(0.1)
    assert [m.topic for m in idle_broker.published] == [tree.topic(n) for n in NAMES]
    idle_broker.loop.advance(20)
    assert len(idle_broker.published) == 2 * len(NAMES)
    tree.stop()
    idle_broker.loop.advance(60)
    assert len(idle_broker.published) == 2 * len(NAMES)
    assert not tree.running


def test_a_late_loop_skips_rounds_instead_of_bunching_them(idle_broker):
    tree = SysTree(idle_broker, interval=20)
    tree.start()
    idle_broker.loop.advance(65)  # three rounds late: one round now, the next in 20 s
    assert len(idle_broker.published) == len(NAMES)
    assert [h.when for h in idle_broker.loop.handles] == [idle_broker.loop.now + 20]


def test_a_failing_round_keeps_the_timer(idle_broker, caplog):
    def fail(message):
        raise RuntimeError("boom")

    idle_broker.publish = fail
    tree = SysTree(idle_broker, interval=5)
    tree.start()
    idle_broker.loop.advance(5)
    assert tree.running and "publishing the $SYS tree failed" in caplog.text


def test_message_shape_and_topic_cache(idle_broker):
    idle_broker.metrics.mqtt_publish_received = 1234
    tree = SysTree(idle_broker, interval=1, node="VerneMQ@127.0.0.1", qos=1, retain=True)
    tree.publish()
    by_topic = {m.topic: m for m in idle_broker.published}
    msg = by_topic["$SYS/VerneMQ@127.0.0.1/mqtt/publish/received"]
    assert (msg.payload, msg.qos, msg.retain) == (b"1234", 1, True)
    assert tree.topic("mqtt_publish_received") is tree.topic("mqtt_publish_received")


def test_settings_are_read_from_the_config(idle_broker):
    tree = SysTree(idle_broker)
    assert (tree.interval, tree.prefix, tree.qos, tree.retain) == (20, "$SYS/nautilus/", 0, False)
    settings = {
        "node_name": "n2",
        "systree_interval": "1m",
        "systree_qos": 2,
        "systree_retain": True,
    }
    idle_broker.settings = config_from_dict({"broker": settings}).broker
    tree = SysTree(idle_broker)
    assert (tree.interval, tree.prefix, tree.qos, tree.retain) == (60, "$SYS/n2/", 2, True)


@pytest.mark.parametrize("node", ["", "a/b", "a+", "#"])
def test_node_name_must_be_one_topic_level(node):
    with pytest.raises(ValueError, match="node_name"):
        check_node_name(node)


@pytest.mark.parametrize("retain", [True, False])
def test_retained_values_of_an_earlier_run_are_cleared_unless_retaining(idle_broker, retain):
    del idle_broker.publish  # the real routing, so the retained store is updated
    idle_broker.retained.update(Message(sys_topic("bytes_sent"), b"7", 0, True))
    idle_broker.retained.update(Message("$SYS/other/bytes/sent", b"8", 0, True))
    SysTree(idle_broker, interval=0, retain=retain).start()
    kept = sorted(m.topic for m in idle_broker.retained.matching("$SYS/#", 0.0))
    other = ["$SYS/other/bytes/sent"]
    assert kept == (sorted([sys_topic("bytes_sent"), *other]) if retain else other)
