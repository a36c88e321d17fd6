"""The relay's TCP server: consumers attach, name themselves, pick event types and a
start, and read the log (docs/event-relay.md has the protocol).

A consumer is a position in the log, nothing more: the server writes EVENTS frames from
the log while the consumer's socket takes them, and stops when its write buffer is over
the high-water mark (asyncio's pause_writing), so a consumer that stops reading costs the
broker a bounded buffer and its position. It is served from memory or from the spool
alike; if it falls behind the retained range it gets an `out_of_range` ERROR, never a
silent gap.

With TLS on (`certfile`), every connection is TLS: a consumer's first byte is read by
the handshake (broker.tls_stream, over the listeners' contexts, reloaded on SIGHUP), so
nothing, HELLO's secret included, is read in clear; a failed handshake is one WARNING.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import ssl
from collections.abc import Callable
from typing import Any, cast

from broker.binding import BindError
from broker.tls import TlsListener
from broker.tls_stream import TlsStream
from event_relay import frames
from event_relay.config import RelayConfig, host_port
from event_relay.log import EventLog, OutOfRange
from event_relay.schema import CODES, record_codes

log = logging.getLogger("nautilus.event_relay")

HANDSHAKE_TIMEOUT = 10.0  # seconds a new connection has to send HELLO
WRITE_HIGH_WATER = 1024 * 1024  # bytes queued to one consumer before the server waits
# New events wait up to LINGER seconds for those that follow, unless LINGER_BYTES of them
# wait: a frame (and a system call) per consumer per loop turn cost a busy broker a tenth
# of its time; this way a consumer that keeps up gets fewer, larger frames.
LINGER = 0.002
LINGER_BYTES = 256 * 1024
STARTS = ("earliest", "latest", "committed")


class RelayServer:
    def __init__(
        self,
        event_log: EventLog,
        config: RelayConfig,
        epoch: str,
        heartbeat: Callable[[], None],
    ) -> None:
        self.log = event_log
        self.config = config
        self.epoch = epoch
        self.heartbeat = heartbeat  # appends one (QUERY {heartbeat: true})
        self.node = config.node_name
        self.consumers: set[Consumer] = set()
        self.commits: dict[str, int] = {}  # consumer name -> committed position
        self.address: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self.frames_sent = 0
        self.records_sent = 0  # events, or compact records of several
        self._served_bytes = 0  # the log's appended_bytes when the consumers were served
        self._linger: asyncio.TimerHandle | None = None
        # The contexts of TLS (ConfigError naming the key if a file will not load).
        self.tls = TlsListener(config, "event_relay") if config.certfile else None
        _warn_if_in_clear(config)

    async def start(self) -> None:
        host, port = host_port(self.config.address, "event_relay.address")
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(self._accept, host, port)
        except OSError as exc:
            change = "[event_relay] address, or enabled = false"
            raise BindError("event_relay.address", self.config.address, exc, change) from None
        self.address = self._server.sockets[0].getsockname()[:2]
        self.log.listen(self._wake)
        log.info("event relay listening on %s:%s", *self.address)

    async def stop(self) -> None:
        self.log.unlisten(self._wake)
        if self._linger is not None:
            self._linger.cancel()
        if self._server is not None:
            self._server.close()
            for consumer in list(self.consumers):
                consumer.close()
            await self._server.wait_closed()

    def _accept(self) -> asyncio.Protocol:
        """A new connection's protocol: a consumer, behind the TLS handshake if TLS is on."""
        if self.tls is None:
            return Consumer(self)
        loop = asyncio.get_running_loop()
        return ConsumerTls(self.tls.server, lambda: Consumer(self), loop, HANDSHAKE_TIMEOUT)

    def _wake(self) -> None:
        """New events: the streaming consumers get them now if LINGER_BYTES wait, else
        within LINGER seconds."""
        if self.log.appended_bytes - self._served_bytes >= LINGER_BYTES:
            self._serve()
        elif self._linger is None:
            self._linger = asyncio.get_running_loop().call_later(LINGER, self._serve)

    def _serve(self) -> None:
        """Every streaming consumer at the end of the log reads on."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self._served_bytes = self.log.appended_bytes
        for consumer in self.consumers:
            if consumer.streaming and not consumer.paused:
                consumer.pump()

    def committed(self, name: str) -> int | None:
        position = self.commits.get(name)
        if position is None and self.log.spool is not None:
            position = self.log.spool.committed(name)
        return position

    def commit(self, name: str, position: int) -> None:
        self.commits[name] = position
        if self.log.spool is not None:
            self.log.spool.commit(name, position, self.log.sync)
        trimmers = self.config.trim_committed
        if name in trimmers:
            positions = [self.committed(trimmer) for trimmer in trimmers]
            if None not in positions:  # each has committed: the lowest is safe to go
                self.log.trim_to(min(p for p in positions if p is not None))


class Consumer(asyncio.Protocol):
    """One consumer's connection: the handshake, then streaming or range reads."""

    def __init__(self, server: RelayServer) -> None:
        self.server = server
        self.reader = frames.FrameReader()
        self.transport: asyncio.Transport | None = None
        self.name = ""
        self.codes: frozenset[int] | None = None  # the types asked for; None: all
        self.position = 0  # the next sequence number to look at
        self.end: int | None = None  # a range read stops here (exclusive)
        self.remaining = 0  # a range read's events still wanted
        self.streaming = False
        self.reading = False  # a range read is being served
        self.paused = False
        self.welcomed = False
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass).
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.server.consumers.add(self)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.consumers.discard(self)
        self.streaming = self.reading = False
        if self._timer is not None:
            self._timer.cancel()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.pump()

    def data_received(self, data: bytes) -> None:
        try:
            received = self.reader.feed(data)
        except frames.FrameError as exc:
            return self.fail("bad_frame", str(exc))
        for kind, body in received:
            if self.transport is None or self.transport.is_closing():
                return
            if not self.welcomed:
                if kind != frames.HELLO:
                    return self.fail("bad_handshake", "the first frame must be HELLO")
                self.hello(body)
            elif kind == frames.COMMIT:
                self.commit(body)
            elif kind == frames.QUERY:
                if isinstance(body, dict) and body.get("heartbeat") is True:
                    self.server.heartbeat()  # the reader reads up to now: time included
                self.send(frames.INFO, self.info())
            elif kind == frames.READ:
                self.read(body)
            else:
                self.fail("bad_request", f"a consumer does not send {kind.decode()} frames")

    # -- requests -----------------------------------------------------------------------

    def hello(self, body: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        problem = _hello_problem(body)
        if problem is not None:
            return self.fail("bad_handshake", problem)
        version = body.get("version", frames.VERSION)
        if isinstance(version, bool) or version != frames.VERSION:
            return self.fail("unsupported_version", f"this relay speaks version {frames.VERSION}")
        secret = self.server.config.secret
        given = str(body.get("secret") or "").encode()
        if secret and not hmac.compare_digest(given, secret.encode()):
            peer = _peer(self.transport)
            log.warning(
                "event relay: %s: consumer %r refused: wrong or missing secret", peer, body["name"]
            )
            return self.close_with_error("unauthorized", "a valid secret is required")
        self.name = body["name"]
        types = body.get("types")
        self.codes = None if types is None else record_codes(frozenset(CODES[t] for t in types))
        event_log = self.server.log
        start = body.get("start")
        if start == "earliest":
            self.position = event_log.first_seq
        elif start == "latest":
            self.position = event_log.next_seq
        elif start == "committed":
            committed = self.server.committed(self.name)
            self.position = event_log.first_seq if committed is None else committed
        elif start is not None:
            self.position = start
        self.welcomed = True
        self.send(
            frames.WELCOME, {**self.info(), "start": None if start is None else self.position}
        )
        log.info("event relay: consumer %r attached from %s", self.name, start)
        if start is not None:
            self.streaming = True
            self.pump()

    def commit(self, body: Any) -> None:
        seq = body.get("seq") if isinstance(body, dict) else None
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            return self.fail("bad_request", "COMMIT needs {seq: a sequence number}")
        self.server.commit(self.name, seq)
        self.send(frames.COMMITTED, {"seq": seq})

    def read(self, body: Any) -> None:
        if self.streaming or self.reading:
            return self.fail("bad_request", "READ is for a connection that does not stream")
        if not isinstance(body, dict) or not all(
            isinstance(body.get(key), int) for key in ("from", "to")
        ):
            return self.fail("bad_request", "READ needs {from: integer, to: integer}")
        limit = body.get("limit")
        types = body.get("types")
        if types is not None and (
            not isinstance(types, list) or any(t not in CODES for t in types)
        ):
            return self.fail("bad_request", f"unknown event types in {types!r}")
        self.codes = None if types is None else record_codes(frozenset(CODES[t] for t in types))
        self.position, self.end = body["from"], body["to"]
        self.remaining = limit if isinstance(limit, int) and limit > 0 else 2**63
        self.reading = True
        self.pump()

    def info(self) -> dict[str, Any]:
        event_log = self.server.log
        return {
            "version": frames.VERSION,
            "node": self.server.node,
            "epoch": self.server.epoch,
            "first_seq": event_log.first_seq,
            "next_seq": event_log.next_seq,
            "payloads": self.server.config.payloads,
            "committed": self.server.committed(self.name) if self.name else None,
        }

    # -- serving the log ------------------------------------------------------------------

    def pump(self) -> None:
        """Write what the log has for this consumer while its socket takes it: until it
        is caught up or its buffer is past the high-water mark (pause_writing), which
        bounds what one turn writes. Serving all that was appended keeps a consumer up
        with however many events a loop turn produced."""
        if not (self.streaming or self.reading) or self.transport is None:
            return
        event_log = self.server.log
        batch = self.server.config.batch_events
        transport = self.transport
        while not (self.paused or transport.is_closing()):
            end = self.end if self.reading else None
            readable = event_log.readable_next
            stop = readable if end is None else min(end, readable)
            limit = min(batch, self.remaining) if self.reading else batch
            try:
                if self.position >= stop and self.position <= event_log.next_seq:
                    break  # caught up (a position past next_seq is from another epoch)
                events, position = event_log.read(
                    self.position, limit, self.codes, end, frames.FRAME_BYTES
                )
            except OutOfRange as exc:
                return self.fail(
                    "out_of_range",
                    str(exc),
                    first_seq=exc.first_seq,
                    next_seq=exc.next_seq,
                    requested=exc.requested,
                )
            if position == self.position and not events:
                break  # nothing readable yet (not in the spool): woken again later
            self.position = position
            if events:
                transport.write(frames.events_frame(events))
                self.server.frames_sent += 1
                self.server.records_sent += len(events)
                if self.reading:
                    self.remaining -= len(events)
                    if self.remaining <= 0:
                        break
        else:
            return  # paused: resume_writing() goes on
        if self.reading:
            self.reading = False
            self.send(frames.READ_END, {"next": self.position})

    # -- helpers --------------------------------------------------------------------------

    def send(self, kind: bytes, body: Any) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frames.frame(kind, body))

    def fail(self, code: str, message: str, **details: Any) -> None:
        """Log what went wrong, tell the consumer, then close."""
        log.info("event relay: consumer %r: %s: %s", self.name, code, message)
        self.close_with_error(code, message, **details)

    def close_with_error(self, code: str, message: str, **details: Any) -> None:
        """Tell the consumer what went wrong (an ERROR frame), then close."""
        self.send(frames.ERROR, {"code": code, "message": message, **details})
        self.close()

    def close(self) -> None:
        self.streaming = self.reading = False
        if self.transport is not None:
            self.transport.close()

    def _handshake_timeout(self) -> None:
        self._timer = None
        if not self.welcomed:
            self.fail("bad_handshake", f"no HELLO within {HANDSHAKE_TIMEOUT:g} seconds")


