"""Listening addresses, claimed before anything is served.

Start-up binds every address first (the MQTT listeners, HTTP, the cluster's listener,
then the event relay's) and only then does any of them accept a connection or say it is
listening, so that a port that cannot be had stops the broker before it serves at all,
with one line naming the key to change (`BindError`): `http.address 127.0.0.1:8888:
address already in use (set [http] address, or enabled = false)`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class BindError(Exception):
    """An address start-up cannot listen on; the message is one line naming the key."""

    def __init__(self, key: str, address: str, error: OSError, change: str) -> None:
        super().__init__(f"{key} {address}: {reason(error)} (set {change})")


def reason(error: OSError) -> str:
    """Why an address cannot be bound, without the "error while attempting to bind on
    address (...)" asyncio wraps around it: "address already in use", "permission
    denied", "name or service not known" (a host that does not resolve)."""
    text = error.strerror or str(error)
    return text.rpartition("): ")[2].lower()


async def claim(
    loop: asyncio.AbstractEventLoop,
    factory: Callable[[], asyncio.BaseProtocol],
    host: str,
    port: int,
    backlog: int = 100,
    **options: Any,
) -> asyncio.Server:
    """A server on `host`:`port`, listening but not accepting yet: connections wait in
    the backlog until `server.start_serving()`. OSError: the address cannot be had.

    asyncio itself, told not to serve yet, binds (with SO_REUSEADDR) but listens only
    once serving starts; two such sockets on one port do not clash on Linux, so two of
    our own listeners given the same address would only fail then. Listening at once
    makes the port ours now: a later bind on it fails at its own key."""
    server = await loop.create_server(
        factory, host, port, backlog=backlog, start_serving=False, **options
    )
    try:
        for sock in server.sockets:
            with sock.dup() as listening:  # (asyncio's own wrapper has no listen())
                listening.listen(backlog)
    except OSError:
        server.close()
        raise
    return server
