"""One bridge: a connection to this broker and one to the remote, and the topic rules
between them (VerneMQ's vmq_bridge).

- `out` rules subscribe here to local_prefix + pattern and publish to the remote with the
  prefix swapped; `in` rules subscribe there and publish here; `both` does both. A bridged
  message keeps the lower QoS of its own and the rule's, its retain flag when the rule
  says so, and its MQTT 5 properties when both sides speak 5.
- No echo loops: here the bridge subscribes with no-local; there with no-local (MQTT 5) or
  the bridge bit (try_private, 3.1 / 3.1.1). A remote that refuses the bit is connected
  to again without it, and then what comes back of what the bridge just sent is dropped
  (a loop check by origin).
- The remote is never given up on: a refused CONNECT, a TLS or DNS error, a broker that
  closes are logged once per state change and retried every restart_timeout (+-20%).
  Outgoing messages wait in a buffer of max_outgoing_buffered_messages meanwhile (the
  newest dropped, and counted, when it is full; on disk with persistent_queue); QoS 1 and
  2 ones leave it only when the remote acknowledged them, so a reconnect resends what was
  in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import ssl
import time
from collections import Counter, deque
from typing import Any

from broker.protocol import MQTT5, Connect, Publish, Subscription
from broker.topics import topic_matches
from plugins.bridge.buffer import DiskBuffer, MemoryBuffer
from plugins.bridge.client import Endpoint, MqttClient, MqttError
from plugins.bridge.config import BridgeSettings, TopicRule

log = logging.getLogger("nautilus.bridge")

LOCAL_RETRY = 0.5  # seconds between attempts to reach this broker (starting up)
WINDOW = 100  # QoS 1 and 2 messages unacknowledged by the remote at once
ECHO_SECONDS = 10.0  # how long a message sent out is remembered, to drop its echo
UNSUPPORTED_VERSION = 1  # MQTT 3 CONNACK: "unacceptable protocol version"
RULES_KEPT = 10_000  # topics whose out rule is remembered (all forgotten when full)


class Bridge:
    def __init__(
        self, settings: BridgeSettings, local: Endpoint, node: str, queue_dir: str = ""
    ) -> None:
        self.settings = settings
        self.name = settings.name
        self.local_endpoint = local
        host, _, port = settings.address.rpartition(":")
        self.remote_endpoint = Endpoint(
            host, int(port), _ssl_context(settings), settings.sni or host
        )
        auto = settings.client_id == "auto"
        self.client_id = f"{node}-bridge-{settings.name}" if auto else settings.client_id
        self.outgoing = [r for r in settings.topics if r.direction in ("out", "both")]
        self.incoming = [r for r in settings.topics if r.direction in ("in", "both")]
        bound = settings.max_outgoing_buffered_messages
        self.buffer = (
            DiskBuffer(bound, queue_dir) if settings.persistent_queue else MemoryBuffer(bound)
        )
        self.counts: Counter[str] = Counter()
        self.state = "stopped"  # connecting, connected, retrying, stopped
        self.reason = ""
        self.local_ready = False  # connected here, subscribed to the out rules
        self._local: MqttClient | None = None
        self._remote: MqttClient | None = None
        self._wake = asyncio.Event()
        self._private = settings.try_private and settings.mqtt_version < MQTT5
        # The loop check: when each message went out, oldest first, and per (topic,
        # payload) the times still unmatched by an echo (a lookup per incoming message).
        self._sent: deque[tuple[float, tuple[str, bytes]]] = deque()
        self._unechoed: dict[tuple[str, bytes], deque[float]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._out_rules: dict[str, TopicRule] = {}  # topic -> its rule, as they come

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._local_forever()),
            loop.create_task(self._remote_forever()),
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for client in (self._local, self._remote):
            if client is not None:
                client.close()
        self._local = self._remote = None
        self._set_state("stopped", "")

    # -- this broker's side ---------------------------------------------------------------

    async def _local_forever(self) -> None:
        subscriptions = [
            Subscription(
                r.local_prefix + r.pattern, r.qos, no_local=True, retain_as_published=r.retain
            )
            for r in self.outgoing
        ]
        while True:
            connect = Connect(
                self.client_id,
                MQTT5,
                clean_start=True,
                keepalive=0,
                username=self.settings.local_username or None,
                password=self.settings.local_password.encode() or None,
            )
            try:
                client, connack = await MqttClient.connect(
                    self.local_endpoint, connect, self._from_local
                )
            except MqttError:
                await asyncio.sleep(LOCAL_RETRY)  # the listener is not up yet
                continue
            if connack.reason_code:
                log.error(
                    "bridge %s: this broker refused its CONNECT (0x%02x)",
                    self.name,
                    connack.reason_code,
                )
                client.close()
                await asyncio.sleep(self.settings.restart_timeout)
                continue
            self._local = client
            if subscriptions:
                codes = await client.subscribe(subscriptions)
                for subscription, code in zip(subscriptions, codes, strict=True):
                    if code >= 0x80:  # an ACL here may restrict the bridge, as any client
                        log.error(
                            "bridge %s: this broker refused its subscription to %s (0x%02x)",
                            self.name,
                            subscription.topic_filter,
                            code,
                        )
            self.local_ready = True
            reason = await client.closed
            self._local, self.local_ready = None, False
            log.warning("bridge %s: its connection to this broker ended (%s)", self.name, reason)

    def _from_local(self, message: Publish) -> None:
        rule = self._out_rules.get(message.topic)
        if rule is None:
            rule = _rule_for(self.outgoing, message.topic, local=True)
            if rule is None:
                return
            if len(self._out_rules) >= RULES_KEPT:
                self._out_rules.clear()
            self._out_rules[message.topic] = rule
        remote_v5 = self.settings.mqtt_version == MQTT5
        out = Publish(
            rule.remote_prefix + message.topic[len(rule.local_prefix) :],
            message.payload,
            min(rule.qos, message.qos),
            message.retain and rule.retain,
            properties=dict(message.properties) if remote_v5 else {},
        )
        out.properties.pop(11, None)  # subscription identifiers are this broker's own
        if not self.buffer.put(out):
            self.counts["dropped"] += 1
            return
        self._wake.set()

    # -- the remote side ------------------------------------------------------------------

    async def _remote_forever(self) -> None:
        while True:
            self._set_state("connecting", "")
            try:
                client = await self._connect_remote()
            except MqttError as exc:
                self._set_state("retrying", str(exc))
                await asyncio.sleep(self.settings.restart_timeout * random.uniform(0.8, 1.2))
                continue
            self._remote = client
            self._set_state("connected", "")
            sender = asyncio.get_running_loop().create_task(self._send_forever(client))
            try:
                reason = await client.closed
            finally:  # also when the bridge is stopped: the sender goes with it
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
            self._remote = None
            self._set_state("retrying", reason)
            await asyncio.sleep(self.settings.restart_timeout * random.uniform(0.8, 1.2))

    async def _connect_remote(self) -> MqttClient:
        settings = self.settings
        connect = Connect(
            self.client_id,
            settings.mqtt_version,
            clean_start=settings.clean_session,
            keepalive=int(settings.keepalive_interval),
            username=settings.username or None,
            password=settings.password.encode() or None,
        )
        if settings.mqtt_version == MQTT5 and not settings.clean_session:
            connect.properties[0x11] = 0xFFFFFFFF  # session expiry: the session stays
        client, connack = await MqttClient.connect(
            self.remote_endpoint, connect, self._from_remote, self._private
        )
        if connack.reason_code == UNSUPPORTED_VERSION and self._private:
            client.close()
            log.warning(
                "bridge %s: %s refused the bridge bit (try_private); connecting without it, "
                "with a loop check by origin",
                self.name,
                settings.address,
            )
            self._private = False
            client, connack = await MqttClient.connect(
                self.remote_endpoint, connect, self._from_remote
            )
        if connack.reason_code:
            client.close()
            raise MqttError(
                f"{settings.address} refused the CONNECT (reason 0x{connack.reason_code:02x})"
            )
        subscriptions = [
            Subscription(
                r.remote_prefix + r.pattern, r.qos, no_local=True, retain_as_published=r.retain
            )
            for r in self.incoming
        ]
        if subscriptions:
            codes = await client.subscribe(subscriptions)
            for subscription, code in zip(subscriptions, codes, strict=True):
                if code >= 0x80:
                    log.error(
                        "bridge %s: %s refused the subscription to %s (0x%02x)",
                        self.name,
                        settings.address,
                        subscription.topic_filter,
                        code,
                    )
        return client

    def _from_remote(self, message: Publish) -> None:
        rule = _rule_for(self.incoming, message.topic, local=False)
        local = self._local
        if rule is None or local is None or self._echo(message):
            return
        self.counts[f"publish_in_{message.qos}"] += 1
        into = Publish(
            rule.local_prefix + message.topic[len(rule.remote_prefix) :],
            message.payload,
            min(rule.qos, message.qos),
            message.retain and rule.retain,
            properties=dict(message.properties) if self.settings.mqtt_version == MQTT5 else {},
        )
        into.properties.pop(11, None)
        if into.qos == 0:
            asyncio.get_running_loop().create_task(local.publish(into))
        else:
            asyncio.get_running_loop().create_task(_quietly(local.publish(into)))

    async def _send_forever(self, remote: MqttClient) -> None:
        inflight: set[asyncio.Task[None]] = set()
        while True:
            at_once: list[Publish] = []  # QoS 0: written together, nothing to wait for
            while self.buffer and len(inflight) < WINDOW:
                token, message = self.buffer.take()
                if message.qos == 0:
                    at_once.append(message)
                    self.buffer.done(token)
                    self._sent_now(message)
                    continue
                sending = self._send_one(remote, token, message)
                task = asyncio.get_running_loop().create_task(sending)
                inflight.add(task)
                task.add_done_callback(inflight.discard)
            if at_once:
                remote.publish_now(at_once)
                self.counts["publish_out_0"] += len(at_once)
                continue  # more may have come meanwhile
            self._wake.clear()
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait([woken, *inflight], return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()

    async def _send_one(self, remote: MqttClient, token: int, message: Publish) -> None:
        try:
            self._sent_now(message)
            await remote.publish(dataclasses.replace(message, packet_id=None))
        except (MqttError, asyncio.CancelledError):
            self.buffer.back(token)  # sent again once connected again
            raise
        self.buffer.done(token)
        self.counts[f"publish_out_{message.qos}"] += 1

    # -- the loop check, when the remote does not know the bridge bit ---------------------

    def _sent_now(self, message: Publish) -> None:
        if self._private or self.settings.mqtt_version == MQTT5 or not self.incoming:
            return  # the remote sends nothing back: no-local, or the bridge bit
        now = time.monotonic()
        key = (message.topic, message.payload)
        self._sent.append((now, key))
        self._unechoed.setdefault(key, deque()).append(now)
        while self._sent and self._sent[0][0] < now - ECHO_SECONDS:
            sent_at, old = self._sent.popleft()
            times = self._unechoed.get(old)
            if times and times[0] <= sent_at:  # not echoed: forgotten now
                times.popleft()
            if not times:
                self._unechoed.pop(old, None)

    def _echo(self, message: Publish) -> bool:
        times = self._unechoed.get((message.topic, message.payload))
        if not times:
            return False
        times.popleft()  # the oldest sending of it came back
        return True

    # -- what it says ---------------------------------------------------------------------

    def _set_state(self, state: str, reason: str) -> None:
        if (state, reason) == (self.state, self.reason):
            return
        before = self.state
        self.state, self.reason = state, reason
        if state == "connected":
            log.info("bridge %s: connected to %s", self.name, self.settings.address)
        elif state == "retrying" and (before != "retrying" or reason):
            log.warning(
                "bridge %s: %s; retrying every %g s",
                self.name,
                reason,
                self.settings.restart_timeout,
            )

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "endpoint": self.settings.address,
            "state": self.state,
            "reason": self.reason,
            "buffer_size": len(self.buffer),
            "buffer_max": self.settings.max_outgoing_buffered_messages,
            "buffer_dropped": self.counts["dropped"],
        }


def _rule_for(rules: list[TopicRule], topic: str, local: bool) -> TopicRule | None:
    for rule in rules:
        prefix = rule.local_prefix if local else rule.remote_prefix
        if topic.startswith(prefix) and topic_matches(rule.pattern, topic[len(prefix) :]):
            return rule
    return None


async def _quietly(publishing: Any) -> None:
    with contextlib.suppress(MqttError, asyncio.CancelledError):
        await publishing


def _ssl_context(settings: BridgeSettings) -> ssl.SSLContext | None:
    if settings.transport != "ssl":
        return None
    context = ssl.create_default_context(cafile=settings.cafile or None)
    if settings.certfile:
        context.load_cert_chain(settings.certfile, settings.keyfile or None)
    if settings.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.minimum_version = (
        ssl.TLSVersion.TLSv1_3 if settings.tls_version == "tlsv1.3" else ssl.TLSVersion.TLSv1_2
    )
    return context