class ConsumerTls(TlsStream):
    """A consumer's connection, its TLS handshake first: one that fails is one WARNING
    naming the peer and why, then the connection closes. A consumer that refuses the
    relay's certificate may close without a word (asyncio's client sends no alert): that
    is said too, unless it sent nothing at all (a port probe)."""

    begun = False  # the consumer has sent some of its handshake

    def data_received(self, data: bytes) -> None:
        self.begun = True
        super().data_received(data)

    def handshake_failed(self, peer: Any, exc: ssl.SSLError) -> None:
        _handshake_failed(peer, handshake_problem(exc))

    def eof_received(self) -> bool | None:
        if self.upper is None and self.begun and self.socket is not None:
            peer = self.socket.get_extra_info("peername")
            _handshake_failed(
                peer, "the consumer closed the connection (does it trust the relay's certificate?)"
            )
        return super().eof_received()


def _handshake_failed(peer: Any, why: str) -> None:
    log.warning("event relay: %s: TLS handshake failed: %s", _address(peer), why)


# What a failed handshake's OpenSSL reason means, from the relay's side.
_NOT_TLS = "not TLS (a consumer without TLS on the TLS port?)"
_HANDSHAKE_PROBLEMS = {
    "WRONG_VERSION_NUMBER": _NOT_TLS,
    "HTTP_REQUEST": _NOT_TLS,
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "the consumer showed no certificate "
    "(require_certificate = true)",
    "TLSV1_ALERT_UNKNOWN_CA": "the consumer does not trust the relay's certificate (unknown CA)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the consumer refused the relay's certificate (not for "
    "the host it connected to, or out of date?)",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the consumer refused the relay's certificate",
}


