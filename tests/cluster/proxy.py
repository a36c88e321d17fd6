"""A TCP proxy for cutting the links between broker nodes in tests (stdlib asyncio only).

The proxy listens on 127.0.0.1 (ephemeral port) and forwards each accepted connection to
`target`. It runs its own event loop in a daemon thread, so synchronous tests drive it;
every mode switch returns once the mode is in effect (sockets closed, flags set).

Two ways to cut a link:

- `reset()`: every live connection is closed with an RST on both sides (SO_LINGER 0), and
  new connections are accepted and reset at once. Each peer sees the loss immediately
  (ECONNRESET or EOF): the "process died / link refused" case.
- `blackhole()`: live connections stay open but every byte, both ways, is read and dropped;
  new connections are accepted, connected to nothing (the target never sees them) and
  swallowed the same way. No peer gets an error, only silence: only timeouts and
  heartbeats can notice, as in a real netsplit. (The kernel still ACKs what is sent, so
  senders' buffers do not fill up.)

`recorded` holds every byte forwarded, both ways (what a reader of the network sees).

`pass_through()` (the default) forwards again. Connections blackholed until then are reset
(RST) at that moment, since the bytes they lost would leave their streams corrupt: the
endpoints see the link drop and reconnect cleanly through the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from typing import Any

_LOCAL = ("127.0.0.1", 0)  # where the proxy listens (ephemeral port)
_LINGER_0 = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST


class _Side(asyncio.Protocol):
    """One socket of a link: the client's (accepted) or the target's (connected)."""

    def __init__(self, link: _Link) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.link.made(self)

    def data_received(self, data: bytes) -> None:
        self.link.forward(self, data)

    def eof_received(self) -> bool:
        return False  # close this side; connection_lost then closes the other

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.link.side_lost(exc)

    def pause_writing(self) -> None:  # our peer outruns this socket: stop reading the peer
        if (peer := self.link.peer_of(self)) and peer.transport:
            peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if (peer := self.link.peer_of(self)) and peer.transport:
            peer.transport.resume_reading()

    def close(self, how: str) -> None:
        """ "close": FIN once written out; "abort": FIN now, unsent bytes dropped; "rst"."""
        if self.transport is None:
            return
        if how == "rst":
            with contextlib.suppress(OSError):
                sock = self.transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
        if how == "close":
            self.transport.close()
        else:
            self.transport.abort()


class _Link:
    """A client connection and its connection to the target (None while connecting)."""

    def __init__(self, proxy: TcpProxy) -> None:
        self.proxy = proxy
        self.client = _Side(self)
        self.upstream: _Side | None = None
        self.swallow = proxy.mode == "blackhole"
        self.pending: list[bytes] = []  # from the client before the target is connected
        self.connecting: asyncio.Task[Any] | None = None
        self.closed = False

    def made(self, side: _Side) -> None:
        if side is self.client:
            self.proxy.accepted(self)
        elif self.closed:
            side.close("rst")
        else:
            self.upstream = side
            for data in self.pending:
                self.forward(self.client, data)
            self.pending.clear()

    def peer_of(self, side: _Side) -> _Side | None:
        return self.upstream if side is self.client else self.client

    def forward(self, side: _Side, data: bytes) -> None:
        if self.swallow or self.closed:
            return
        peer = self.peer_of(side)
        if peer is None or peer.transport is None:
            self.pending.append(data)
            return
        self.proxy._bytes += len(data)  # first: write() may send at once
        self.proxy._recorded += data
        peer.transport.write(data)

    async def connect(self, target: tuple[str, int]) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_connection(lambda: _Side(self), *target)
        except OSError:  # refused, unreachable: the client sees its connection closed
            self.connecting = None  # done: not to be cancelled by close()
            self.close("close")

    def side_lost(self, exc: Exception | None) -> None:
        self.close("close" if exc is None else "rst")  # a reset is passed on as a reset

    def close(self, how: str) -> list[asyncio.Future[None]]:
        """Close both sides; returns the futures done once their sockets are closed."""
        if not self.closed:
            self.closed = True
            self.proxy._links.discard(self)
            if self.connecting is not None:
                self.connecting.cancel()
            for side in (self.client, self.upstream):
                if side is not None:
                    side.close(how)
        return [s.lost for s in (self.client, self.upstream) if s and s.transport]


class TcpProxy:
    """Forwards 127.0.0.1:<port> to `target`; see the module docstring for the modes."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.mode = "pass"  # "pass", "reset" or "blackhole"; read and set on the loop
        self._links: set[_Link] = set()
        self._bytes = 0
        self._recorded = bytearray()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.name = f"tcp-proxy-to-{target[1]}"
        self._server: asyncio.Server | None = None
        self._address: tuple[str, int] | None = None

    def start(self) -> TcpProxy:
        self._thread.start()
        try:
            self._server = self._call(self._loop.create_server(lambda: _Link(self).client, *_LOCAL))
            self._address = self._server.sockets[0].getsockname()[:2]
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> TcpProxy:
        return self if self._server is not None else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def address(self) -> tuple[str, int]:
        """Where clients connect (still known after close())."""
        assert self._address is not None, "start() first"
        return self._address

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def connections(self) -> int:
        """Client connections held open (passed through, connecting, or swallowed)."""
        return len(self._links)

    @property
    def bytes_forwarded(self) -> int:
        """Bytes passed on, both directions together (swallowed ones not counted)."""
        return self._bytes

    @property
    def recorded(self) -> bytes:
        """Every byte passed on so far, both directions interleaved."""
        return self._call(self._copy())

    async def _copy(self) -> bytes:
        return bytes(self._recorded)

    def pass_through(self) -> None:
        self._call(self._set_mode("pass"))

    def reset(self) -> None:
        self._call(self._set_mode("reset"))

    def blackhole(self) -> None:
        self._call(self._set_mode("blackhole"))

    def close(self) -> None:
        """Close the listening socket and every connection, stop the loop and thread."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            try:
                self._call(self._shutdown())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10)
        self._loop.close()

    # ------------------------------------------------------------------ on the loop

    def accepted(self, link: _Link) -> None:
        if self.mode == "reset":
            link.close("rst")
            return
        self._links.add(link)
        if self.mode == "pass":
            link.connecting = self._loop.create_task(link.connect(self.target))

    async def _set_mode(self, mode: str) -> None:
        previous, self.mode = self.mode, mode
        lost: list[asyncio.Future[None]] = []
        for link in list(self._links):
            if mode == "reset" or (previous == "blackhole" and mode == "pass"):
                lost += link.close("rst")
            elif mode == "blackhole":
                link.swallow = True
        await asyncio.wait_for(asyncio.gather(*lost), 10)  # the RSTs are out

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        lost: list[asyncio.Future[None]] = []
        for link in list(self._links):
            lost += link.close("abort")
        await asyncio.wait_for(asyncio.gather(*lost), 10)
        if self._server is not None:
            await self._server.wait_closed()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)
