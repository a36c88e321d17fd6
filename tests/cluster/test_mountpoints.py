"""Mountpoints across a cluster (broker/mountpoints.py), with each metadata backend:
two `python -m broker` nodes, each with a listener on the default tree and one on
tenant-a's. A subscription on one node routes tenant-a's publishes from the other and
nothing of the default tree's; retained messages and a client id's registration are kept
per tree too, so the same client id on both trees is two sessions, cluster-wide.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.helpers import V5, PahoClient, unique_id
from tests.cluster.test_cluster import (
    HOST,
    Node,
    Trio,
    retained_seen,
    subscribe_with_probe,
    wait_routed,
)

TENANT_LINE = re.compile(r"listening for MQTT on 127\.0\.0\.1:(\d+) \(tcp, mountpoint tenant-a\)")
TENANT_LISTENER = (
    '\n[[listeners]]\ntype = "tcp"\naddress = "127.0.0.1:0"\nmountpoint = "tenant-a"\n'
)


class TenantNode(Node):
    """A Node with a second listener, on tenant-a's tree."""

    tenant_port = 0

    def write_config(self) -> Path:
        path = super().write_config()
        text = path.read_text(encoding="utf-8")
        path.write_text(text.replace("\n[store]", TENANT_LISTENER + "\n[store]", 1), "utf-8")
        return path

    def start(self) -> Node:
        super().start()
        self.tenant_port = int(self.wait_for_log(TENANT_LINE)[1])
        return self


class Pair(Trio):
    """Nodes a and b, TenantNodes."""

    node = TenantNode

    def tenant(self, node: str, client_id: str | None = None, **connect) -> PahoClient:
        client = PahoClient(HOST, self.nodes[node].tenant_port, V5, client_id)  # type: ignore[attr-defined]
        self.clients.append(client)
        client.connect(**connect)
        return client


@pytest.fixture(params=["redis", "swc"])
def pair(request, tmp_path: Path) -> Iterator[Pair]:
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else ""
    nodes = Pair(tmp_path, redis_url, metadata=request.param)
    try:
        nodes.start(("a", "b"))
        yield nodes
    finally:
        nodes.close()


def test_a_tree_is_one_tree_across_the_nodes(pair: Pair) -> None:
    sub = pair.tenant("a")
    subscribe_with_probe(sub, ("news/#", 1))
    tenant_pub = pair.tenant("b")
    wait_routed(tenant_pub, sub)
    pair.client("b").publish("news/1", b"default tree", 1)  # the same topic, another tree
    tenant_pub.publish("news/1", b"tenant-a", 1)
    got = sub.expect_message()
    assert (got.topic, got.payload) == ("news/1", b"tenant-a")
    sub.expect_no_message()

    tenant_pub.publish("state", b"kept", 1, retain=True)
    seen = retained_seen(pair.tenant("a"), "state")  # through the metadata, on node a
    assert seen is not None and seen.payload == b"kept"
    assert retained_seen(pair.client("a"), "state") is None


def test_the_same_client_id_on_two_trees_is_registered_twice(pair: Pair) -> None:
    client_id = unique_id("both")
    on_tenant = pair.tenant("a", client_id)
    on_default = pair.client("b", V5, client_id)  # no takeover of the tenant's session
    subscribe_with_probe(on_tenant, ("x", 1))
    publisher = pair.tenant("b")
    wait_routed(publisher, on_tenant)
    publisher.publish("x", b"still connected", 1)
    assert on_tenant.expect_message().payload == b"still connected"
    on_default.publish("x", b"default", 1)
    on_tenant.expect_no_message()
    taking_over = pair.tenant("b", client_id)  # the same tree: a takeover, across nodes
    assert on_tenant.expect_disconnected() == 0x8E  # session taken over
    taking_over.disconnect()
