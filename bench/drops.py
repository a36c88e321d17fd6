# Reading a broker's queue drop counter from its $SYS tree during a measurement.
#
# Strategy: one extra client subscribes to the counter's $SYS topic and keeps every value
# with the time it arrived. A broker publishes the tree in rounds (Nautilus every
# `systree_interval` seconds, Mosquitto every `sys_interval` + 1), so the counter at an
# instant t is interpolated between the rounds that arrived just before and just after t.
# After the measured seconds the load keeps running until the next round has arrived, so
# the end of the interval is bracketed like its start. Mosquitto publishes the counter only
# when it changed: there every round's first topic ($SYS/broker/uptime) stands for "the
# counter as last published", replaced by the counter's value if that comes in the round.
# The counter is 0 when publishing starts (a fresh broker per measurement), which gives
# the first bracket if no round arrived before t.
from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .client import Login, MqttClient, open_client, subscribe

if TYPE_CHECKING:
    from .client_layers import Transport

_ROUND_GAP = 0.5  # seconds: values closer than this to a round's first topic belong to it
_GRACE = 0.1  # seconds allowed for the rest of a round after its first topic arrived


@dataclass(frozen=True, slots=True)
class SysCounter:
    """Where a broker publishes its queue drop counter in $SYS, and how often."""

    topic: str  # the counter, as decimal ASCII
    period: float  # seconds between two rounds of the tree
    # Published first in every round, when `topic` only comes when its value changed
    # (Mosquitto); None when `topic` itself comes in every round (Nautilus).
    round_topic: str | None = None


class DropMonitor:
    """One connection following a SysCounter; `between(t0, t1)` is the count of drops."""

    def __init__(self, client: MqttClient, counter: SysCounter):
        self._client = client
        self._counter = counter
        self._topic = counter.topic.encode()
        self._times: list[float] = []  # arrival times, increasing
        self._values: list[int] = []
        self._round_at = -1.0  # arrival of the last round topic
        self._arrived = asyncio.Event()
        client.on_message = self._message

    def start(self, now: float) -> None:
        """Publishing starts now: the counter is still what the broker last said, or 0."""
        self._add(now, self._values[-1] if self._values else 0)

    async def until_round_after(self, t: float) -> bool:
        """Wait for a round that arrived after `t`; False if none came in 3 periods."""
        deadline = time.perf_counter() + 3 * self._counter.period
        while not self._times or self._times[-1] <= t:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), deadline - time.perf_counter())
            except TimeoutError:
                return False
        if self._counter.round_topic is not None:
            await asyncio.sleep(_GRACE)  # the counter may follow in that round
        return True

    def between(self, t0: float, t1: float) -> float:
        return self.at(t1) - self.at(t0)

    def at(self, t: float) -> float:
        """The counter at `t`, interpolated between the rounds around it."""
        times, values = self._times, self._values
        i = bisect.bisect_right(times, t)
        if i == 0:
            return 0.0
        if i == len(times):
            return float(values[-1])
        t0, t1 = times[i - 1], times[i]
        return values[i - 1] + (values[i] - values[i - 1]) * (t - t0) / (t1 - t0)

    def close(self) -> None:
        if self._client.transport is not None:
            self._client.transport.abort()

    def _message(self, topic: bytes, payload: bytes) -> None:
        now = time.perf_counter()
        if topic == self._topic:
            value = int(payload)
            if now - self._round_at < _ROUND_GAP and self._times[-1] == self._round_at:
                self._values[-1] = value  # the value of the round just opened
            else:
                self._add(now, value)
        else:  # a round topic: the counter stands as last published
            self._round_at = now
            self._add(now, self._values[-1] if self._values else 0)

    def _add(self, now: float, value: int) -> None:
        self._times.append(now)
        self._values.append(value)
        self._arrived.set()


async def open_monitor(
    host: str,
    port: int,
    client_id: str,
    counter: SysCounter,
    transport: Transport | None = None,
    login: Login | None = None,
) -> DropMonitor:
    """Connect and subscribe to the counter (and to its round topic, if it has one);
    `login`: a user that may read $SYS, on a broker that refuses anonymous clients."""
    client = await open_client(host, port, client_id, transport=transport, login=login)
    monitor = DropMonitor(client, counter)
    try:
        await subscribe(client, counter.topic, 0)
        if counter.round_topic is not None:
            await subscribe(client, counter.round_topic, 0)
    except BaseException:
        monitor.close()
        raise
    return monitor
