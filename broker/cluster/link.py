"""The cluster channel's two ends: `PeerLink`, this node's link to one other node (it
connects, sends and reconnects), and `ClusterServerProtocol`, one link from another node
accepted on this node's cluster listener.

Traffic to a peer is written in batches: frames sent during one event-loop turn leave in
one write. While the link is down, frames wait in a buffer bounded by
`outgoing_buffer_size`; what does not fit is dropped and counted
(`cluster_bytes_dropped`), as in VerneMQ. While it is up, the link is a flow-control
subscriber (broker/flow.py) through the RemoteNode that routes to it: past its high-water
mark publishers wait, so a slow link slows its publishers instead of growing memory.

A link that gets no PONG to its PINGs for `dead_after` is aborted and reconnected: a
peer that is blackholed (the socket open, nothing passing) is noticed that way.

A link starts with a handshake (broker/cluster/frames.py): HELLO, CHALLENGE, PROOF,
WELCOME, in which each node proves it holds `[cluster] secret` without sending it. With
TLS on (broker/cluster/channel_tls.py) it runs inside TLS, and the names the nodes give
must be the names their certificates are for. A refusal is one line on each side: the
refusing node's, and the other's on reading REFUSED (or the failed TLS handshake).

The cluster listener is open to whoever reaches its port, so until a peer's handshake
is done (its secret proved) it costs little: its frames may be at most HELLO_MAX_SIZE
(a longer length is refused from the 4 bytes that say it, nothing of the frame read),
it has HANDSHAKE_TIMEOUT to finish the handshake, and the connections open at once are
capped (`[cluster] max_connections`, ClusterListener; with TLS, from the end of the TLS
handshake, which has HANDSHAKE_TIMEOUT of its own). Every refusal's line names the
peer's address.

Frames a link has read are handled even if the peer closes it before they are (held by
flow control meanwhile): the peer counted them sent.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster import frames
from broker.cluster.channel_tls import certificate_problem, tls_problem
from broker.cluster.frames import (
    ACK,
    ANSWER,
    CHALLENGE,
    DRAINED,
    PING,
    PONG,
    PROOF,
    QUEUED,
    REFUSED,
    WELCOME,
    Connecting,
    FrameDecoder,
    FrameError,
    HandshakeError,
    Hello,
)
from broker.config import ClusterSettings
from broker.episodes import Episode

if TYPE_CHECKING:
    from broker.cluster.channel_tls import ChannelTls
    from broker.cluster.losses import Census
    from broker.metrics import Metrics

log = logging.getLogger("nautilus.cluster")

HIGH_WATER = 1024 * 1024  # bytes queued to a peer that hold its publishers
LOW_WATER = 256 * 1024
SOCKET_BUFFER = 256 * 1024  # SO_SNDBUF of a link (loopback would grow it to megabytes)
RECONNECT_DELAY = 0.5  # seconds between attempts to reach a peer
# A link refused in its handshake (a wrong secret or certificate, a full listener) is
# tried again after RECONNECT_DELAY, doubled with each refusal up to this: a setting
# that is wrong stays so until someone fixes it, and each attempt is a line on each side.
REFUSED_DELAY_MAX = 10.0
HANDSHAKE_TIMEOUT = 5.0
# The largest frame the cluster listener takes before a peer's handshake is done. A HELLO,
# [HELLO, version, node, boot id, nonce] in MessagePack, is about 60 bytes plus the node's
# name, a PROOF about 40. 4 KiB is far more, and still nothing to hold for a connection
# that has proved nothing yet (where max_frame_size, 64 MiB, let ten silent connections
# hold 600 MB).
HELLO_MAX_SIZE = 4096
BEFORE_HELLO = "before HELLO, at most"  # how FrameErrors name HELLO_MAX_SIZE
REFUSALS_INTERVAL = 10.0  # seconds between lines counting links refused at the cap


def _nobody_numbers(node: str, epoch: str, upto: int) -> None:
    """A link whose node sends no numbered messages (streams.py) ignores QUEUED."""


class LinkEnd(Protocol):
    """This node as both ends of its links introduce it (node.py's Cluster)."""

    node: str  # this node's name
    boot_id: str  # this run's
    settings: ClusterSettings
    loop: asyncio.AbstractEventLoop
    metrics: Metrics


class LinkingNode(LinkEnd, Protocol):
    """The node a PeerLink links to another: what it is told of the link."""

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task: ...

    def release_publishers(self, node: str) -> None:
        """The link to `node` has room again (or is gone): who waited for it goes on."""
        ...

    def link_up(self, link: PeerLink, restarted: bool, lost: int | None) -> None:
        """The link is up; `restarted`: the peer has a new boot id; `lost`: it came back
        without having said it stopped (LEAVING), killed, and last said it held that many
        messages only in memory (losses.py)."""
        ...

    def link_down(self, link: PeerLink) -> None: ...

    def drained(self, node: str) -> None: ...


class ListeningNode(LinkEnd, Protocol):
    """The node whose cluster listener accepted a link: where its frames go."""

    @property
    def stopping(self) -> bool:
        """The node is shutting down: frames left unread are not kept."""
        ...

    def on_frame(self, inbound: ClusterServerProtocol, frame: list[Any]) -> None: ...

    def inbound_up(self, inbound: ClusterServerProtocol) -> None: ...

    def inbound_down(self, inbound: ClusterServerProtocol) -> None: ...

    def publisher_gone(self, inbound: ClusterServerProtocol) -> None:
        """A closed link's frames are all handled: flow control forgets it."""
        ...


class PeerLink(asyncio.Protocol):
    """This node's one-way link to `node`; replies to requests come back on it."""

    def __init__(
        self,
        cluster: LinkingNode,
        node: str,
        address: tuple[str, int],
        tls: ChannelTls | None = None,
        queued: Callable[[str, str, int], None] = _nobody_numbers,
    ) -> None:
        self.cluster = cluster
        self.tls = tls  # [cluster] tls_certfile...: the link's TLS, if on
        # QUEUED from the peer (node, epoch, upto): streams.py's Streams.acknowledged.
        self._queued = queued
        self.loop = cluster.loop
        self.node = node
        self.address = address
        self.boot_id = ""  # the peer's, from its WELCOME
        # The messages the peer holds only in memory, as its last PONG said (losses.py).
        self.peer_at_risk = 0
        self.transport: asyncio.Transport | None = None
        self.up = False  # handshake done
        self.closed = False
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._flush_scheduled = False
        self._decoder = FrameDecoder(cluster.settings.max_frame_size)
        self._refs = itertools.count(1)
        self._requests: dict[int, asyncio.Future[Any]] = {}
        self._holding = False  # the peer is stopping: keep frames for its return
        self._pings = itertools.count(1)
        self._last_pong = 0.0
        self._welcomed: asyncio.Future[None] | None = None
        self._handshake: Connecting | None = None  # this attempt's, until WELCOME
        self._refusals = 0  # handshakes refused in a row (the next attempt waits longer)
        self._task = cluster.spawn(self._run(), f"cluster link to {node}")
        self.progress = 0  # bytes written to the peer (flow control watches it)
        self.bytes_sent = 0
        self.bytes_dropped = 0

    def __repr__(self) -> str:
        return f"<PeerLink {self.node} {'up' if self.up else 'down'}>"

    # -- sending -----------------------------------------------------------------------

    @property
    def backlog(self) -> int:
        """Bytes on their way to the peer: waiting here and in the transport."""
        buffered = self.transport.get_write_buffer_size() if self.transport is not None else 0
        return self._pending_bytes + buffered

    @property
    def answering(self) -> bool:
        """Whether the link is up and the peer answered within dead_after (it sends a
        PONG every liveness_interval of its own accord, even while it holds the link)."""
        return self.up and self.loop.time() - self._last_pong < self.cluster.settings.dead_after

    @property
    def last_answer(self) -> float:
        """Loop time of the peer's last PONG (or WELCOME); 0: it never answered."""
        return self._last_pong

    @property
    def peer_stopped(self) -> bool:
        """The peer said it stops (LEAVING) and has not welcomed this link since: it
        does not count towards a netsplit (netsplit.py)."""
        return self._holding

    @property
    def congested(self) -> bool:
        return self.up and self.backlog >= HIGH_WATER

    def send(self, frame: bytes) -> bool:
        """Queue one frame for the peer; False when the buffer is full (it is dropped)."""
        if not self._room_for(frame):
            self.bytes_dropped += len(frame)
            self.cluster.metrics.cluster_bytes_dropped += len(frame)
            return False
        self._queue(frame)
        return True

    def offer(self, frame: bytes) -> bool:
        """Queue a frame that is kept elsewhere until the peer acknowledges it (streams.py),
        if the link is up and has room; False, and nothing counted, when it is not taken
        (it is offered again when the link drains, or comes back)."""
        if not self.up or not self._room_for(frame):
            return False
        self._queue(frame)
        return True

    def send_first(self, frame: bytes) -> None:
        """Queue a frame ahead of those waiting: a new link's first (streams.py's STREAM)."""
        self._pending.insert(0, frame)
        self._pending_bytes += len(frame)

    def _room_for(self, frame: bytes) -> bool:
        limit = self.cluster.settings.outgoing_buffer_size
        return not self.closed and self.backlog + len(frame) <= limit

    def _queue(self, frame: bytes) -> None:
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        if self.up and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def request(self, *frame: Any) -> asyncio.Future[Any]:
        """Send a frame whose second item is a reference for the peer's ACK (or ANSWER);
        the future holds the ACK's error (None: done), or the ANSWER's result. It fails
        if the link goes down first."""
        ref = next(self._refs)
        future: asyncio.Future[Any] = self.loop.create_future()
        self._requests[ref] = future
        if not self.send(frames.encode(frame[0], ref, *frame[1:])):
            del self._requests[ref]
            future.set_exception(ConnectionError(f"the link to {self.node} is full"))
        # A caller that gave up (a timeout cancels the future) leaves no entry behind.
        future.add_done_callback(lambda _: self._requests.pop(ref, None))
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._pending or self.transport is None or not self.up or self._holding:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        self.transport.write(data)
        self.bytes_sent += len(data)
        self.cluster.metrics.cluster_bytes_sent += len(data)
        self.progress += 1
        self._released()

    def _released(self) -> None:
        """Publishers held for this link may go on once it is below its low-water mark."""
        if self.backlog <= LOW_WATER:
            self.cluster.release_publishers(self.node)

    # -- connecting --------------------------------------------------------------------

    async def _run(self) -> None:
        interval = self.cluster.settings.liveness_interval
        while not self.closed:
            try:
                await self._connect()
            except ssl.SSLError as exc:  # (an OSError too)
                self._tls_failed(exc)
                await asyncio.sleep(self._retry_delay())
                continue
            except (TimeoutError, OSError, ConnectionError) as exc:
                log.debug("cluster link to %s (%s:%s): %s", self.node, *self.address, exc)
                await asyncio.sleep(self._retry_delay())
                continue
            # Up: ping until the link goes down.
            while self.up and not self.closed:
                await asyncio.sleep(interval)
                if not self.up or self.transport is None:
                    break
                if self.loop.time() - self._last_pong > self.cluster.settings.dead_after:
                    log.warning(
                        "cluster link to %s: no answer for %ss, reconnecting",
                        self.node,
                        self.cluster.settings.dead_after,
                    )
                    self.transport.abort()
                    break
                self.transport.write(frames.encode(PING, next(self._pings)))
            if not self.closed:
                await asyncio.sleep(RECONNECT_DELAY)

    def _retry_delay(self) -> float:
        return retry_delay(self._refusals)

    def _tls_failed(self, exc: ssl.SSLError) -> None:
        log.warning(
            "cluster link to %s (%s:%s): TLS handshake failed: %s",
            self.node,
            *self.address,
            tls_problem(exc),
        )
        if not isinstance(exc, ssl.SSLEOFError):  # (not a peer that went away meanwhile)
            self._refusals += 1

    async def _connect(self) -> None:
        welcomed = self._welcomed = self.loop.create_future()
        # Its error is the waiter's; one that comes when nobody waits any more (this task
        # was dropped with its loop) is not "never retrieved" noise in asyncio's log.
        welcomed.add_done_callback(_seen)
        tls = self.tls
        try:
            await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: self, *self.address, ssl=tls.client if tls is not None else None
                ),
                HANDSHAKE_TIMEOUT,
            )
            # Awaited as it is (not shielded): a timeout, or the link closed, cancels it.
            await asyncio.wait_for(welcomed, HANDSHAKE_TIMEOUT)
        except BaseException:
            if self.transport is not None:
                self.transport.abort()
            raise

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:  # the kernel's share of the queue to the peer: bounded too
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        self._decoder = FrameDecoder(self.cluster.settings.max_frame_size)
        if self.tls is not None:  # the peer must be the node meant
            problem = certificate_problem(transport, self.node)
            if problem is not None:
                return self._refuse(problem)
        c = self.cluster
        self._handshake = Connecting(c.settings.secret, c.node, c.boot_id, self.node)
        transport.write(self._handshake.hello())  # type: ignore[attr-defined]

    def _refuse(self, reason: str) -> None:
        """The peer is not the node meant: REFUSED tells it why (it says so too)."""
        log.error(
            "cluster link to %s (%s:%s): refused: %s; closing it", self.node, *self.address, reason
        )
        self._refusals += 1
        assert self.transport is not None
        self.transport.write(frames.encode(REFUSED, reason))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            received = self._decoder.feed(data)
        except FrameError as exc:
            log.warning("cluster link to %s: %s; closing it", self.node, exc)
            assert self.transport is not None
            self.transport.abort()
            return
        for frame in received:
            kind = frame[0]
            if kind in (ACK, ANSWER):
                future = self._requests.pop(frame[1], None)
                if future is not None and not future.done():
                    future.set_result(frame[2])
            elif kind == PONG:
                self._last_pong = self.loop.time()
                if len(frame) > 2:  # (one of its own accord: its figure too)
                    self.peer_at_risk = frame[2]
            elif kind == QUEUED:
                self._queued(self.node, frame[1], frame[2])
            elif kind == DRAINED:  # (from a peer with no link back to this node)
                self.cluster.drained(self.node)
            elif kind == CHALLENGE:
                self._challenged(frame)
            elif kind == WELCOME:
                self._welcome(frame)
            elif kind == REFUSED:
                log.error("node %s refused this node's link: %s", self.node, frame[1])
                self._refusals += 1
                if self._welcomed is not None and not self._welcomed.done():
                    self._welcomed.set_exception(ConnectionError(f"refused: {frame[1]}"))

    def _challenged(self, frame: list[Any]) -> None:
        """CHALLENGE: prove the secret (if the peer is the node meant)."""
        assert self.transport is not None
        if self._handshake is None:  # (the link is up)
            return self._refuse("a CHALLENGE out of place")
        try:
            self.transport.write(self._handshake.proof(frame))
        except HandshakeError as exc:
            self._refuse(str(exc))

    def _welcome(self, frame: list[Any]) -> None:
        """WELCOME: the peer proved the secret too; the link is up."""
        if self._handshake is None:  # (the link is up)
            return self._refuse("a WELCOME out of place")
        try:
            boot_id = self._handshake.welcomed(frame)
        except HandshakeError as exc:
            return self._refuse(str(exc))
        self._handshake = None
        self._refusals = 0
        restarted = bool(self.boot_id and boot_id != self.boot_id)
        # Back without having said it stopped: killed, with what only its memory held.
        lost = self.peer_at_risk if restarted and not self._holding else None
        self.peer_at_risk = 0
        self.boot_id = boot_id
        self.up = True
        self._holding = False
        self._last_pong = self.loop.time()
        log.info("cluster link to %s (%s:%s) up", self.node, *self.address)
        if self._welcomed is not None and not self._welcomed.done():
            self._welcomed.set_result(None)
        self.cluster.link_up(self, restarted, lost)
        if self._pending:
            self._flush()

    def resume_writing(self) -> None:
        self._released()

    def connection_lost(self, exc: Exception | None) -> None:
        was_up = self.up
        self.up = False
        self.transport = None
        self._handshake = None
        if isinstance(exc, ssl.SSLError) and not was_up:  # TLS 1.3: refused after its end
            self._tls_failed(exc)
        for future in self._requests.values():
            if not future.done():
                future.set_exception(ConnectionError(f"the link to {self.node} went down"))
        self._requests.clear()
        if self._welcomed is not None and not self._welcomed.done():
            self._welcomed.set_exception(ConnectionError("closed during the handshake"))
        if was_up:
            log.warning("cluster link to %s (%s:%s) down", self.node, *self.address)
            self.cluster.link_down(self)

    def hold_until_back(self) -> None:
        """The peer is stopping: what is queued from now on waits for its return (up to
        outgoing_buffer_size); DRAINED, after everything written so far, tells it so.
        Until its next WELCOME it is stopped, not unreachable (peer_stopped)."""
        log.info("cluster: node %s is stopping; what is sent to it waits for its return", self.node)
        if self.transport is not None and self.up:
            self._flush()  # (before the hold: _flush writes nothing while holding)
            self.transport.write(frames.encode(DRAINED))
        self._holding = True  # sends pile up in _pending; the next WELCOME flushes them

    def retarget(self, address: tuple[str, int]) -> None:
        """The peer listens elsewhere now (it restarted on another port): reconnect
        there, keeping what waits for it."""
        self.address = address
        self._refusals = 0  # (they were another node's, or nobody's)
        if self.transport is not None:
            self.transport.abort()

    def close(self, graceful: bool = False) -> None:
        """Stop for good (the node is dead, or this node stops): what waits here is
        dropped and counted; `graceful` (this node stops) lets the socket finish writing
        what it took already, where a dead node's is cut."""
        if graceful and self.transport is not None:
            self._flush()  # (while still up: _flush writes only then)
        self.closed = True
        self.up = False
        self._task.cancel()
        if self.transport is not None:
            if graceful:
                self.transport.close()
            else:
                self.transport.abort()
        dropped = self._pending_bytes
        if dropped:
            self.bytes_dropped += dropped
            self.cluster.metrics.cluster_bytes_dropped += dropped
        self._pending.clear()
        self._pending_bytes = 0


