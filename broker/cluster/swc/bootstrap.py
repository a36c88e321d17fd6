"""Who starts the cluster and whom each node joins (`[cluster] seeds`), decided from what
the seeds answered, the same way on every node: sans I/O (seeds.py asks and acts).

Every node may be given one seed list naming all of them. Each round, a node asks every
seed that answers where it stands (SWC_STANDING): whether it holds the cluster's whole
metadata (it started the cluster, or copied it) and whether it is fresh (nothing but its
own member record: no other member, no subscriber, no retained message). Then:

- A node that holds history (a member: a subscriber or retained message, or other
  members in a state it holds) never throws it away. It joins a seed of its own cluster
  (one of its members) that holds the metadata; a seed that holds another cluster's
  history is refused (`prevent_nonempty_join`); fresh seeds join it.
- A fresh node joins the lowest-named seed that holds a cluster's history. If none does
  but fresh nodes have started a cluster (alone, nothing in it yet), the one with the
  lowest name stays and the others join it (they lose nothing). If none has, the fresh
  nodes that reach each other (this one included) agree: the one with the lowest name
  starts the cluster, the others join it once it has. While some seeds are silent, the
  lowest waits START_GRACE for them first: nodes started together get the time to
  listen, and the lowest of all starts it.
- A node that knows members but holds nothing of theirs yet (introduced, not copied)
  joins the lowest-named seed that holds the metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

START_GRACE = 5.0  # seconds the lowest fresh node gives silent seeds before it starts


class Standing(Enum):
    """Where this node stands (SwcBackend.standing)."""

    FRESH = "fresh"  # nothing but its own member record: it may start or join a cluster
    JOINING = "joining"  # it knows members, holds nothing of theirs: it joins one
    MEMBER = "member"  # it holds a cluster's history: it keeps it


@dataclass(frozen=True)
class SeedAnswer:
    """What one seed said of itself."""

    seed: str  # its address, as the log names it
    node: str
    holds: bool  # it holds the cluster's whole metadata: a node can copy it
    fresh: bool  # nothing but its own member record


class Action(Enum):
    START = "start"  # start the cluster: what this node holds is the whole state
    JOIN = "join"  # introduce this node to `seed`'s node: it joins that one's cluster
    WAIT = "wait"  # nothing to do this round (`waiting` says for what)
    REFUSE = "refuse"  # `seed`'s node holds another cluster's history: never join it


@dataclass(frozen=True)
class Decision:
    action: Action
    answer: SeedAnswer | None = None  # JOIN, REFUSE: the seed
    waiting: str = ""  # WAIT: what this node waits for, as /health and the log say it


def decide(
    node: str,
    standing: Standing,
    holds: bool,
    members: set[str],
    answers: list[SeedAnswer],
    silent: list[str],
    patient: bool = True,
) -> Decision:
    """What this node (`node`, whether it `holds` the metadata, its `members` known)
    does this round, given the seeds that answered (this node excluded) and those that
    did not (`silent`); `patient`: the silent ones had START_GRACE to answer."""
    holders = sorted((a for a in answers if a.holds), key=lambda a: a.node)
    established = [a for a in holders if not a.fresh]  # a cluster with history
    if standing is Standing.MEMBER:
        ours = [a for a in holders if a.node in members]
        if ours:
            return Decision(Action.JOIN, ours[0])
        if established:
            return Decision(Action.REFUSE, established[0])
        return Decision(Action.WAIT, waiting=_waiting_for_seeds(answers, silent))
    if established:
        return Decision(Action.JOIN, established[0])
    if standing is Standing.JOINING:
        if holders:
            return Decision(Action.JOIN, holders[0])
        return Decision(Action.WAIT, waiting=_waiting_for_seeds(answers, silent))
    if holders or holds:  # fresh nodes that started a cluster, alone: the lowest stays
        if holders and (not holds or holders[0].node < node):
            return Decision(Action.JOIN, holders[0])
        return Decision(Action.WAIT, waiting="waiting for the other nodes to join")
    fresh = sorted((a for a in answers if a.fresh), key=lambda a: a.node)
    if not fresh:
        if answers or silent:  # (a node that answered is joining: it waits for a holder too)
            return Decision(Action.WAIT, waiting=_waiting_for_seeds(answers, silent))
        return Decision(Action.START)  # no other seed (the list names this node alone)
    names = ", ".join(sorted([node, *(a.node for a in fresh)]))
    if fresh[0].node < node:
        return Decision(
            Action.WAIT,
            waiting=f"waiting for {fresh[0].node} to start the cluster (the lowest name of "
            f"the fresh nodes {names})",
        )
    if silent and not patient:  # nodes started together: give the others time to listen
        return Decision(
            Action.WAIT,
            waiting=f"waiting for seeds {', '.join(silent)} to answer before starting the "
            f"cluster (the lowest name of the fresh nodes {names})",
        )
    return Decision(Action.START)


def _waiting_for_seeds(answers: list[SeedAnswer], silent: list[str]) -> str:
    if not answers:
        return f"waiting for seeds {', '.join(silent) or '(none listed)'} (none answered yet)"
    answered = ", ".join(sorted(a.node for a in answers))
    unanswered = f"; {', '.join(silent)} did not answer" if silent else ""
    return f"waiting for a seed that holds the cluster's metadata ({answered} answered{unanswered})"
