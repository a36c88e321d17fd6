"""PROXY protocol v1 and v2 (`proxy_protocol = true` on a listener): a load balancer in
front of the broker sends one header before the client's first byte, naming the client.

A `ProxyHeaderReader` owns a new connection until its header is complete: it frames the
header (a v1 line, or v2's 16 bytes and their length), has the proxy-protocol library
parse it, then hands the transport to the listener's next protocol (the MQTT `Connection`,
the WebSocket protocol, or TLS first: broker/tls_stream.py), tells it the client's address
(`use_peer`) and passes on the bytes that followed. So the MQTT hot path never looks for
a header. A missing or malformed header closes that connection only; a LOCAL (v2) or
UNKNOWN (v1) header, a load balancer's own health check, keeps the socket's address.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from proxyprotocol import ProxyProtocolIncompleteError
from proxyprotocol.detect import ProxyProtocolDetect

log = logging.getLogger("nautilus.connection")

V1_PREFIX = b"PROXY "
V1_MAX = 107  # the longest v1 line, CRLF included
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_FIXED = 16  # signature, version and command, family, length
_DETECT = ProxyProtocolDetect()


class BadHeader(ValueError):
    """Not a PROXY protocol header."""


def header_length(data: bytes | bytearray) -> int | None:
    """How many bytes the PROXY header at the start of `data` takes; None while it is
    incomplete. BadHeader if `data` does not start with one."""
    if data[: len(V2_SIGNATURE)] == V2_SIGNATURE:
        if len(data) < V2_FIXED:
            return None
        length = V2_FIXED + int.from_bytes(data[14:16], "big")
        return length if len(data) >= length else None
    if data[: len(V1_PREFIX)] == V1_PREFIX:
        end = data.find(b"\r\n", 0, V1_MAX)
        if end >= 0:
            return end + 2
        if len(data) >= V1_MAX:
            raise BadHeader(f"a v1 header longer than {V1_MAX} bytes")
        return None
    if V2_SIGNATURE.startswith(data) or V1_PREFIX.startswith(data):
        return None  # too short to tell yet
    raise BadHeader("the connection does not start with a PROXY protocol header")


class ProxyHeaderReader(asyncio.Protocol):
    """A connection's first owner on a proxy_protocol listener (see the module doc)."""

    def __init__(
        self,
        waiting: set[ProxyHeaderReader],
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        make_next: Callable[[], asyncio.Protocol],
    ) -> None:
        self.waiting = waiting  # the listener's connections before their header
        self.loop = loop
        self.timeout = timeout  # seconds the header may take (connect_timeout)
        self.make_next = make_next
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.waiting.add(self)
        self.timer = self.loop.call_later(self.timeout, self.refuse, "no PROXY header in time")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        try:
            length = header_length(self.buffer)
            if length is None:
                return
            result = _DETECT.unpack(bytes(self.buffer[:length]))
        except (ValueError, ProxyProtocolIncompleteError) as exc:  # BadHeader, a bad address
            return self.refuse(f"bad PROXY header: {exc}")
        self._done()
        transport = self.transport
        assert transport is not None
        protocol = self.make_next()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        peer = result.peername if result.proxied else None
        if isinstance(peer, tuple):  # IPv4 / IPv6; a LOCAL or UNKNOWN header: the socket's
            protocol.use_peer((str(peer[0]), int(peer[1])))  # type: ignore[attr-defined]
        rest = bytes(self.buffer[length:])
        self.buffer.clear()
        if rest:
            protocol.data_received(rest)

    def connection_lost(self, exc: Exception | None) -> None:
        self._done()

    def refuse(self, why: str) -> None:
        """Close the connection (no header, a bad one, or the broker stopping)."""
        self._done()
        if self.transport is not None and not self.transport.is_closing():
            peer = self.transport.get_extra_info("peername") or ("?", 0)
            log.info("%s:%s: %s; closing", peer[0], peer[1], why)
            self.transport.close()

    def _done(self) -> None:
        self.waiting.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
