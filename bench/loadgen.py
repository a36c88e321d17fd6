# Publishers of the load generator: how PUBLISH bytes are pushed into a connection.
#
# Strategy: each publisher owns one MqttClient and only ever writes pre-encoded bytes.
# - Flood (QoS 0) writes batches of identical PUBLISHes until the transport's write buffer
#   passes its high-water mark, and resumes from resume_writing(): TCP back-pressure sets
#   the pace.
# - Windowed (QoS 1) keeps exactly `window` PUBLISHes unacknowledged: every batch of
#   PUBACKs is answered by one write of as many packets, sliced from the pre-encoded ring.
# - In bounded mode both also stop while a shared Backlog says too many deliveries are
#   owed (published, not yet received by a subscriber). A broker that reads and acks
#   faster than it delivers (amqtt queues without bound and starves its own delivery) is
#   then measured at the rate it delivers, not at the rate its queues grow, and the figure
#   does not depend on how long the run lasts. In flood mode the Backlog has no limit:
#   publishers behave like devices, which know nothing of subscribers.
# - `accepted` is what the broker has taken from a publisher: at QoS 1 the PUBACKs
#   received; at QoS 0 the PUBLISHes it has read, i.e. those the kernel accepted (written
#   minus what still waits in the transport) minus those still in the kernel's buffers of
#   either end of the loopback connection (/proc/net/tcp). Those buffers hold megabytes:
#   a publisher flooding a slow reader can go seconds without the kernel taking a byte
#   while the broker keeps reading what is buffered.
# - Paced (QoS 1) sends at a fixed rate from a 1 ms timer, stamping each payload with
#   perf_counter_ns so a subscriber in the same process can compute latency.
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from . import packets
from .client import MqttClient

_BATCH_BYTES = 64 * 1024
_BATCHES_PER_TURN = 8
_TICK = 0.001
_PROC_TCP = Path("/proc/net/tcp")


class Backlog:
    """End-to-end bound shared by a scenario's publishers: deliveries owed, not received."""

    def __init__(self, subscribers: list[MqttClient], fanout: int, limit: int):
        self.subscribers = subscribers
        self.fanout = fanout  # subscribers receiving each PUBLISH
        self.limit = limit  # 0: no bound, a pure flood
        self.publishers: list[_Publisher] = []
        self._waiting: set[_Publisher] = set()
        for subscriber in subscribers:
            subscriber.on_delivery = self._delivered

    def full(self) -> bool:
        if not self.limit:
            return False
        owed = sum(p.sent for p in self.publishers) * self.fanout
        return owed - sum(s.received for s in self.subscribers) >= self.limit

    def wait(self, publisher: _Publisher) -> None:
        """Call the publisher's pump again once deliveries have made room."""
        self._waiting.add(publisher)

    def accepted(self) -> int:
        """Messages the broker has taken from all publishers (read, or acked at QoS 1)."""
        ends = [p.ends for p in self.publishers if p.ends is not None]
        waiting = unread(ends) if ends else {}
        return sum(publisher.accepted(waiting) for publisher in self.publishers)

    def _delivered(self) -> None:
        # Only summed while someone waits, so an unblocked run pays nothing here.
        if self._waiting and not self.full():
            waiting, self._waiting = self._waiting, set()
            for publisher in waiting:
                publisher.resume()


