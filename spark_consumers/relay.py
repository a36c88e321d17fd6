"""A blocking connection to the event relay, for Spark's Python processes.

Spark calls a data source's methods in plain (not asyncio) Python processes: the driver's
streaming runner asks for offsets and commits, executors read ranges. Each opens one of
these: a HELLO without a start (no streaming), then QUERY, READ and COMMIT as requests
(docs/event-relay.md, "Range reads and queries"). Errors are the asyncio client's
(event_relay.client: RelayError, OutOfRange), naming the relay. With `tls` (a context:
event_relay.client.tls_context) the TLS handshake is done, the relay's certificate
checked against its host name, before HELLO and its secret are sent.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

from event_relay import frames
from event_relay.client import CLOSED_IN_HANDSHAKE, RelayError, relay_error, tls_problem
from event_relay.config import host_port
from event_relay.schema import CODES, expand

TIMEOUT = 30.0  # seconds a request may take before the relay is called unreachable


class RelayConnection:
    def __init__(
        self,
        address: str,
        name: str,
        secret: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        try:
            host, port = host_port(address, "relay")
            self._socket = socket.create_connection((host, port), TIMEOUT)
        except (OSError, ValueError) as exc:
            raise RelayError("unreachable", str(exc), relay=address) from None
        self._reader = frames.FrameReader(frames.MAX_EVENTS_FRAME)
        self._frames: list[tuple[bytes, Any]] = []
        hello: dict[str, Any] = {"version": frames.VERSION, "name": name, "start": None}
        if secret:
            hello["secret"] = secret
        try:
            if tls is not None:  # the handshake, before anything is sent
                self._socket = tls.wrap_socket(self._socket, server_hostname=host)
            self.welcome: dict[str, Any] = self._request(frames.HELLO, hello, frames.WELCOME)
        except ssl.SSLError as exc:
            self._socket.close()
            raise RelayError("tls", tls_problem(exc), relay=address) from None
        except RelayError as exc:
            self._socket.close()
            if exc.code == "closed":  # before WELCOME: not the relay's usual closing
                exc = RelayError("closed", CLOSED_IN_HANDSHAKE)
            raise exc.of(address) from None

    def info(self, heartbeat: bool = False) -> dict[str, Any]:
        """The retained range (first_seq, next_seq), the epoch, the node; with
        `heartbeat`, after the relay appended one (its clock, after every event so far)."""
        query = {"heartbeat": True} if heartbeat else {}
        info: dict[str, Any] = self._request(frames.QUERY, query, frames.INFO)
        return info

    def read(
        self, start: int, end: int, types: list[str] | None = None
    ) -> tuple[list[list[Any]], int]:
        """Every event start <= seq < end (only of `types`, if given: the relay sends no
        other), as msgpack arrays (the relay's compact records made events); and the
        position the relay read up to (`end` or past it when it read the whole range)."""
        request: dict[str, Any] = {"from": start, "to": end}
        if types is not None:
            request["types"] = types
        self._send(frames.READ, request)
        records: list[list[Any]] = []
        while True:
            kind, body = self._next()
            if kind == frames.EVENTS:
                records.extend(body)
            elif kind == frames.READ_END:
                codes = None if types is None else {CODES[t] for t in types}
                return expand(records, start, end, codes), body["next"]
            else:
                raise RelayError("bad_frame", f"unexpected {kind!r} during a READ")

    def commit(self, position: int) -> None:
        self._request(frames.COMMIT, {"seq": position}, frames.COMMITTED)

    def close(self) -> None:
        self._socket.close()

    # -- frames ---------------------------------------------------------------------------

    def _request(self, kind: bytes, body: Any, answer: bytes) -> Any:
        self._send(kind, body)
        got, reply = self._next()
        if got != answer:
            raise RelayError("bad_frame", f"expected {answer!r}, got {got!r}")
        return reply

    def _send(self, kind: bytes, body: Any) -> None:
        self._socket.sendall(frames.frame(kind, body))

    def _next(self) -> tuple[bytes, Any]:
        while not self._frames:
            data = self._socket.recv(1 << 20)
            if not data:
                raise RelayError("closed", "the relay closed the connection")
            self._frames = self._reader.feed(data)
        kind, body = self._frames.pop(0)
        if kind == frames.ERROR:
            raise relay_error(body)
        return kind, body
