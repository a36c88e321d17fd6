"""A node leaving its cluster for good, with what it holds (metadata = "swc"):
`nautilus cluster leave` naming this node, run here or on any member that reaches it.

In order, as VerneMQ's `cluster leave -k`:

1. No new clients: the MQTT listeners close, and the connected clients are sent away
   (MQTT 5: 0x8B server shutting down) to reconnect to another node; their sessions go
   offline here (clean ones end, and their records are deleted).
2. Every linked member pulls this node's replicas once (LEFT's first half, alone), so
   that each holds the records of the sessions it is about to be handed.
3. Each session left here is handed to a live member chosen by the client id's hash
   (TAKE). That member registers it as a CONNECT would, without a client: this node
   releases it (TAKEOVER) and its queue follows in acknowledged chunks (Handover), so
   nothing queued is lost. It lives on there, offline, until its client comes back. A
   client that reconnects elsewhere first takes its session as usual; whichever
   registration is later wins, and the other member hands the session on.
4. Once no session is left here and every queue has moved, a member pulls this node's
   replicas a last time and removes it from the members (LEFT): the removal is that
   member's write, which anti-entropy spreads even if a broadcast is lost, and no write
   of this node's exists only here.
5. The node marks its replica store as left (it refuses to start on it again: its
   directories are to be wiped first) and stops.

A session whose member cannot be reached is offered to another in the next round; the
departure goes on until everything is handed over, saying how far it got every
PROGRESS_INTERVAL.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import deque
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster.frames import LEFT, TAKE

if TYPE_CHECKING:
    from broker.cluster.handover import Handover
    from broker.cluster.link import PeerLink
    from broker.cluster.ports import NodeExit
    from broker.cluster.swc.backend import SwcBackend
    from broker.cluster.sync import MetadataSync

log = logging.getLogger("nautilus.cluster")

IN_FLIGHT = 64  # sessions offered to members at once
ROUND = 1.0  # seconds between two rounds over what is left
PROGRESS_INTERVAL = 5.0  # seconds between two progress lines
REQUEST_TIMEOUT = 60.0  # seconds a member has to take one session, or to remove this node


class Leaver(Protocol):
    """What a departure uses of the Cluster (node.py)."""

    node: str
    links: dict[str, PeerLink]
    split: bool
    sync: MetadataSync
    handover: Handover

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task: ...


class Departure:
    def __init__(self, cluster: Leaver, backend: SwcBackend, this_node: NodeExit) -> None:
        self.cluster = cluster
        self.backend = backend
        self.this_node = this_node  # its clients sent away, its sessions, its process
        self.started = False
        self.handed = 0  # sessions gone to other members
        self.stage = ""  # what it is doing, for `nautilus cluster status`

    def start(self) -> str:
        """Begin (ValueError: it cannot, and why). What it says is for the operator."""
        if self.started:
            return f"{self.cluster.node} is leaving already ({self.stage})"
        if self.cluster.split:
            raise ValueError(
                f"{self.cluster.node} cannot leave while a member cannot be reached: "
                "remove that one first (`nautilus cluster leave NODE` on a live member)"
            )
        if not self._members():
            raise ValueError(
                f"{self.cluster.node} has no live member to hand its sessions to: stop it instead"
            )
        self.started = True
        self.stage = "sending clients away"
        self.cluster.spawn(self._run(), "cluster leave")
        return (
            f"{self.cluster.node} is leaving: it hands its sessions to the other members, "
            "then stops"
        )

    def _members(self) -> list[str]:
        """The live members a session can go to, in order."""
        members = self.backend.members()
        return sorted(
            node
            for node, link in self.cluster.links.items()
            if link.answering and node in members and node != self.cluster.node
        )

    async def _run(self) -> None:
        cluster = self.cluster
        this_node = self.this_node
        log.warning("cluster: %s leaves the cluster: sending its clients away", cluster.node)
        this_node.send_clients_away()
        await cluster.sync.flush()  # the ended sessions' records are deleted first
        self.stage = "handing sessions over"
        # Each member holds the records of the sessions it is about to be handed.
        await asyncio.gather(*(self._pull(node) for node in self._members()))
        await self._hand_over()
        self.stage = "removing this node"
        while not await self._removed():
            await asyncio.sleep(ROUND)
        self.backend.mark_left()
        log.warning(
            "cluster: %s left the cluster (%d sessions handed over); stopping. Wipe %s and "
            "the message store before starting it again",
            cluster.node,
            self.handed,
            self.backend.path,
        )
        this_node.shutdown_requested.set()

    async def _hand_over(self) -> None:
        """Offer every session here to a member, IN_FLIGHT at a time, in passes over what
        is left (a pass after ROUND), until none is left and every queue has moved."""
        registry = self.this_node.registry
        handover = self.cluster.handover
        todo = deque(registry)
        held = len(registry)
        offered: dict[str, asyncio.Task[None]] = {}
        loop = asyncio.get_running_loop()
        said = loop.time()
        while registry or handover.migrating:
            members = self._members()
            while todo and members and len(offered) < IN_FLIGHT:
                client_id = todo.popleft()
                session = registry.get(client_id)
                if session is None or handover.busy(client_id):
                    continue  # gone already, or moving: the next pass sees
                node = members[zlib.crc32(client_id.encode()) % len(members)]
                task = loop.create_task(self._take(node, client_id, session.expiry))
                offered[client_id] = task
            pending = {*offered.values(), *handover.migrating}
            if pending:
                await asyncio.wait(pending, timeout=ROUND, return_when=asyncio.FIRST_COMPLETED)
            else:  # no member to offer to, or only sessions moving already
                await asyncio.sleep(ROUND)
            for client_id, task in list(offered.items()):
                if task.done():
                    del offered[client_id]
            self.handed = held - len(registry)  # (taken, or handed to a session's new owner)
            if not todo and not offered and registry:  # a pass is over: another, later
                await asyncio.sleep(ROUND)
                todo.extend(registry)
            if loop.time() - said >= PROGRESS_INTERVAL:
                said = loop.time()
                log.info(
                    "cluster: leaving: %d sessions handed over, %d left, %d queues moving",
                    self.handed,
                    len(registry),
                    len(handover.migrating),
                )

    async def _take(self, node: str, client_id: str, expiry: int | None) -> None:
        error = await self._request(node, TAKE, client_id, expiry)
        if error:  # offered again in the next pass
            log.warning("cluster: leaving: %s did not take %s: %s", node, client_id, error)

    async def _pull(self, node: str) -> None:
        error = await self._request(node, LEFT, False)
        if error:  # what it lacks reaches it by anti-entropy meanwhile
            log.warning("cluster: leaving: %s did not pull this node's replicas: %s", node, error)

    async def _removed(self) -> bool:
        """LEFT to the first live member that does it: it pulls this node's replicas a
        last time, then removes it."""
        for node in self._members():
            error = await self._request(node, LEFT, True)
            if not error:
                return True
            log.warning("cluster: leaving: %s did not remove this node: %s", node, error)
        return False

    async def _request(self, node: str, *frame: Any) -> str | None:
        """A request's error (None: done)."""
        link = self.cluster.links.get(node)
        if link is None or not link.up:
            return "its link is down"
        try:
            return await asyncio.wait_for(link.request(*frame), REQUEST_TIMEOUT)
        except (ConnectionError, TimeoutError) as exc:
            return str(exc) or "no answer"