class _Publisher:
    """What Flood and Windowed share: start/stop, back-pressure, the backlog check."""

    ends: tuple[int, int] | None = None  # (local port, broker port) when `accepted` needs it

    def __init__(self, client: MqttClient, backlog: Backlog):
        self._client = client
        self._backlog = backlog
        self._running = False
        self._scheduled = False
        client.on_writable = self._pump
        backlog.publishers.append(self)

    @property
    def sent(self) -> int:
        raise NotImplementedError

    def accepted(self, unread: Mapping[int, int]) -> int:
        """Messages the broker has taken; `unread` maps local ports to bytes not yet read."""
        raise NotImplementedError

    def start(self) -> None:
        self._running = True
        self._pump()

    def stop(self) -> None:
        self._running = False

    def resume(self) -> None:
        self._pump()

    def _pump(self) -> None:
        self._scheduled = False
        if self._blocked():
            return  # resume_writing() or the next PUBACK calls _pump again
        if self._backlog.full():
            self._backlog.wait(self)
            return
        self._send()

    def _blocked(self) -> bool:
        client = self._client
        return not self._running or client.paused or client.transport.is_closing()

    def _send(self) -> None:
        raise NotImplementedError

    def _again(self) -> None:
        """Pump again on the next loop turn, so subscribers on this loop get theirs."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)


class Flood(_Publisher):
    """QoS 0 publisher writing as fast as the socket and the backlog allow."""

    def __init__(self, client: MqttClient, topic: str, payload: bytes, backlog: Backlog):
        super().__init__(client, backlog)
        packet = packets.publish(topic, payload)
        per_batch = _BATCH_BYTES // len(packet)
        if backlog.limit:  # a batch well under the bound, so it is not overshot much
            per_batch = min(per_batch, backlog.limit // (4 * backlog.fanout))
        self._batch = packet * max(1, per_batch)
        self._packet_size = len(packet)
        self._written = 0  # bytes handed to the transport
        info = client.transport.get_extra_info
        self.ends = (info("sockname")[1], info("peername")[1])

    @property
    def sent(self) -> int:
        """PUBLISHes the kernel has accepted (written, minus the transport's backlog)."""
        pending = self._client.transport.get_write_buffer_size()
        return (self._written - pending) // self._packet_size

    def accepted(self, unread: Mapping[int, int]) -> int:
        """PUBLISHes the broker has read: accepted by the kernel, no longer in its buffers."""
        assert self.ends is not None  # set in __init__
        pending = self._client.transport.get_write_buffer_size() + unread.get(self.ends[0], 0)
        return (self._written - pending) // self._packet_size

    def _send(self) -> None:
        for _ in range(_BATCHES_PER_TURN):
            self._client.transport.write(self._batch)
            self._written += len(self._batch)
            if self._blocked() or self._backlog.full():
                break
        self._again()


class Windowed(_Publisher):
    """QoS 1 publisher keeping at most `window` PUBLISHes unacknowledged."""

    def __init__(
        self, client: MqttClient, ring: packets.PublishRing, window: int, backlog: Backlog
    ):
        super().__init__(client, backlog)
        self._ring = ring
        self._window = window
        self._next = 0  # ring index of the next packet id to send
        self._count = 0
        client.on_ack = self._pump

    @property
    def sent(self) -> int:
        return self._count

    def accepted(self, unread: Mapping[int, int]) -> int:
        return self._client.acked

    def _send(self) -> None:
        room = self._window - (self._count - self._client.acked)
        if room > 0:
            self._client.transport.writelines(self._ring.chunk(self._next, room))
            self._next = (self._next + room) % packets.MAX_PACKET_ID
            self._count += room


class Paced:
    """QoS 1 publisher at `rate` msg/s whose payloads start with their send time."""

    def __init__(self, client: MqttClient, topic: str, size: int, rate: int, window: int):
        packet = packets.publish(topic, bytes(max(size, 8)), qos=1, packet_id=1)
        self._head = packet[: packets.packet_id_offset(packet)]  # fixed header + topic
        self._padding = bytes(max(size, 8) - 8)
        self._client = client
        self._rate = rate
        self._window = window
        self._timer: asyncio.TimerHandle | None = None
        self._started = 0.0
        self.sent = 0

    def start(self) -> None:
        self._started = time.perf_counter()
        self._tick()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _tick(self) -> None:
        client = self._client
        due = int((time.perf_counter() - self._started) * self._rate) - self.sent
        room = self._window - (self.sent - client.acked)
        # Messages beyond the window wait for the next tick: the schedule is kept, so a
        # slow broker shows up as a lower achieved rate and higher latency.
        count = min(due, room)
        if count > 0 and not client.transport.is_closing():
            client.transport.writelines([self._packet() for _ in range(count)])
        self._timer = asyncio.get_running_loop().call_later(_TICK, self._tick)

    def _packet(self) -> bytes:
        self.sent += 1
        packet_id = (self.sent - 1) % packets.MAX_PACKET_ID + 1
        stamp = time.perf_counter_ns().to_bytes(8, "big")
        return self._head + packet_id.to_bytes(2, "big") + stamp + self._padding


def unread(ends: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Bytes written on loopback connections that the peer has not read yet, by local port.

    `ends` are (local port, peer port) pairs. /proc/net/tcp gives, for our end, what the
    peer's kernel has not acknowledged (tx_queue) and, for the peer's end, what it has
    received but not read (rx_queue). Empty where the file cannot be read (not Linux).
    """
    peers = dict(ends)
    try:
        lines = _PROC_TCP.read_text().splitlines()[1:]
    except OSError:
        return {}
    result = dict.fromkeys(peers, 0)
    for line in lines:
        fields = line.split()
        local, remote = int(fields[1][-4:], 16), int(fields[2][-4:], 16)
        tx_queue, rx_queue = fields[4].split(":")
        if peers.get(local) == remote:  # our end
            result[local] += int(tx_queue, 16)
        elif peers.get(remote) == local:  # the peer's end
            result[remote] += int(rx_queue, 16)
    return result