def handshake_problem(exc: ssl.SSLError) -> str:
    """Why a consumer's TLS handshake failed, in a few words."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the consumer's certificate is not trusted ({exc.verify_message})"
    return _HANDSHAKE_PROBLEMS.get(exc.reason or "", exc.reason or str(exc))


def _peer(transport: asyncio.BaseTransport | None) -> str:
    return _address(None if transport is None else transport.get_extra_info("peername"))


def _address(peer: Any) -> str:
    """host:port of a socket's peer name."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


def _warn_if_in_clear(config: RelayConfig) -> None:
    """A secret without TLS on an address other machines may reach: say that it travels
    in clear, as the events do."""
    host, _ = host_port(config.address, "event_relay.address")
    if config.secret and not config.certfile and not _loopback(host):
        log.warning(
            "event relay: secret is set but TLS is off: the secret and the events cross the "
            "network in clear to consumers of %s (set event_relay.certfile and "
            "event_relay.keyfile to turn TLS on)",
            config.address,
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to any interface
        return False


def _hello_problem(body: Any) -> str | None:
    """What is wrong with a HELLO body, or None."""
    if not isinstance(body, dict):
        return "HELLO must be a map"
    name = body.get("name")
    if not isinstance(name, str) or not name:
        return "HELLO needs a consumer name (a non-empty string)"
    types = body.get("types")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            return "types must be a list of event type names"
        unknown = [t for t in types if t not in CODES]
        if unknown:
            return f"unknown event types {unknown} (known: {', '.join(CODES)})"
    start = body.get("start")
    if (
        start is not None
        and start not in STARTS
        and not (isinstance(start, int) and not isinstance(start, bool) and start >= 1)
    ):
        return "start must be 'earliest', 'latest', 'committed', a sequence number or nil"
    return None
