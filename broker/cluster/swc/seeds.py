"""Joining a cluster through its seeds (`[cluster] seeds`, metadata = "swc").

Every node may be given the same seed list, naming all of them: each round (every RETRY
seconds until this node is linked to a member) the seeds are resolved again (a DNS name
may give several addresses: a Kubernetes headless service), this node itself is skipped
(its own address, or a seed that answers with this node's name), and every other seed is
asked where it stands (SWC_STANDING). bootstrap.py decides, the same way on every node,
whether this node starts the cluster, joins a seed's, or waits.

To join, this node connects to the seed as a peer would (the handshake of link.py, its
CHALLENGE naming it; over TLS, its certificate must too), hands it this node's member
record (one SWC_WRITE) and closes. The seed then knows where
this node listens and links to it; its links to this node carry its own record back
(Cluster.link_up); from there the exchanges bring every key, the other members' records
included, and the heartbeat links to each member.

A node that holds metadata of a cluster the seed is not part of is refused, in one line,
as VerneMQ's `prevent_nonempty_join` does: its keys would mix into another cluster's.
Wipe its `[cluster.swc] directory` to let it join.

Until the node holds the metadata, what it waits for is `not_ready()` (/health, and a
WARNING line every REPORT_INTERVAL).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster import frames
from broker.cluster.channel_tls import certificate_problem
from broker.cluster.frames import (
    ANSWER,
    CHALLENGE,
    PONG,
    REFUSED,
    SWC_STANDING,
    SWC_WRITE,
    WELCOME,
    Connecting,
    FrameDecoder,
)
from broker.cluster.swc.bootstrap import (
    START_GRACE,
    Action,
    SeedAnswer,
    Standing,
    decide,
)
from broker.config import host_port

if TYPE_CHECKING:
    from broker.cluster.channel_tls import ChannelTls
    from broker.cluster.link import PeerLink
    from broker.cluster.swc.backend import SwcBackend
    from broker.config import ClusterSettings

log = logging.getLogger("nautilus.cluster")

RETRY = 1.0  # seconds between two rounds over the seeds
ANSWER_MAX_SIZE = 64 * 1024  # a WELCOME or a standing is a few dozen bytes
TIMEOUT = 5.0  # seconds a seed has to answer
REPORT_INTERVAL = 10.0  # seconds between two lines saying what a node not ready waits for

Address = tuple[str, int]


class Joiner(Protocol):
    """What joining uses of the Cluster (node.py)."""

    node: str
    boot_id: str
    settings: ClusterSettings
    links: dict[str, PeerLink]
    loop: asyncio.AbstractEventLoop
    tls: ChannelTls | None


class Seeds:
    def __init__(
        self,
        cluster: Joiner,
        backend: SwcBackend,
        seeds: list[str],
        own: Address | None,
    ) -> None:
        self.cluster = cluster
        self.backend = backend
        self.seeds = seeds
        # This node's addresses, not seeds: its listener's, the one it advertises, and
        # those that answered with its name (a DNS name, or a wildcard listener reached
        # on one of its addresses).
        self.own: set[Address] = {own} if own is not None else set()
        if cluster.settings.advertise:
            self.own.add(host_port(cluster.settings.advertise))
        self.refused = False
        self.waiting = "asking the seeds where they stand"  # (until the first round ends)
        self.joined_through = ""  # the node this one introduced itself to, to join it
        self._started = cluster.loop.time()

    def joined(self) -> bool:
        """A link to a member is up: the exchanges do the rest."""
        members = self.backend.members()
        return any(link.up for node, link in self.cluster.links.items() if node in members)

    async def join(self) -> None:
        """Rounds over the seeds until this node is linked to a member (or refused)."""
        while not self.joined() and not self.refused:
            await self.round()
            await asyncio.sleep(RETRY)
        if self.joined_through and not self.backend.holds():
            self.backend.replicas.copy_now(self.joined_through)

    async def join_through(self, address: str) -> None:
        """`nautilus cluster join ADDRESS`: join the cluster of the node listening there
        (tried every RETRY until this node is linked to a member, or refused)."""
        while not self.joined() and not self.refused:
            try:
                await asyncio.wait_for(self._introduce(host_port(address), address), TIMEOUT)
            except (OSError, TimeoutError, ConnectionError, ValueError) as exc:
                log.debug("cluster: seed %s: %s", address, exc)
            await asyncio.sleep(RETRY)

    async def round(self) -> None:
        """Ask every seed where it stands, decide (bootstrap.py) and act."""
        addresses, silent = await self._resolve()
        asked = await asyncio.gather(*(self._ask(address, seed) for address, seed in addresses))
        answers = [answer for answer in asked if answer is not None]
        silent += [
            seed
            for (address, seed), answer in zip(addresses, asked, strict=True)
            if answer is None and address not in self.own  # (not this node, found out now)
        ]
        standing = self.backend.standing()
        members = set(self.backend.members())
        patient = self.cluster.loop.time() - self._started >= START_GRACE
        holds = self.backend.holds()
        decision = decide(self.cluster.node, standing, holds, members, answers, silent, patient)
        if decision.action is Action.START:
            self._start(answers)
        elif decision.action is Action.JOIN and decision.answer is not None:
            await self._join(decision.answer, standing)
        elif decision.action is Action.REFUSE and decision.answer is not None:
            self._refuse(decision.answer)
        else:
            self.waiting = decision.waiting

    def _start(self, answers: list[SeedAnswer]) -> None:
        if self.backend.holds():
            return  # started already (a round before)
        others = ", ".join(sorted(answer.node for answer in answers))
        log.info(
            "cluster: starting the cluster: %s",
            f"no seed holds a cluster's metadata and this node's name is the lowest of the "
            f"fresh nodes (others: {others})"
            if others
            else "no other node among the seeds",
        )
        self.backend.replicas.found()

    async def _join(self, seed: SeedAnswer, standing: Standing) -> None:
        if standing is Standing.FRESH and self.backend.holds():
            # It started a cluster of its own, alone, and meets one to join: nothing lost.
            log.info("cluster: joining %s's cluster instead of starting one", seed.node)
            self.backend.replicas.unfound()
        self.waiting = f"joining the cluster through {seed.node} ({seed.seed})"
        try:
            await asyncio.wait_for(self._introduce(host_port(seed.seed), seed.seed), TIMEOUT)
        except (OSError, TimeoutError, ConnectionError, ValueError) as exc:
            log.debug("cluster: seed %s: %s", seed.seed, exc)
            return
        self.joined_through = seed.node

    def _refuse(self, seed: SeedAnswer) -> None:
        self.refused = True
        self.waiting = f"refused to join {seed.node}: this node holds another cluster's metadata"
        log.error(
            "cluster: not joining through seed %s (node %s): this node holds metadata of "
            "another cluster (%d keys); to join, stop it and wipe %s",
            seed.seed,
            seed.node,
            len(self.backend.replicas.items()),
            self.cluster.settings.swc.directory,
        )

    # -- the seeds -------------------------------------------------------------------------

    async def _resolve(self) -> tuple[list[tuple[Address, str]], list[str]]:
        """Each seed's addresses (resolved now: they may have changed), without this
        node's own, each with the seed as the log names it; and the seeds that do not
        resolve."""
        loop = self.cluster.loop
        found: dict[Address, str] = {}
        unresolved = []
        for seed in self.seeds:
            host, port = host_port(seed)
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:  # (socket.gaierror)
                log.debug("cluster: seed %s does not resolve: %s", seed, exc)
                unresolved.append(seed)
                continue
            for info in infos:
                address: Address = (str(info[4][0]), int(info[4][1]))
                if address not in self.own and address not in found:
                    found[address] = seed if _is_ip(host) else f"{seed} ({_format(address)})"
        return list(found.items()), unresolved

    async def _ask(self, address: Address, seed: str) -> SeedAnswer | None:
        """Where the seed at `address` stands; None if it did not answer, or is this
        node."""
        try:
            return await asyncio.wait_for(self._standing(address, seed), TIMEOUT)
        except (OSError, TimeoutError, ConnectionError, ValueError) as exc:
            log.debug("cluster: seed %s: %s", seed, exc)
            return None

    async def _standing(self, address: Address, seed: str) -> SeedAnswer | None:
        connection = await _Connection.open(address, seed, self._tls())
        try:
            name, boot_id = await self._hello(connection)
            if name == self.cluster.node and boot_id == self.cluster.boot_id:
                self.own.add(address)  # this node, by another address
                return None
            connection.writer.write(frames.encode(SWC_STANDING, 1))
            holds, fresh = (await connection.next(ANSWER))[2]
            return SeedAnswer(_format(address), name, bool(holds), bool(fresh))
        finally:
            connection.writer.close()

    async def _introduce(self, address: Address, seed: str) -> None:
        """Hand the node at `address` this node's member record: it links to this one."""
        connection = await _Connection.open(address, seed, self._tls())
        writer = connection.writer
        try:
            name, _ = await self._hello(connection)
            if self._has_other_history(name):
                self._refuse(SeedAnswer(seed, name, True, False))
                return
            writer.write(frames.encode(SWC_WRITE, *self.backend.replicas.introduction()))
            await writer.drain()
            log.info("cluster: joining through seed %s (node %s)", seed, name)
        finally:
            writer.close()

    def _tls(self) -> ssl.SSLContext | None:
        return self.cluster.tls.client if self.cluster.tls is not None else None

    async def _hello(self, connection: _Connection) -> tuple[str, str]:
        """The handshake of a peer (HELLO, PROOF for its CHALLENGE, its WELCOME checked;
        over TLS, its certificate naming it): the seed's node name and boot id."""
        c = self.cluster
        handshake = Connecting(c.settings.secret, c.node, c.boot_id)
        writer = connection.writer
        writer.write(handshake.hello())
        writer.write(handshake.proof(await connection.next(CHALLENGE)))
        boot_id = handshake.welcomed(await connection.next(WELCOME))
        name = handshake.peer
        if c.tls is not None and (problem := certificate_problem(writer.transport, name)):
            raise ConnectionError(problem)
        return name, boot_id

    def _has_other_history(self, seed_node: str) -> bool:
        """Whether this node holds metadata of a cluster `seed_node` is not a member of."""
        if seed_node in self.backend.members():
            return False  # the same cluster: a restart, a rejoin
        return self.backend.standing() is Standing.MEMBER

    # -- what it waits for -----------------------------------------------------------------

    def not_ready(self) -> str | None:
        """What this node waits for before it holds the cluster's metadata (None: it
        holds it)."""
        if self.backend.holds():
            return None
        if not self.joined():
            return self.waiting
        copied, total, sources = self.backend.replicas.copy_progress()
        source = ", ".join(sources) or self.joined_through or "a member"
        return f"copying the metadata from {source} ({copied} of {total} groups copied)"

    async def report(self) -> None:
        """A WARNING line every REPORT_INTERVAL while the node is not ready."""
        while True:
            await asyncio.sleep(REPORT_INTERVAL)
            why = self.not_ready()
            if why is None:
                return
            log.warning("cluster: not ready: %s", why)


class _Connection:
    """A connection to a seed, read frame by frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seed: str):
        self.reader = reader
        self.writer = writer
        self.seed = seed
        self._decoder = FrameDecoder(ANSWER_MAX_SIZE)
        self._read: deque[list[Any]] = deque()

    @classmethod
    async def open(cls, address: Address, seed: str, tls: ssl.SSLContext | None) -> _Connection:
        return cls(*await asyncio.open_connection(*address, ssl=tls), seed)

    async def next(self, kind: int) -> list[Any]:
        """The next frame of `kind` from the seed (its PONGs skipped)."""
        while True:
            while self._read:
                frame = self._read.popleft()
                if frame[0] == kind:
                    return frame
                if frame[0] == REFUSED:
                    raise ConnectionError(f"{self.seed} refused: {frame[1]}")
                if frame[0] != PONG:
                    raise ValueError(f"{self.seed} answered {frame[:1]}, not {kind}")
            data = await self.reader.read(4096)
            if not data:
                raise ConnectionError(f"{self.seed} closed the connection")
            self._read.extend(self._decoder.feed(data))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _format(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
