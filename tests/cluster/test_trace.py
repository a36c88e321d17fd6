"""A trace read on one node of a two-node cluster follows its client on the other (cluster
frames 32-36): the other node's lines come back to the reader's stream, the client
moving between the nodes shows on both, and stop-all on either node ends the trace
everywhere. Both nodes run in this process (tests/conftest.py's start_broker), with the
Redis metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.http.api_keys import ApiKeys
from tests.broker.helpers import paho_client, unique_id
from tests.cluster.nodes import DEAD_AFTER, LIVENESS_INTERVAL, cluster_of
from tests.http.conftest import api, table
from tests.http.trace_reader import TraceReader

__all__ = ["paho_client"]  # a fixture, used by name


def start_node(start_broker: Any, name: str, redis_url: str, keys: Path) -> Any:
    return start_broker(
        broker={"node_name": name},
        http={"address": "127.0.0.1:0", "api_keys_file": str(keys)},
        cluster={
            "address": "127.0.0.1:0",
            "metadata": "redis",
            "liveness_interval": LIVENESS_INTERVAL,
            "dead_after": DEAD_AFTER,
        },
        plugins={"redis_subs": {"enabled": True, "url": redis_url}},
    )


def linked(node: Any, other: str) -> None:
    def up() -> bool:
        link = cluster_of(node).links.get(other)
        return link is not None and link.up

    node.wait_for(up)


def test_a_trace_follows_its_client_on_the_other_node(
    start_broker: Any, redis_url: str, tmp_path: Path, paho_client: Any
) -> None:
    keys = tmp_path / "api-keys"
    key = ApiKeys(str(keys)).add()
    a, b = (start_node(start_broker, name, redis_url, keys) for name in ("a", "b"))
    linked(a, "b")
    linked(b, "a")
    client_id = unique_id("roaming")
    trace = TraceReader(a.broker.http.address, key, client_id=client_id, rate_max=100)
    nodes = {trace.expect("trace", "not connected here")["node"] for _ in range(2)}
    assert nodes == {"a", "b"}  # b heard of the trace before its client connects there

    client = paho_client(b, client_id=client_id)
    assert trace.expect("recv", "CONNECT(")["node"] == "b"
    assert trace.expect("send", "CONNACK(")["node"] == "b"
    client.subscribe("roam/#", 1)
    assert trace.expect("send", "SUBACK(")["node"] == "b"

    paho_client(a, client_id=client_id)  # it moves to node a
    while (line := trace.next())["kind"] != "send":  # up to a's CONNACK
        assert line["kind"] in ("recv", "session"), line
    assert (line["node"], line["text"][:8]) == ("a", "CONNACK(")
    # (b may learn that a owns the client from the metadata before a asks it to let go)
    said = {(line["node"], line["text"]) for line in trace.seen}
    assert {
        ("a", "session taken over from node b"),
        ("b", "session taken over by another connection"),
        ("b", "session handed to node a"),
    } <= said

    assert table(api(b, "trace/stop-all", key, method="POST")) == [{"stopped": 1}]
    assert "stop-all" in trace.expect_end()["text"]
    for node in (a, b):
        node.wait_for(lambda node=node: not node.broker.tracer.watched)
    trace.close()
