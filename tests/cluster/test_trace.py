"""A trace read on one node of a two-node cluster follows its client on the other (cluster
frames 32-36): the other node's lines come back to the reader's stream, the client
moving between the nodes with its queue shows on both, and stop-all on either node ends
the trace everywhere. Both nodes run in this process (tests/conftest.py's start_broker), with the
Redis metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.http.api_keys import ApiKeys
from tests.broker.helpers import paho_client, unique_id
from tests.cluster.nodes import DEAD_AFTER, cluster_of, start_in_process_node
from tests.http.conftest import api, table
from tests.http.trace_reader import TraceReader

__all__ = ["paho_client"]  # a fixture, used by name


def start_node(start_broker: Any, name: str, redis_url: str, keys: Path) -> Any:
    http = {"address": "127.0.0.1:0", "api_keys_file": str(keys)}
    return start_in_process_node(start_broker, redis_url, DEAD_AFTER, name, {"http": http})


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

    client = paho_client(b, client_id=client_id, clean=False)
    assert trace.expect("recv", "CONNECT(")["node"] == "b"
    assert trace.expect("send", "CONNACK(")["node"] == "b"
    client.subscribe("roam/#", 1)
    assert trace.expect("send", "SUBACK(")["node"] == "b"
    client.disconnect()
    trace.expect("session", "connection closed")

    def known_on_a() -> bool:  # the subscription reached a (the metadata's change stream)
        record = cluster_of(a).view.records.get(client_id)
        return record is not None and "roam/#" in record.subscriptions

    a.wait_for(known_on_a)
    publisher = paho_client(a)
    for n in range(3):  # queued on b for the client offline there
        publisher.publish("roam/x", b"%d" % n, qos=1)

    paho_client(a, client_id=client_id, clean=False)  # it comes back on node a
    wanted = {
        ("a", "recv", "CONNECT"),
        ("a", "session", "session taken over from node b"),
        ("b", "session", "session handed to node a; its queue follows"),
        ("b", "session", "queue moved to node a: 3 messages"),
        ("a", "session", "queue migration: 3 messages arrived"),
        ("a", "send", "CONNACK"),
        ("a", "send", "PUBLISH"),
    }
    seen: set[tuple[str, str, str]] = set()
    while not wanted <= seen:  # (the nodes' lines interleave as they come)
        line = trace.next()
        seen.add((line["node"], line["kind"], line["text"].partition("(")[0]))

    assert table(api(b, "trace/stop-all", key, method="POST")) == [{"stopped": 1}]
    assert "stop-all" in trace.expect_end()["text"]
    for node in (a, b):
        node.wait_for(lambda node=node: not node.broker.tracer.watched)
    trace.close()
