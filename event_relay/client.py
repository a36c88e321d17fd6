"""An asyncio client of the event relay: iterate events, commit, resume, read ranges.

    async with await RelayClient.connect("127.0.0.1", 7883, name="billing",
                                         start="committed") as relay:
        async for event in relay:
            handle(event)                     # a dict: seq, ts, type, client_id, ...
            await relay.commit(event["seq"] + 1)

A connection opened with `start=None` does not stream; it answers `read(a, b)` (the
events with sequence numbers a <= seq < b) and `info()`, as Spark's executors use it.

The relay sends records (docs/event-relay.md, "Compact records"): an event, or a compact
record of several (a message's publish and deliveries, or one receiver's deliveries and
completions). Iterating the client and `read` give events; `batches` and `read_raw` give
the records as they came (`schema.expand` makes events of them), for a sink that forwards
them or counts them cheaply (`schema.event_count`).
Errors the relay sends (docs/event-relay.md, "Errors") are raised as RelayError, with
OutOfRange for a position the relay no longer holds.

Over TLS (`tls=tls_context(...)`: the relay's `certfile` is set) the handshake is done,
the relay's certificate checked against the CA and the host name, before HELLO (and the
secret in it) is sent; a failed handshake is a RelayError with code `tls` saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from broker.tls import HandshakeWords, handshake_problem, why
from event_relay import frames
from event_relay.schema import CODES, decode_event, expand

QUEUED_BATCHES = 8  # batches read ahead; past that, TCP pushes back on the relay


class RelayError(Exception):
    """The relay refused or ended the conversation; `code` says why, `relay` (host:port,
    once known) which relay."""

    def __init__(
        self,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        relay: str | None = None,
    ) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.details = details or {}
        self.relay = relay

    def __str__(self) -> str:
        where = f"relay {self.relay}: " if self.relay else ""
        return f"{where}{self.code}: {self.message}"

    def of(self, relay: str) -> RelayError:
        """This error, saying which relay it came from."""
        self.relay = relay
        return self


class OutOfRange(RelayError):
    """The position asked for is outside what the relay retains (`first_seq` on)."""


class RelayClient:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        welcome: dict[str, Any],
        frame_reader: frames.FrameReader,
        early: list[tuple[bytes, Any]],
        types: list[str] | None = None,
        relay: str = "",
    ) -> None:
        self.relay = relay  # host:port, in its errors
        self._reader = reader
        self._frame_reader = frame_reader
        self._early = early  # frames that came in with WELCOME
        self._writer = writer
        self.welcome = welcome
        self.node: str = welcome["node"]
        self.epoch: str = welcome["epoch"]
        self.start: int | None = welcome["start"]
        self.payloads: str = welcome["payloads"]
        # The event types asked for: a compact record may hold others too.
        self._codes = None if types is None else frozenset(CODES[t] for t in types)
        # Batches read ahead of the consumer. The reader stops reading the socket (so TCP
        # pushes back on the relay) when QUEUED_BATCHES wait, unless an answer is awaited:
        # it may be behind them in the stream (what was in flight, a bounded amount).
        self._batches: deque[list[list[Any]]] = deque()
        self._arrived = asyncio.Event()  # a batch or the end came
        self._taken = asyncio.Event()  # the consumer took a batch
        # Futures waiting for an answer, per answer kind: the relay answers each kind of
        # request in order, but a QUERY may be answered while a long READ is served.
        self._replies: dict[bytes, deque[asyncio.Future[Any]]] = {
            frames.COMMITTED: deque(),
            frames.INFO: deque(),
            frames.READ_END: deque(),
        }
        self._range: list[list[Any]] | None = None
        self._error: RelayError | None = None
        self._task = asyncio.ensure_future(self._read_frames())

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        name: str,
        start: str | int | None = "latest",
        types: list[str] | None = None,
        secret: str | None = None,
        tls: ssl.SSLContext | None = None,
        timeout: float = 10.0,
    ) -> RelayClient:
        """Attach as consumer `name`. start: "earliest", "latest", "committed" (where this
        name last committed), a sequence number, or None (no streaming: reads only).
        tls: connect with TLS (tls_context()), checking the certificate against `host`."""
        relay = f"{host}:{port}"
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    host, port, ssl=tls, server_hostname=host if tls is not None else None
                ),
                timeout,
            )
        except ssl.SSLError as exc:
            raise RelayError("tls", tls_problem(exc), relay=relay) from None
        hello: dict[str, Any] = {
            "version": frames.VERSION,
            "name": name,
            "start": start,
            "types": types,
        }
        if secret is not None:
            hello["secret"] = secret
        writer.write(frames.frame(frames.HELLO, hello))
        frame_reader = frames.FrameReader(frames.MAX_EVENTS_FRAME)
        try:
            received = await asyncio.wait_for(_first_frames(reader, frame_reader), timeout)
            kind, body = received[0]
            if kind == frames.ERROR:
                raise relay_error(body)
            if kind != frames.WELCOME:
                raise RelayError("bad_frame", f"expected WELCOME, got {kind!r}")
        except ssl.SSLError as exc:
            # TLS 1.3: a client certificate the relay refuses shows here, in its first
            # reply (this side's handshake was done).
            await _close(writer)
            raise RelayError("tls", tls_problem(exc), relay=relay) from None
        except RelayError as exc:
            await _close(writer)
            raise exc.of(relay) from None
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer, body, frame_reader, received[1:], types, relay)

    # -- streaming ----------------------------------------------------------------------

    async def batches(self) -> AsyncIterator[list[list[Any]]]:
        """The records as they come, one batch (a list of msgpack arrays) at a time. The
        first may begin before the start asked for."""
        batches = self._batches
        while True:
            if batches:
                batch = batches.popleft()
                self._taken.set()
                yield batch
                continue
            error = self._error
            if error is not None:
                if error.code == "closed":
                    return
                raise error
            self._arrived.clear()
            await self._arrived.wait()

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        """The events one by one, with their fields named (event_relay.schema) and the
        relay's `node`."""
        node = self.node
        position = self.start or 0  # a record may begin before it
        async for batch in self.batches():
            for values in expand(batch, position, codes=self._codes):
                event = decode_event(values)
                event["node"] = node  # said once, in WELCOME
                yield event
            position = 0

    # -- requests -----------------------------------------------------------------------

    async def commit(self, position: int) -> None:
        """Record that this consumer has processed everything before `position`."""
        await self._request(frames.COMMIT, {"seq": position}, frames.COMMITTED)

    async def info(self) -> dict[str, Any]:
        """The relay's node, epoch, retained range and this consumer's commit."""
        info: dict[str, Any] = await self._request(frames.QUERY, {}, frames.INFO)
        return info

    async def read_raw(
        self, start: int, end: int, *, types: list[str] | None = None, limit: int | None = None
    ) -> tuple[list[list[Any]], int]:
        """The records holding the events start <= seq < end (at most `limit` records)
        as msgpack arrays, and the position after the last one looked at. Only on a
        connection that does not stream."""
        self._range = []
        body = {"from": start, "to": end, "types": types, "limit": limit}
        try:
            done = await self._request(frames.READ, body, frames.READ_END)
            return self._range, done["next"]
        finally:
            self._range = None

    async def read(
        self, start: int, end: int, *, types: list[str] | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        records, _ = await self.read_raw(start, end, types=types, limit=limit)
        codes = None if types is None else {CODES[t] for t in types}
        decoded = [decode_event(values) for values in expand(records, start, end, codes)]
        for event in decoded:
            event["node"] = self.node
        return decoded

    async def _request(self, kind: bytes, body: Any, reply: bytes) -> Any:
        if self._error is not None:
            raise self._error
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._replies[reply].append(future)
        self._taken.set()  # a reader waiting for room reads on: the answer may be behind
        self._writer.write(frames.frame(kind, body))
        await self._writer.drain()
        return await future

    # -- the connection -------------------------------------------------------------------

    async def _read_frames(self) -> None:
        try:
            for kind, body in self._early:
                await self._dispatch(kind, body)
            self._early = []
            while True:
                data = await self._reader.read(256 * 1024)
                if not data:
                    raise RelayError("closed", "the relay closed the connection")
                for kind, body in self._frame_reader.feed(data):
                    await self._dispatch(kind, body)
        except frames.FrameError as exc:
            self._fail(RelayError("bad_frame", str(exc)))
        except RelayError as exc:
            self._fail(exc)
        except (ConnectionError, OSError) as exc:
            self._fail(RelayError("closed", str(exc)))

    async def _dispatch(self, kind: bytes, body: Any) -> None:
        if kind == frames.EVENTS:
            if self._range is not None:
                self._range.extend(body)
                return
            self._batches.append(body)
            self._arrived.set()
            while len(self._batches) > QUEUED_BATCHES and not self._awaiting_answer():
                self._taken.clear()
                await self._taken.wait()
        elif kind == frames.ERROR:
            raise relay_error(body)
        else:
            waiting = self._replies.get(kind)
            if not waiting:
                raise RelayError("bad_frame", f"an answer nothing asked for: {kind!r}")
            future = waiting.popleft()
            if not future.done():
                future.set_result(body)

    def _awaiting_answer(self) -> bool:
        return any(self._replies.values())

    def _fail(self, error: RelayError) -> None:
        self._error = error.of(self.relay)
        for waiting in self._replies.values():
            while waiting:
                future = waiting.popleft()
                if not future.done():
                    future.set_exception(error)
        self._arrived.set()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> RelayClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close a connection the handshake failed on, and wait for it: the error it ended
    with is then taken (not left in its closing future, which a process that exits
    right after may report as 'Future exception was never retrieved')."""
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 1.0)


async def _first_frames(
    reader: asyncio.StreamReader, frame_reader: frames.FrameReader
) -> list[tuple[bytes, Any]]:
    """The frames of the first read that completes one (WELCOME or ERROR first)."""
    while True:
        data = await reader.read(65536)
        if not data:
            raise RelayError("closed", CLOSED_IN_HANDSHAKE)
        received = frame_reader.feed(data)
        if received:
            return received


# A relay with TLS on closes a connection that does not start with a TLS handshake.
CLOSED_IN_HANDSHAKE = (
    "the relay closed the connection during the handshake (if its TLS is on, connect with TLS)"
)


def tls_context(
    cafile: str | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
    option: str = "",
) -> ssl.SSLContext:
    """A client context for a relay with TLS: its certificate checked against `cafile`
    (the system's CAs without it) and the host name; `certfile` (and `keyfile`, unless
    the key is in it) this consumer's certificate. A file that does not load is a
    ValueError naming it as `option` + "cafile" (`--relay-` on the command line)."""
    try:
        context = ssl.create_default_context(cafile=cafile or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"{option}cafile: cannot load {cafile}: {why(exc)}") from None
    if certfile:
        try:
            context.load_cert_chain(certfile, keyfile or None)
        except (OSError, ssl.SSLError) as exc:
            key = f" with the key {keyfile}" if keyfile else ""
            raise ValueError(f"{option}certfile: cannot load {certfile}{key}: {why(exc)}") from None
    elif keyfile:
        raise ValueError(f"{option}keyfile: given without the certificate it is the key of")
    return context


# What a failed handshake means, from the consumer's side.
_TLS_WORDS = HandshakeWords(
    untrusted="the relay's certificate is not trusted",
    closed="the relay closed the connection during the TLS handshake",
    reasons={
        "WRONG_VERSION_NUMBER": "the relay does not speak TLS on this port (is its certfile set?)",
        "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the relay requires a client certificate",
        "SSLV3_ALERT_HANDSHAKE_FAILURE": "the relay refused the handshake (does it require a "
        "client certificate?)",
        "TLSV1_ALERT_UNKNOWN_CA": "the relay refused this consumer's certificate (unknown CA)",
        "SSLV3_ALERT_BAD_CERTIFICATE": "the relay refused this consumer's certificate",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the relay refused this consumer's certificate",
    },
)


def tls_problem(exc: ssl.SSLError) -> str:
    """Why the TLS handshake with the relay failed, in a few words."""
    return handshake_problem(exc, _TLS_WORDS)


def relay_error(body: Any) -> RelayError:
    """The exception for an ERROR frame's body (OutOfRange for `out_of_range`)."""
    if not isinstance(body, dict):
        return RelayError("bad_frame", repr(body))
    details = {k: v for k, v in body.items() if k not in ("code", "message")}
    cls = OutOfRange if body.get("code") == "out_of_range" else RelayError
    return cls(str(body.get("code")), str(body.get("message")), details)