class ClusterServerProtocol(asyncio.Protocol):
    """A link another node opened to this one: the handshake first, then its traffic.

    It is a flow-control publisher (broker/flow.py's Reader): when a forwarded message
    fills a local subscriber's queue to its high-water mark, the link stops being read
    (the frames already read wait here) until that subscriber drains; TCP then slows the
    sending node, whose link holds its own publishers. So a message acknowledged on one
    node is not dropped on another because that node fell behind.

    While the link is up this side sends a PONG every liveness_interval of its own
    accord: the sending node knows this one is alive even while its frames wait behind
    megabytes of traffic (or behind a hold), and only a node that answers nothing for
    dead_after (blackholed, hung) is given up on.
    """

    def __init__(self, cluster: ListeningNode, census: Census) -> None:
        self.cluster = cluster
        self.census = census  # what this node holds only in memory: in each PONG
        self.node = ""  # the peer's name, once its handshake is done
        self._hello: Hello | None = None  # what it said in HELLO
        self._challenge = frames.new_nonce()  # this node's nonce, in CHALLENGE
        self.peer: Any = ("?", 0)  # its address (peername)
        self.transport: asyncio.Transport | None = None
        # Until the handshake is done, a frame may be HELLO_MAX_SIZE at most (then _linked
        # raises it to max_frame_size): a stranger's length prefix holds nothing here.
        self._decoder = FrameDecoder(HELLO_MAX_SIZE, BEFORE_HELLO)
        self._listener = listener_of(cluster)
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._heartbeat: asyncio.TimerHandle | None = None
        self._waiting: deque[list[Any]] = deque()  # frames read while held
        self.held = False

    @property
    def who(self) -> str:
        """The peer, for the log: its address, and its name once it said HELLO."""
        address = format_address(self.peer)
        name = self.node or (self._hello.node if self._hello is not None else "")
        return f"{name} ({address})" if name else address

    @property
    def buffered(self) -> int:
        """Bytes of a frame that has not arrived whole yet."""
        return self._decoder.buffered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername") or ("?", 0)
        if not self._listener.admit(self):  # full: closed at once, nothing read
            self.reply(REFUSED, f"max_connections {self._listener.settings.max_connections}")
            transport.close()
            return
        self._handshake_timer = self.cluster.loop.call_later(HANDSHAKE_TIMEOUT, self._no_hello)

    def _no_hello(self) -> None:
        missing = "HELLO" if self._hello is None else "PROOF"
        log.warning(
            "cluster listener: refused a link from %s: no %s in %gs",
            self.who,
            missing,
            HANDSHAKE_TIMEOUT,
        )
        if self.transport is not None:
            self.transport.abort()

    def reply(self, *frame: Any) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frames.encode(*frame))

    def refuse(self, reason: str) -> None:
        log.warning("cluster listener: refused a link from %s: %s", self.who, reason)
        self.reply(REFUSED, reason)
        assert self.transport is not None
        self.transport.close()

    def tls_refused(self, peer: Any, reason: str) -> None:
        """(channel_tls.AcceptedTls) Its TLS handshake failed: the link never began."""
        self.peer = peer or self.peer
        log.warning("cluster listener: refused a link from %s: %s", self.who, reason)

    def data_received(self, data: bytes) -> None:
        self.cluster.metrics.cluster_bytes_received += len(data)
        try:
            received = self._decoder.feed(data)
        except FrameError as exc:
            if self.node:
                log.warning("cluster link from %s: %s; closing it", self.who, exc)
            else:  # before HELLO: garbage, or a length over HELLO_MAX_SIZE
                log.warning("cluster listener: refused a link from %s: %s", self.who, exc)
            self.cluster.metrics.cluster_frames_invalid += 1
            assert self.transport is not None
            self.transport.abort()
            return
        self._waiting.extend(received)
        self._process()

    def _process(self) -> None:
        """Handle the frames read, until flow control holds the link. Once the link has
        closed they are handled all the same (the peer counted them sent); answers to
        them go nowhere."""
        waiting = self._waiting
        while waiting and not self.held:
            if not self.node and self.transport is not None and self.transport.is_closing():
                waiting.clear()  # refused: nothing after its HELLO is read
                return
            frame = waiting.popleft()
            if not self.node:
                self._handshake(frame)
                continue
            try:
                self.cluster.on_frame(self, frame)
            except (ValueError, TypeError, IndexError, KeyError) as exc:
                log.warning(
                    "cluster link from %s: bad frame %r: %s; closing it", self.who, frame[:1], exc
                )
                self.cluster.metrics.cluster_frames_invalid += 1
                waiting.clear()
                if self.transport is not None:
                    self.transport.abort()
                return
        if self.transport is None and not waiting:  # closed, and nothing left to handle
            self.cluster.publisher_gone(self)

    # -- flow control: this link as a publisher -----------------------------------------

    def hold(self) -> None:
        self.held = True
        if self.transport is not None:
            self.transport.pause_reading()

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        self.cluster.loop.call_soon(self._process)

    def _beat(self) -> None:
        self.reply(PONG, 0, self.census.figure)
        self._heartbeat = self.cluster.loop.call_later(
            self.cluster.settings.liveness_interval, self._beat
        )

    def _handshake(self, frame: list[Any]) -> None:
        """HELLO, answered by CHALLENGE; then PROOF, answered by WELCOME: the peer is
        linked. (Or REFUSED from the peer: it found this node is not the one it meant.)"""
        if frame[0] == REFUSED and len(frame) == 2:
            log.warning(
                "cluster listener: the link from %s refused this node: %s", self.who, frame[1]
            )
            assert self.transport is not None
            self.transport.close()
            return
        try:
            if self._hello is None:
                c = self.cluster
                self._hello = frames.hello_of(frame, c.node, c.boot_id)
                self._check_certificate(self._hello.node)
                self.reply(CHALLENGE, self.cluster.node, self._challenge)
            else:
                self._check_proof(frame)
                if self._hello.node == self.cluster.node:
                    # This node itself, through a seed naming it (swc/seeds.py): told so
                    # (the WELCOME names it), not linked.
                    self._welcome()
                    assert self.transport is not None
                    self.transport.close()
                    return
                self._linked()
        except HandshakeError as exc:
            self.refuse(str(exc))

    def _check_certificate(self, node: str) -> None:
        """Over TLS, the name the peer gave must be one its certificate is for."""
        transport = self.transport
        if transport is not None and transport.get_extra_info("ssl_object") is not None:
            problem = certificate_problem(transport, node)
            if problem is not None:
                raise HandshakeError(problem)

    def _check_proof(self, frame: list[Any]) -> None:
        assert self._hello is not None
        if frame[0] != PROOF or len(frame) != 2:
            raise HandshakeError("expected PROOF")
        secret, node = self.cluster.settings.secret, self.cluster.node
        expected = frames.connecting_proof(secret, self._hello, node, self._challenge)
        if not frames.proved(expected, frame[1]):
            raise HandshakeError("wrong cluster secret (its proof does not match)")

    def _linked(self) -> None:
        """The handshake is done: WELCOME, with this node's own proof."""
        assert self._hello is not None
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        c = self.cluster
        self.node = self._hello.node
        self._decoder.set_limit(c.settings.max_frame_size)  # a peer now
        self._welcome()
        self._beat()
        c.inbound_up(self)

    def _welcome(self) -> None:
        """WELCOME, with this node's own proof."""
        assert self._hello is not None
        c = self.cluster
        proof = frames.accepting_proof(
            c.settings.secret, self._hello, c.node, c.boot_id, self._challenge
        )
        self.reply(WELCOME, c.node, c.boot_id, proof)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._handshake_timer, self._heartbeat):
            if timer is not None:
                timer.cancel()
        self.transport = None
        self._listener.closed(self)
        if not self.node or self.cluster.stopping:
            self._waiting.clear()  # nothing to keep (no HELLO yet), or nobody to keep it
        if not self._waiting:  # else: handled as flow control allows, then forgotten
            self.cluster.publisher_gone(self)
        self.cluster.inbound_down(self)


