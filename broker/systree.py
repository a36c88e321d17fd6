"""The $SYS tree: the broker's metrics published as MQTT messages (VerneMQ's vmq_systree).

Every `systree_interval` seconds each counter of `Metrics` and each gauge of `Broker.gauges()` is
published to `$SYS/<node_name>/<metric name with "_" as "/">`, the payload being the value
as decimal ASCII: `mqtt_publish_received` goes to `$SYS/nautilus/mqtt/publish/received`.
The plugins' figures (their `metrics()`) follow, a label's value as one more level:
`vmq_bridge_connected{name="cloud"}` goes to `$SYS/nautilus/vmq/bridge/connected/cloud`.
The messages go through the broker's routing, so they reach the subscriptions that match and
no others: "#" and "+/..." never match a topic starting with "$" [MQTT-4.7.2-1], while
"$SYS/#" does. They are sent at `systree_qos` and retained when `systree_retain` is on.

One `loop.call_at` handle re-arms itself (no task sleeps), and each topic string is built
once per metric name. The first round goes out one interval after `start()`, as in VerneMQ.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from broker.message import Message
from broker.mountpoints import inside

if TYPE_CHECKING:
    from broker.config import BrokerSettings
    from broker.metrics import Metrics
    from broker.retain import RetainedMessages
    from hooks import PluginDoors

log = logging.getLogger("nautilus.systree")

DEFAULT_NODE = "nautilus"
DEFAULT_INTERVAL = 20  # seconds; VerneMQ's 20000 ms


def check_node_name(node: str) -> str:
    """A node name is one topic level: not empty, no '/', no wildcard, no NUL."""
    if not node or any(c in node for c in "/+#\0"):
        raise ValueError(f"node_name: {node!r} must be one topic level, without '/', '+', '#'")
    return node


class ReportedNode(Protocol):
    """The node the tree reports on: its figures, and its way to publish them (the
    Broker)."""

    settings: BrokerSettings
    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    retained: RetainedMessages  # what an earlier run left under $SYS
    doors: PluginDoors  # the plugins' metrics() go in the tree too

    def gauges(self) -> dict[str, float]: ...

    def publish(self, message: Message) -> object: ...


class SysTree:
    """Publishes `values()` under `$SYS/<node>/` every `interval` seconds while started.

    The keyword arguments override the broker's settings (tests use short intervals);
    `interval` 0, or `systree_enabled = false`, turns the tree off.
    """

    __slots__ = ("_due", "_handle", "_topics", "broker", "interval", "prefix", "qos", "retain")

    def __init__(
        self,
        broker: ReportedNode,
        *,
        interval: float | None = None,
        node: str | None = None,
        qos: int | None = None,
        retain: bool | None = None,
    ) -> None:
        settings = broker.settings
        if interval is None:
            interval = getattr(settings, "systree_interval", DEFAULT_INTERVAL)
            if not getattr(settings, "systree_enabled", True):
                interval = 0
        node = getattr(settings, "node_name", DEFAULT_NODE) if node is None else node
        self.broker = broker
        self.interval = interval
        # In the tree of `systree_mountpoint` (VerneMQ's), "" the default one.
        tree = getattr(settings, "systree_mountpoint", "")
        self.prefix = inside(tree, f"$SYS/{check_node_name(node)}/")
        self.qos = getattr(settings, "systree_qos", 0) if qos is None else qos
        self.retain = getattr(settings, "systree_retain", False) if retain is None else retain
        self._topics: dict[str, str] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        if not self.retain:
            self._clear_retained()
        if self.interval > 0 and self._handle is None:
            self._due = self.broker.loop.time() + self.interval
            self._handle = self.broker.loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _clear_retained(self) -> None:
        """Drop retained values a run with `systree_retain` on left in the store: no client
        may publish under $SYS, so none could clear them."""
        for message in self.broker.retained.matching(self.prefix + "#", self.broker.loop.time()):
            self.broker.publish(Message(message.topic, b"", 0, True))

    def _tick(self) -> None:
        try:
            self.publish()
        except Exception:  # a bad round must not end the tree
            log.exception("publishing the $SYS tree failed")
        # Keep the cadence of the due times; a loop that fell a round behind skips it.
        loop = self.broker.loop
        due = self._due + self.interval
        self._due = due if due > loop.time() else loop.time() + self.interval
        self._handle = loop.call_at(self._due, self._tick)

    def values(self) -> dict[str, float]:
        values: dict[str, float] = {**self.broker.metrics.snapshot()}
        values.update(self.broker.gauges())
        return values

    def topic(self, name: str) -> str:
        """`$SYS/<node>/mqtt/publish/received` for `mqtt_publish_received`, built once."""
        topic = self._topics.get(name)
        if topic is None:
            topic = self._topics[name] = self.prefix + name.replace("_", "/")
        return topic

    def plugin_values(self) -> dict[str, int]:
        """The plugins' figures (their `metrics()`, as on /metrics) by topic: a label's
        value is one more level (`$SYS/<node>/vmq/bridge/connected/<name>`)."""
        found: dict[str, int] = {}
        for _, report in self.broker.doors.metrics:
            try:
                metrics = list(report())
            except Exception:  # a plugin's bug must not end the tree (/metrics says it)
                continue
            for metric in metrics:
                levels = [self.topic(metric.name), *(value for _, value in metric.labels)]
                found["/".join(levels)] = int(metric.value)
        return found

    def publish(self) -> None:
        """Publish one round now: every value, through the broker's normal routing."""
        publish, qos, retain = self.broker.publish, self.qos, self.retain
        for name, value in self.values().items():
            payload = b"%d" % value if isinstance(value, int) else b"%.6f" % value
            publish(Message(self.topic(name), payload, qos, retain))
        for topic, value in self.plugin_values().items():
            publish(Message(topic, b"%d" % value, qos, retain))
