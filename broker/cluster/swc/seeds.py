"""Joining a cluster through its seeds (`[cluster] seeds`, metadata = "swc").

A seed is only an address: this node connects to it as a peer would (the handshake of
link.py, its CHALLENGE naming it; over TLS, its certificate must too), hands it this
node's member record (one SWC_WRITE) and closes. The seed then
knows where this node listens and links to it; its links to this node carry its own
record back (Cluster.link_up); from there the exchanges bring every key, the other
members' records included, and the heartbeat links to each member.

A node that already holds metadata of a cluster the seed is not part of is refused, in
one line, as VerneMQ's `prevent_nonempty_join` does: its keys would mix into another
cluster's. Wipe its `[cluster.swc] directory` to let it join.

Tried every RECONNECT_DELAY until this node has a link to a member.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster import frames
from broker.cluster.channel_tls import certificate_problem
from broker.cluster.frames import REFUSED, SWC_WRITE, Connecting, FrameDecoder
from broker.config import host_port

if TYPE_CHECKING:
    from broker.cluster.channel_tls import ChannelTls
    from broker.cluster.link import PeerLink
    from broker.cluster.swc.backend import SwcBackend
    from broker.config import ClusterSettings

log = logging.getLogger("nautilus.cluster")

RETRY = 1.0  # seconds between two rounds over the seeds
WELCOME_MAX_SIZE = 64 * 1024  # a WELCOME is a few dozen bytes
TIMEOUT = 5.0  # seconds a seed has to answer


class Joiner(Protocol):
    """What joining uses of the Cluster (node.py)."""

    node: str
    boot_id: str
    settings: ClusterSettings
    links: dict[str, PeerLink]
    tls: ChannelTls | None


class Seeds:
    def __init__(
        self,
        cluster: Joiner,
        backend: SwcBackend,
        seeds: list[str],
        own: tuple[str, int] | None,
    ) -> None:
        self.cluster = cluster
        self.backend = backend
        own_address = "{}:{}".format(*own) if own is not None else ""
        self.seeds = [seed for seed in seeds if seed != own_address]
        self.refused = False

    def joined(self) -> bool:
        """A link to a member is up: the exchanges do the rest."""
        members = self.backend.members()
        return any(link.up for node, link in self.cluster.links.items() if node in members)

    async def join(self) -> None:
        while not self.joined() and not self.refused:
            for seed in self.seeds:
                try:
                    await asyncio.wait_for(self._contact(seed), TIMEOUT)
                except (OSError, TimeoutError, ConnectionError, ValueError) as exc:
                    log.debug("cluster: seed %s: %s", seed, exc)
                if self.refused:
                    return
            await asyncio.sleep(RETRY)

    async def _contact(self, seed: str) -> None:
        c = self.cluster
        tls = c.tls.client if c.tls is not None else None
        reader, writer = await asyncio.open_connection(*host_port(seed), ssl=tls)
        try:
            name = await _handshake(
                reader, writer, Connecting(c.settings.secret, c.node, c.boot_id)
            )
            if tls is not None and (problem := certificate_problem(writer.transport, name)):
                raise ConnectionError(problem)
            if self._has_other_history(name):
                self.refused = True
                log.error(
                    "cluster: not joining through seed %s (node %s): this node holds "
                    "metadata of another cluster (%d keys); to join, stop it and wipe %s",
                    seed,
                    name,
                    len(self.backend.replicas.items()),
                    c.settings.swc.directory,
                )
                return
            writer.write(frames.encode(SWC_WRITE, *self.backend.replicas.introduction()))
            await writer.drain()
            log.info("cluster: joining through seed %s (node %s)", seed, name)
        finally:
            writer.close()

    def _has_other_history(self, seed_node: str) -> bool:
        """Whether this node holds metadata of a cluster `seed_node` is not a member of
        (its own member record alone is no history)."""
        if seed_node in self.backend.members():
            return False  # the same cluster: a restart, a rejoin
        own = ("node", self.cluster.node)
        return any(key != own for key, _ in self.backend.replicas.items())


async def _handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handshake: Connecting
) -> str:
    """The seed's name, once the handshake is done (HELLO, PROOF for its CHALLENGE, its
    WELCOME checked)."""
    decoder = FrameDecoder(WELCOME_MAX_SIZE)
    writer.write(handshake.hello())
    writer.write(handshake.proof(await _answer(reader, decoder, frames.CHALLENGE)))
    handshake.welcomed(await _answer(reader, decoder, frames.WELCOME))
    return handshake.peer


async def _answer(reader: asyncio.StreamReader, decoder: FrameDecoder, kind: int) -> list[Any]:
    """The seed's next frame, of `kind` (the handshake's answers come one at a time)."""
    while True:
        data = await reader.read(4096)
        if not data:
            raise ConnectionError("it closed the connection")
        for frame in decoder.feed(data):
            if frame[0] == REFUSED:
                raise ConnectionError(f"refused: {frame[1]}")
            if frame[0] != kind:
                raise ValueError(f"answered {frame[:1]}, not {kind}")
            return frame
