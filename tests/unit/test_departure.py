"""A node leaving its cluster (broker/cluster/departure.py), its order and its passes,
over a fake cluster whose members answer requests as told (the real thing, with node
processes, is in tests/cluster/test_swc_cluster.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from broker.cluster import departure
from broker.cluster.departure import Departure
from broker.cluster.frames import LEFT, TAKE


class FakeLink:
    """A member's link: each request is answered by `answer(frame)` (an error or None)."""

    def __init__(self, name: str, cluster: FakeCluster) -> None:
        self.name = name
        self.cluster = cluster
        self.up = self.answering = True

    def request(self, *frame: Any) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self.cluster.requests.append((self.name, *frame))
        future.set_result(self.cluster.answer(self.name, frame))
        return future


class FakeCluster:
    def __init__(self, sessions: list[str], members: list[str]) -> None:
        self.node = "c"
        self.split = False
        self.events: list[str] = []
        self.requests: list[tuple[Any, ...]] = []
        self.refuse_once: set[str] = set()  # client ids whose first TAKE fails
        registry = {cid: SimpleNamespace(expiry=60) for cid in sessions}
        self.host = SimpleNamespace(
            registry=registry,
            send_clients_away=lambda: self.events.append("clients away"),
            shutdown_requested=asyncio.Event(),
        )
        self.links = {name: FakeLink(name, self) for name in members}
        self.handover = SimpleNamespace(migrating=[], busy=lambda client_id: False)
        self.sync = SimpleNamespace(flush=self._flush)
        self.backend = SimpleNamespace(
            members=lambda: {name: "" for name in [*members, "c"]},
            mark_left=lambda: self.events.append("marked left"),
            path="/data/swc",
        )

    async def _flush(self) -> None:
        self.events.append("flushed")

    def spawn(self, coroutine: Any, name: str) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(coroutine)

    def answer(self, member: str, frame: tuple[Any, ...]) -> str | None:
        kind = frame[0]
        if kind == TAKE:
            client_id = frame[1]
            if client_id in self.refuse_once:
                self.refuse_once.discard(client_id)
                return f"{client_id} is being registered on {member}"
            del self.host.registry[client_id]  # released here, as the TAKEOVER does
            return None
        assert kind == LEFT
        self.events.append(f"{member} {'removes' if frame[1] else 'pulls'}")
        return None


@pytest.fixture(autouse=True)
def quick_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(departure, "ROUND", 0.01)


def leave(cluster: FakeCluster) -> Departure:
    async def scenario() -> Departure:
        leaving = Departure(cluster, cluster.backend, cluster.host)  # type: ignore[arg-type]
        said = leaving.start()
        assert "c is leaving" in said
        await asyncio.wait_for(cluster.host.shutdown_requested.wait(), 5.0)
        return leaving

    return asyncio.run(scenario())


def test_every_session_goes_to_a_member_by_its_hash_and_the_node_is_removed_last() -> None:
    sessions = [f"s{i}" for i in range(200)]  # more than IN_FLIGHT at once
    cluster = FakeCluster(sessions, ["a", "b"])
    leaving = leave(cluster)
    assert not cluster.host.registry
    assert leaving.handed == 200
    takes = [r for r in cluster.requests if r[1] == TAKE]
    assert sorted(r[2] for r in takes) == sorted(sessions)
    assert {r[0] for r in takes} == {"a", "b"}  # spread over both
    assert all(r[3] == 60 for r in takes)  # each with its expiry
    assert cluster.events == [
        "clients away",
        "flushed",
        "a pulls",  # each member holds the records before it is handed sessions
        "b pulls",
        "a removes",  # after the last session
        "marked left",
    ]


def test_a_session_a_member_could_not_take_is_offered_again_in_the_next_pass() -> None:
    cluster = FakeCluster(["x", "y"], ["a"])
    cluster.refuse_once = {"x"}
    leaving = leave(cluster)
    assert [r[2] for r in cluster.requests if r[1] == TAKE] == ["x", "y", "x"]
    assert leaving.handed == 2


def test_it_is_refused_in_a_netsplit_and_with_nobody_to_hand_sessions_to() -> None:
    split = FakeCluster(["x"], ["a"])
    split.split = True
    with pytest.raises(ValueError, match="cannot leave while a member cannot be reached"):
        Departure(split, split.backend, split.host).start()  # type: ignore[arg-type]
    alone = FakeCluster(["x"], [])
    with pytest.raises(ValueError, match="no live member to hand its sessions to"):
        Departure(alone, alone.backend, alone.host).start()  # type: ignore[arg-type]
    assert split.events == alone.events == []  # nothing was done
