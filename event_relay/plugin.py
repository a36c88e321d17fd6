"""The event relay as the broker sees it: a plugin whose event hooks append to the log.

The per-message events (on_publish, on_deliver, on_delivery_complete) come through its
`recorder` (event_relay/recorder.py: no context per event, a message's publish and
deliveries in one record); every other event hook builds the event's fields from its
context and appends them (event_relay/log.py): plain method calls, no await, no task.
Hooks not listed in `hooks` are hidden (set to None), so the broker does not even build
their contexts. The relay is loaded before every other plugin, and the broker tells the
recorder of a delivery before it calls any plugin's on_deliver.

With `durability = "acknowledged"` the broker calls `before_ack()` before it writes any
PUBACK / PUBREC: the events of that turn (the publish events among them) are then in the
spool, fsynced, so a QoS 1/2 message the broker acknowledged has its event on disk.

Besides the hooks' events, the relay appends a `heartbeat` (the broker's clock) when no
event has come for `heartbeat_interval` seconds, and when a reader asks for one.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from broker.config import Config as BrokerConfig
from broker.config import ConfigError, build_section
from broker.protocol import Property
from event_relay.config import RelayConfig, check
from event_relay.log import EventLog
from event_relay.recorder import Recorder

try:
    from event_relay._recorder import Recorder as FastRecorder
except ImportError:  # built without a C compiler (setup.py)
    FastRecorder = None  # type: ignore[assignment, misc]
from event_relay.schema import CODES, HEARTBEAT, HOOK_NAMES
from event_relay.server import RelayServer
from event_relay.spool import Spool, SpoolError
from hooks import (
    ClientContext,
    MessageRecorder,
    Metric,
    PublishContext,
    RegisterContext,
    SubscribeContext,
    UnsubscribeContext,
)

_ON_OFFLINE_MESSAGE = CODES["on_offline_message"]
_ON_MESSAGE_DROP = CODES["on_message_drop"]
_time_ns = time.time_ns


class EventRelay:
    Config = RelayConfig

    @classmethod
    def table_section(cls, config: BrokerConfig) -> dict[str, Any] | None:
        """[event_relay] as this plugin's section (broker/plugins.py), or None when
        neither the relay server (`enabled`, which is `serve` here) nor the sidecar push
        is on; the keys of a relay that is off are checked all the same, so that a
        misspelt `enabled` is an error, not a relay silently off. The relay comes first
        among the plugins (priority -1), so that its on_deliver sees every delivery
        before a plugin may take it."""
        table = config.event_relay
        serve = table.get("enabled", False)
        if not isinstance(serve, bool):
            raise ConfigError(f"event_relay.enabled: expected true or false, got {serve!r}")
        sidecar = table.get("sidecar", {})
        push = isinstance(sidecar, dict) and sidecar.get("enabled", False) is True
        settings = {key: value for key, value in table.items() if key != "enabled"}
        settings.setdefault("node_name", config.broker.node_name)
        if not (serve or push):
            build_section(RelayConfig, settings, "event_relay")
            return None
        return {"priority": -1, "serve": serve, **settings}

    def __init__(self, config: RelayConfig) -> None:
        self.config = check(config)
        self.acknowledged = config.durability == "acknowledged"
        # The spool, if any, is opened by start(): building the relay takes nothing.
        self.log = EventLog(
            memory_events=config.memory_events,
            memory_bytes=config.memory_bytes,
            sync=self.acknowledged,
        )
        if self.acknowledged:
            # The broker calls it before any PUBACK / PUBREC: the turn's events go to the
            # spool first (fsynced: the log writes with sync in this mode). Without
            # acknowledged durability there is no such method, and no call per flush.
            self.before_ack = self._before_ack
        self.epoch = uuid.uuid4().hex  # a spool's own when there is one (start)
        self.server = (
            RelayServer(self.log, config, self.epoch, self.heartbeat) if config.serve else None
        )
        # SIGHUP reloads the relay's certificate files as it does the listeners'.
        tls = self.server.tls if self.server is not None else None
        self.reload_tls = tls.reload if tls is not None else None
        self.sidecar = None
        if config.sidecar.enabled:
            from event_relay.sidecar import SidecarPush  # protobuf: only when pushing

            self.sidecar = SidecarPush(config.sidecar, self.log)
        self._full = config.payloads == "full"
        self._sizes = config.payloads != "none"
        # The log holds what the relay server or the sidecar wants (both read it).
        relayed = set(config.hooks) | (set(config.sidecar.hooks) if self.sidecar else set())
        sample = {hook: rates for hook, rates in config.sample.items() if rates}
        # The compiled recorder when it was built; sampling rules are the Python one's.
        recorder_class: type[Recorder | FastRecorder] = (
            Recorder if sample or FastRecorder is None else FastRecorder
        )
        self._recorder = recorder_class(self.log, relayed, config.payloads, sample, _call_soon)
        self._append = self._recorder.append  # every event goes after the open run
        # The broker's fast path for the per-message events (hooks/recorder.py).
        self.recorder: MessageRecorder | None = None
        if relayed & {"on_publish", "on_deliver", "on_delivery_complete"}:
            self.recorder = self._recorder
        # The sessions connected now (session id -> its connect's ts): a disconnect's event
        # says when its session began and how many clients are still online.
        self._connected: dict[str, int] = {}
        self._relay_register = "on_register" in relayed
        tracked = {"on_client_offline", "on_client_gone"} & relayed
        self._quiet_check: asyncio.TimerHandle | None = None
        self._seen = 0  # the log's next_seq at the last quiet check
        for hook in HOOK_NAMES:
            if hook not in relayed and not (hook == "on_register" and tracked):
                setattr(self, hook, None)  # hidden: the broker skips it entirely

    @property
    def sampled_out(self) -> int:
        """Events not relayed by a sampling rule."""
        return self._recorder.sampled_out

    def _before_ack(self) -> bool:
        self._recorder.seal()  # the open run may hold the publish being acknowledged
        return self.log.flush()

    async def start(self) -> None:
        if self.config.durability != "none":
            self._open_spool()
        self._recorder.schedule = asyncio.get_running_loop().call_soon  # no lookup per turn
        if self.server is not None:
            await self.server.start()
        if self.sidecar is not None:
            self.sidecar.start()
        if self.config.heartbeat_interval:
            self._check_quiet()

    def _open_spool(self) -> None:
        config = self.config
        try:
            spool = Spool(config.spool_path, config.spool_max_events)
        except SpoolError as exc:
            raise ConfigError(f"event_relay.spool_path: {exc}") from None
        self.log.use_spool(spool)
        self.epoch = spool.epoch  # the sequence numbers go on from the spool's
        if self.server is not None:
            self.server.epoch = spool.epoch

    def heartbeat(self) -> None:
        """Append a heartbeat: the broker's clock, after every event appended so far."""
        self._append(HEARTBEAT, [0, _time_ns(), 0, None, "", None, None])

    def _check_quiet(self) -> None:
        """Every heartbeat_interval: a heartbeat if no event came since the last check
        (one timer, whatever the traffic)."""
        next_seq = self.log.next_seq
        if next_seq == self._seen:
            self.heartbeat()
        self._seen = self.log.next_seq
        loop = asyncio.get_running_loop()
        self._quiet_check = loop.call_later(self.config.heartbeat_interval, self._check_quiet)

    async def stop(self) -> None:
        if self._quiet_check is not None:
            self._quiet_check.cancel()
        self._recorder.seal()  # the last loop turn's records, into the log (and the spool)
        if self.sidecar is not None:
            await self.sidecar.stop()
        if self.server is not None:
            await self.server.stop()
        self.log.close()

    def metrics(self) -> list[Metric]:
        """For /metrics (hooks.Metric): the log, its consumers and the sidecar."""
        log = self.log
        found = [
            Metric("event_relay_events", log.next_seq - 1, help="events appended (last seq)"),
            Metric("event_relay_events_retained", log.next_seq - log.first_seq, "gauge"),
            Metric("event_relay_events_lost", log.lost, help="let go of unspooled"),
            Metric("event_relay_sampled_out", self.sampled_out),
        ]
        if self.server is not None:
            found += [
                Metric("event_relay_consumers", len(self.server.consumers), "gauge"),
                Metric(
                    "event_relay_records_sent",
                    self.server.records_sent,
                    help="records sent to consumers (an event, or a compact record of several)",
                ),
            ]
        if self.sidecar is not None:
            found += [
                Metric("event_relay_sidecar_sent", self.sidecar.sent),
                Metric("event_relay_sidecar_dropped", self.sidecar.dropped),
                Metric("event_relay_sidecar_errors", self.sidecar.errors),
                Metric("event_relay_sidecar_connections", self.sidecar.connected, "gauge"),
            ]
        return found

    # -- the hooks ----------------------------------------------------------------------

    def on_register(self, ctx: RegisterContext) -> None:
        ts = _time_ns()
        self._connected[ctx.session_id] = ts
        if self._relay_register:
            values = self._register(ctx, ts)
            values += (_user_properties(ctx), len(self._connected))
            self._append(CODES["on_register"], values)

    def on_register_failed(self, ctx: RegisterContext) -> None:
        values = self._register(ctx, _time_ns())
        values.append(ctx.reason)
        self._append(CODES["on_register_failed"], values)

    @staticmethod
    def _register(ctx: RegisterContext, ts: int) -> list[Any]:
        peer_addr, peer_port = ctx.peer
        return [
            0,
            ts,
            0,
            ctx.client_id,
            ctx.mountpoint,
            ctx.username,
            ctx.session_id,
            peer_addr,
            peer_port,
            ctx.clean_start,
            ctx.protocol_level,
        ]

    # on_publish, on_deliver and on_delivery_complete: the recorder's.

    def on_offline_message(self, ctx: PublishContext) -> None:
        self._append(_ON_OFFLINE_MESSAGE, self._message(ctx))

    def on_message_drop(self, ctx: PublishContext) -> None:
        matched = ctx.matched_acl
        values = self._message(ctx)
        values += (ctx.reason, "" if matched is None else matched.name)
        self._append(_ON_MESSAGE_DROP, values)

    def _message(self, ctx: PublishContext) -> list[Any]:
        payload = ctx.payload
        return [
            0,
            _time_ns(),
            0,
            ctx.client_id,
            ctx.mountpoint,
            ctx.username,
            ctx.session_id,
            ctx.topic,
            ctx.qos,
            ctx.retain,
            len(payload) if self._sizes else None,
            payload if self._full else None,
        ]

    def on_subscribe(self, ctx: SubscribeContext) -> None:
        topics = [
            [
                request.topic,
                request.qos,
                request.matched_acl.name if request.matched_acl else "",
                request.matched_acl.pattern if request.matched_acl else "",
            ]
            for request in ctx.topics
        ]
        self._append(CODES["on_subscribe"], [*self._client(ctx), topics])

    def on_unsubscribe(self, ctx: UnsubscribeContext) -> None:
        self._append(CODES["on_unsubscribe"], [*self._client(ctx), list(ctx.topics)])

    def on_client_wakeup(self, ctx: ClientContext) -> None:
        self._append(CODES["on_client_wakeup"], self._client(ctx))

    def on_client_offline(self, ctx: ClientContext) -> None:
        self._append(CODES["on_client_offline"], self._disconnect(ctx))

    def on_client_gone(self, ctx: ClientContext) -> None:
        self._append(CODES["on_client_gone"], self._disconnect(ctx))

    def _disconnect(self, ctx: ClientContext) -> list[Any]:
        # A session connected before this relay started has no connect time (None).
        connected_ts = self._connected.pop(ctx.session_id, None)
        values = self._client(ctx)
        values += (ctx.reason, connected_ts, len(self._connected))
        return values

    def on_session_expired(self, ctx: ClientContext) -> None:
        self._append(CODES["on_session_expired"], self._client(ctx))

    @staticmethod
    def _client(ctx: ClientContext) -> list[Any]:
        return [0, _time_ns(), 0, ctx.client_id, ctx.mountpoint, ctx.username, ctx.session_id]


def _call_soon(callback: Callable[[], None]) -> None:
    asyncio.get_running_loop().call_soon(callback)


def _user_properties(ctx: RegisterContext) -> list[list[str]]:
    """CONNECT's User Properties (MQTT 5), in order, as [key, value] pairs."""
    pairs = ctx.properties.get(Property.USER_PROPERTY, ()) if ctx.properties else ()
    return [list(pair) for pair in pairs]
