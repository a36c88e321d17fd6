"""An operator's admin command on every node (broker/admin.py's `HERE`): this node asks
the others over its links (ADMIN), each runs it and answers (ANSWER) with its result or
why there is none. A node that does not answer within ADMIN_TIMEOUT is an error in the
answer, never an operator's command that hangs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from broker.cluster.frames import ADMIN
from broker.peers import Answer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from broker.cluster.link import PeerLink
    from broker.cluster.liveness import Liveness
    from broker.cluster.ports import AdminRequests

log = logging.getLogger("nautilus.cluster")

# Seconds a node has to answer an admin request: one hung node is an error in the answer,
# not an operator's command that hangs (VerneMQ's RPC timeouts, vernemq issue 2167).
ADMIN_TIMEOUT = 3.0


class RemoteOperations:
    def __init__(
        self,
        node: str,
        links: dict[str, PeerLink],
        liveness: Liveness,
        admin: AdminRequests,
    ) -> None:
        self.node = node
        self.links = links  # by node name
        self.liveness = liveness  # who is asked, who is said dead
        self.admin = admin  # runs the others' requests here

    async def ask_others(
        self, command: str, arguments: dict[str, Any], nodes: Iterable[str] | None = None
    ) -> list[Answer]:
        """An admin command on the other nodes alive (of `nodes`), at once; a dead one is
        said, not asked (what it would change, it does not)."""
        wanted = set(nodes) if nodes is not None else None
        liveness = self.liveness
        others = [n for n in liveness.alive() if n != self.node and (wanted is None or n in wanted)]
        # (Those `cluster status` lists: a node forgotten after its reaping is not.)
        dead = [
            n
            for n in sorted(liveness.nodes)
            if n in liveness.dead and (wanted is None or n in wanted)
        ]
        answers = await asyncio.gather(*(self._ask(node, command, arguments) for node in others))
        return [*answers, *(Answer(node, "declared dead: not asked", None) for node in dead)]

    async def _ask(self, node: str, command: str, arguments: dict[str, Any]) -> Answer:
        link = self.links.get(node)
        if link is None or not link.up:
            return Answer(node, f"no link to {node}", None)
        try:
            error, result = await asyncio.wait_for(
                link.request(ADMIN, command, arguments), ADMIN_TIMEOUT
            )
        except TimeoutError:
            return Answer(node, f"no answer within {ADMIN_TIMEOUT:g} s", None)
        except ConnectionError as exc:
            return Answer(node, str(exc), None)
        return Answer(node, error, result)

    def answer(self, node: str, command: str, arguments: dict[str, Any]) -> list[Any]:
        """[error or None, result] of an ADMIN request from `node`. Any failure is an
        answer: the asking operator is told, never left to time out."""
        try:
            return [None, self.admin.admin_request(command, arguments)]
        except (ValueError, LookupError) as exc:
            return [str(exc), None]
        except Exception as exc:
            log.exception("cluster: admin request %r from %s failed", command, node)
            return [f"{type(exc).__name__}: {exc}", None]