class ClusterListener:
    """The connections open on a node's cluster listener, linked or not yet, and their cap,
    `[cluster] max_connections`: over it a connection is answered REFUSED and closed as
    it is accepted, nothing read. A node needs one per other node (links are one per
    ordered pair of nodes), two for a moment while a link is replaced.

    Reaching the cap is an episode (broker/episodes.py), as for the MQTT and HTTP
    listeners' caps: the first refusal in full, with the numbers; then one line per
    REFUSALS_INTERVAL counting the others; one line when the connections open are down
    to 90% of the cap (not at the first free slot: a count that sways at the cap does
    not log every refusal). Unlike a listener's ConnectionCap's, these lines name a
    peer's address (the first refused, the last of each interval): the port is for a
    known few nodes, and a stranger at it is worth knowing."""

    def __init__(self, settings: ClusterSettings, loop: asyncio.AbstractEventLoop) -> None:
        self.settings = settings
        # Weak: kept per Cluster (listener_of), it must not keep the Cluster alive.
        self.open: weakref.WeakSet[ClusterServerProtocol] = weakref.WeakSet()
        self.full = Episode(
            log,
            "links refused at max_connections",
            loop,
            interval=REFUSALS_INTERVAL,
            counted="cluster listener: %d more links refused at max_connections in the last "
            "%d s, the last from %s",
            end_level=logging.INFO,
        )

    def admit(self, connection: ClusterServerProtocol) -> bool:
        """Whether `connection` fits beside the others (it is counted if so)."""
        limit = self.settings.max_connections
        open_now = len(self.open)
        if open_now < limit:
            self.open.add(connection)
            return True
        self.full.occurred(
            "cluster listener: refused a link from %s: %d connections open, max_connections "
            "%d; refusing new ones until %d are (the others counted, one line per %gs)",
            connection.who,
            open_now,
            limit,
            limit * 9 // 10,
            REFUSALS_INTERVAL,
            reason=connection.who,
        )
        return False

    def closed(self, connection: ClusterServerProtocol) -> None:
        if connection not in self.open:
            return  # refused at the cap: never counted
        self.open.discard(connection)
        open_now = len(self.open)
        if self.full.active and open_now <= self.settings.max_connections * 9 // 10:
            self.full.ended("cluster listener: accepting links again, %d open", open_now)


# One ClusterListener per Cluster, made with its first connection (as broker/client/connect.py
# keeps its Episode per Broker), so node.py needs no hook.
_listeners: weakref.WeakKeyDictionary[LinkEnd, ClusterListener] = weakref.WeakKeyDictionary()


def listener_of(cluster: LinkEnd) -> ClusterListener:
    listener = _listeners.get(cluster)
    if listener is None:
        listener = _listeners[cluster] = ClusterListener(cluster.settings, cluster.loop)
    return listener


def retry_delay(refusals: int) -> float:
    """Seconds before the next attempt at a link refused `refusals` times in a row."""
    return min(RECONNECT_DELAY * 2 ** min(refusals, 8), REFUSED_DELAY_MAX)


def format_address(peer: Any) -> str:
    """A socket's peername as host:port ("[::1]:port" for IPv6)."""
    if not isinstance(peer, tuple) or len(peer) < 2:
        return str(peer)
    host, port = peer[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _seen(future: asyncio.Future[None]) -> None:
    """Mark a handshake's outcome as retrieved (its waiter, if any, still gets it)."""
    if not future.cancelled():
        future.exception()
