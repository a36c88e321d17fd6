"""The cluster end to end: three `python -m broker` node processes (a, b, c) on loopback
sharing one real redis-server, and real MQTT clients (paho-mqtt 3.1.1 and 5; a raw socket
for bulk publishing and for what a taken-over connection sees on the wire).

Covered: publishes on one node reaching subscribers on the others (exact topics, `+` and
`#`, QoS 0/1/2 downgraded per subscriber, MQTT 5 properties, No Local, `$share` groups
across nodes and the prefer_local policy); subscription propagation (measured); retained
messages set and cleared through the metadata; takeover of a client id across nodes
(MQTT 5 and 3.1.1); a persistent session moving with 10,000 queued messages (measured); a
clean session moving; cluster status and metrics; a node stopped and restarted under its
name (VerneMQ issue 58). The failure tests (kill -9, cut links, Redis outages) are in
test_failures.py.

No test sleeps blindly: every wait is on an event (a message, a log line, a CONNACK) or a
poll with a deadline. A subscription is known to have reached the publisher's node when a
probe published there arrives: each subscriber subscribes its probe topic last, and a
node's record holds all of its subscriptions, so the probe proves the others too.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import statistics
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from testing.redis_server import RedisServer
from tests.broker.helpers import (
    DISCONNECT,
    PUBACK,
    PUBLISH,
    SESSION_EXPIRY_INTERVAL,
    V5,
    V311,
    PahoClient,
    RawClient,
    Received,
    publish_packet,
    unique_id,
)
from tests.cluster.nodes import API_KEY, ClusterNode

HOST = "127.0.0.1"
TIMEOUT = 10.0  # the longest any expected event may take
POLL = 0.02
NAMES = ("a", "b", "c")
SESSION_TAKEN_OVER = 0x8E
# Room for the 10,000 messages a persistent session queues while offline (the default,
# 1000, would drop most of them before any node is involved).
BROKER_SETTINGS = "max_offline_messages = 20000\n"

T = TypeVar("T")


# --------------------------------------------------------------------------- helpers


class Node(ClusterNode):
    """A ClusterNode with extra [broker] settings in its config."""

    def __init__(self, *args: Any, broker: str = BROKER_SETTINGS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.broker = broker

    def write_config(self) -> Path:
        path = super().write_config()
        text = path.read_text(encoding="utf-8")
        path.write_text(text.replace("[broker]\n", "[broker]\n" + self.broker, 1), "utf-8")
        return path

    def wait_line(self, pattern: str, since: int = 0, timeout: float = TIMEOUT) -> re.Match[str]:
        """The first log line from index `since` on that matches (waiting for it)."""
        assert self.process is not None
        compiled = re.compile(pattern)
        for line in self.process.lines[since:]:
            if match := compiled.search(line):
                return match
        return self.process.wait_for(compiled, timeout)

    def wait_links(self, peers: list[str], since: int = 0) -> None:
        for peer in peers:
            self.wait_line(rf"cluster link to {peer} \(\S+\) up", since)

    def drain_log(self) -> list[str]:
        """Every line logged so far (also those nobody waited for yet)."""
        process = self.process
        assert process is not None
        with contextlib.suppress(queue.Empty):
            while (line := process._queue.get_nowait()) is not None:
                process.lines.append(line)
            process._queue.put(None)  # the end stays visible to wait_for
        return process.lines


def admin(at: ClusterNode, command: str, **query: str) -> list[dict[str, Any]]:
    """One admin API command (`/api/v1/<command>`) of node `at`, its table."""
    url = f"{at.url}/api/v1/{command}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    request = urllib.request.Request(url, method="POST", headers={"x-api-key": API_KEY})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        return json.load(response)["table"]


def eventually(check: Callable[[], T | None], timeout: float = TIMEOUT, what: str = "") -> T:
    """Poll `check` until it returns something true; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what or check}")
        time.sleep(POLL)
    return result


class Trio:
    """Nodes a, b, c (and any restarted later), and the clients of a test."""

    node: type[Node] = Node  # what each node is (a subclass adds to its config)

    def __init__(self, tmp_path: Path, redis_url: str, metadata: str = "redis") -> None:
        self.tmp_path = tmp_path
        self.redis_url = redis_url
        self.metadata = metadata  # "swc": no Redis; b and c join through a
        self.nodes: dict[str, Node] = {}
        self.started: list[Node] = []  # every process, for the cleanup
        self.clients: list[PahoClient] = []

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def start(self, names: tuple[str, ...] = NAMES, broker: str = BROKER_SETTINGS) -> None:
        if self.metadata == "swc":
            nodes = self._swc_nodes(names, broker)
        else:
            nodes = [self.node(self.tmp_path / n, n, self.redis_url, broker=broker) for n in names]
            self.started.extend(nodes)
            with ThreadPoolExecutor(len(nodes)) as pool:
                list(pool.map(lambda node: node.start(), nodes))
        for node in nodes:
            self.nodes[node.name] = node
        for node in nodes:
            node.wait_links([peer for peer in names if peer != node.name])

    def _swc_nodes(self, names: tuple[str, ...], broker: str) -> list[Node]:
        """The first node alone, then the others joining through it."""
        first, *others = names
        seed = self.node(self.tmp_path / first, first, "", metadata="swc", broker=broker)
        self.started.append(seed)
        seed.start()
        nodes = [seed]
        for name in others:
            node = self.node(
                self.tmp_path / name,
                name,
                "",
                metadata="swc",
                seeds=[(HOST, seed.cluster_port)],
                broker=broker,
            )
            self.started.append(node)
            nodes.append(node.start())  # type: ignore[arg-type]
        return nodes

    def restart(self, name: str) -> Node:
        """A new process for node `name`, in the old one's directory and cluster port."""
        old = self.nodes[name]
        node = self.node(
            old.directory, name, self.redis_url, cluster_port=old.cluster_port, broker=old.broker
        )
        self.started.append(node)
        node.start()
        self.nodes[name] = node
        return node

    def client(
        self, node: str, version: int = V311, client_id: str | None = None, **connect: Any
    ) -> PahoClient:
        """A PahoClient connected to `node` (connect=False: not connected yet)."""
        client = PahoClient(HOST, self.nodes[node].port, version, client_id)
        self.clients.append(client)
        if connect.pop("connect", True):
            client.connect(**connect)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for node in self.started:
            node.kill()
        for node in self.started:  # shown when the test failed
            if node.process is not None:
                print(f"--- node {node.name} (port {node.port})")
                print("\n".join(node.drain_log()))


@pytest.fixture
def three_nodes(tmp_path: Path, redis_url: str, request: pytest.FixtureRequest) -> Iterator[Trio]:
    """Nodes a, b, c sharing the session's Redis, every link up. Parametrized indirectly,
    the parameter is the nodes' extra [broker] settings."""
    trio = Trio(tmp_path, redis_url)
    try:
        trio.start(broker=getattr(request, "param", BROKER_SETTINGS))
        yield trio
    finally:
        trio.close()


@pytest.fixture(scope="module")
def running_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trio]:
    """Nodes a, b, c on a redis-server of their own (the session's is emptied before each
    test), every link up: one trio for the module's tests that leave it as they found it
    (`shared_nodes`)."""
    directory = tmp_path_factory.mktemp("shared")
    redis_server = RedisServer(directory / "redis").start()
    trio = Trio(directory, redis_server.url)
    try:
        trio.start()
        yield trio
    finally:
        trio.close()
        redis_server.kill()


@pytest.fixture
def shared_nodes(running_nodes: Trio) -> Iterator[Trio]:
    """The module's trio; the clients the test connected are closed after it (closed_since)."""
    before = len(running_nodes.clients)
    try:
        yield running_nodes
    finally:
        closed_since(running_nodes.clients, before, running_nodes.nodes.values())


def closed_since(clients: list[PahoClient], first: int, nodes: Iterable[ClusterNode]) -> None:
    """Close (and forget) `clients` from index `first` on, and wait until no node counts a
    remote subscriber: a test sharing the nodes next starts from none."""
    for client in clients[first:]:
        client.close()
    del clients[first:]
    for node in nodes:
        eventually(
            lambda node=node: admin(node, "cluster/status")[0]["remote_subscribers"] == 0,
            what=f"no remote subscriber left on {node.name}",
        )


@pytest.fixture
def swc_three_nodes(tmp_path: Path) -> Iterator[Trio]:
    """Nodes a, b, c with the leaderless metadata and no Redis: b and c join through a."""
    trio = Trio(tmp_path, "", metadata="swc")
    try:
        trio.start()
        yield trio
    finally:
        trio.close()


def probe_topic(client: PahoClient) -> str:
    return f"probe/{client.client_id}"


def subscribe_with_probe(client: PahoClient, *filters: tuple[str, int]) -> None:
    """Subscribe `filters`, then the client's probe topic (last: see the module's doc)."""
    for topic_filter, qos in filters:
        assert client.subscribe(topic_filter, qos) == [qos]
    assert client.subscribe(probe_topic(client), 1) == [1]


def wait_routed(publisher: PahoClient, subscriber: PahoClient) -> float:
    """Publish probes through `publisher` until `subscriber` gets one (its subscriptions
    have reached the publisher's node), then drain the probes; returns the seconds from
    the call until the first probe arrived."""
    topic = probe_topic(subscriber)
    start = time.monotonic()
    deadline = start + TIMEOUT
    sent = 0
    while True:
        publisher.publish(topic, f"probe {sent}".encode(), 0)
        sent += 1
        try:
            message = subscriber.messages.get(timeout=0.005)
        except queue.Empty:
            assert time.monotonic() < deadline, f"{topic} not routed within {TIMEOUT}s"
            continue
        delay = time.monotonic() - start
        assert message.topic == topic, f"{subscriber.client_id} got {message} first"
        break
    drain_probes(publisher, subscriber)
    return delay


def drain_probes(publisher: PahoClient, subscriber: PahoClient) -> None:
    """Publish an end marker on the probe topic and read up to it: every message in
    between must be a probe (anything else arrived where it should not have)."""
    topic = probe_topic(subscriber)
    marker = unique_id("end").encode()
    publisher.publish(topic, marker, 1)
    while (message := subscriber.expect_message()).payload != marker:
        assert message.topic == topic and message.payload.startswith(b"probe"), message


def take(client: PahoClient, count: int, timeout: float = TIMEOUT) -> list[Received]:
    return [client.expect_message(timeout) for _ in range(count)]


def summary(messages: list[Received]) -> list[tuple[str, bytes, int]]:
    return [(m.topic, m.payload, m.qos) for m in messages]


def collect_all(client: PahoClient, payloads: set[bytes]) -> list[Received]:
    """Messages until each of `payloads` has arrived. For a subscriber that gets QoS 2:
    paho hands a QoS 2 message to the application when the broker's PUBREL comes, so a
    QoS 0 or 1 message the broker sent after it may come first (when paho's thread reads
    both PUBLISHes before the PUBREL, on a busy machine)."""
    got: list[Received] = []
    missing = set(payloads)
    while missing:
        message = client.expect_message()
        got.append(message)
        missing.discard(message.payload)
    return got


def in_order_but_qos2(
    got: list[tuple[str, bytes, int]], want: list[tuple[str, bytes, int]]
) -> bool:
    """The same messages, in the same order apart from QoS 2 ones (see collect_all)."""
    below_2 = [m for m in got if m[2] < 2]
    return sorted(got) == sorted(want) and below_2 == [m for m in want if m[2] < 2]


def publish_many(port: int, topic: str, payloads: list[bytes]) -> None:
    """QoS 1 publishes sent back to back on one connection, each acknowledged."""
    raw = RawClient(HOST, port)
    try:
        raw.connect(unique_id("bulk"))
        raw.send(
            b"".join(
                publish_packet(topic, payload, qos=1, packet_id=index + 1)
                for index, payload in enumerate(payloads)
            )
        )
        acked = Counter(raw.expect(PUBACK).packet_id for _ in payloads)
        assert acked == Counter(range(1, len(payloads) + 1))
        raw.disconnect()
    finally:
        raw.close()


def retained_seen(client: PahoClient, topic: str) -> Received | None:
    """Subscribe to `topic` and return the retained message it brings, if any: the
    client's own publish to the topic right after the SUBACK comes after it, so the first
    message tells. Unsubscribes again."""
    assert client.subscribe(topic, 1) == [1]
    marker = unique_id("marker").encode()
    client.publish(topic, marker, 1)
    first = client.expect_message()
    if first.payload != marker:
        assert client.expect_message().payload == marker
    client.unsubscribe(topic)
    return first if first.payload != marker else None


def session_rows(node: ClusterNode, client_id: str) -> list[dict[str, Any]]:
    """The sessions of `client_id` on `node` (session/show asks every node but for
    node=...)."""
    return admin(node, "session/show", node=node.name, client_id=client_id)


def settled(client: PahoClient, node: ClusterNode) -> None:
    """Wait until `node` has every acknowledgement of `client`. paho acknowledges a QoS 1
    message after handing it to the application, so a test can see a message before the
    broker has its PUBACK: a session moved or resumed meanwhile gets it again."""
    client_id = client.client_id
    eventually(
        lambda: all(row["waiting_acks"] == 0 for row in session_rows(node, client_id)),
        what=f"{client_id}'s acknowledgements on {node.name}",
    )


def disconnect(client: PahoClient, node: ClusterNode) -> None:
    """Disconnect `client`, once `node` has its acknowledgements (settled), and wait until
    `node` has its session offline. paho is done once it has sent DISCONNECT, before the
    broker has read it: a message routed to the session meanwhile goes to the closing
    connection, in flight rather than queued."""
    client_id = client.client_id
    settled(client, node)
    client.disconnect()
    eventually(
        lambda: not any(row["is_online"] for row in session_rows(node, client_id)),
        what=f"{client_id} offline on {node.name}",
    )


# --------------------------------------------------------------------------- 1. publish on A


def test_publish_on_a_reaches_b_and_c(shared_nodes: Trio) -> None:
    """Exact topics, `+` and `#`, each subscriber at min(publish QoS, subscription QoS),
    and an MQTT 5 message's properties intact on the other node."""
    trio = shared_nodes
    pub = trio.client("a", V5)
    b_exact = trio.client("b", V311)
    b_plus = trio.client("b", V5)
    c_hash = trio.client("c", V311)
    c_exact = trio.client("c", V5)
    subscribe_with_probe(b_exact, ("e2e/exact", 2))
    subscribe_with_probe(b_plus, ("e2e/+/x", 1))
    subscribe_with_probe(c_hash, ("e2e/#", 0))
    subscribe_with_probe(c_exact, ("e2e/exact", 1))
    for sub in (b_exact, b_plus, c_hash, c_exact):
        wait_routed(pub, sub)

    for qos in (0, 1, 2):
        pub.publish("e2e/exact", f"exact-{qos}", qos)
        pub.publish("e2e/y/x", f"plus-{qos}", qos)
        pub.publish("e2e/other", f"other-{qos}", qos)
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("k", "v1"), ("k", "v2"), ("trace", "é-ü")]
    props.ContentType = "application/json"
    props.ResponseTopic = "e2e/reply"
    props.CorrelationData = b"\x00corr\xff"
    props.PayloadFormatIndicator = 1
    props.MessageExpiryInterval = 3600
    pub.publish("e2e/props/x", b'{"a": 1}', 1, properties=props)
    pub.publish("e2e/exact", b"end-exact", 1)
    pub.publish("e2e/end/x", b"end-plus", 1)

    def expected(items: list[tuple[str, str, int]]) -> list[tuple[str, bytes, int]]:
        return [(topic, payload.encode(), qos) for topic, payload, qos in items]

    got = summary(collect_all(b_exact, {b"exact-2", b"end-exact"}))
    assert in_order_but_qos2(
        got,
        expected(
            [
                ("e2e/exact", "exact-0", 0),
                ("e2e/exact", "exact-1", 1),
                ("e2e/exact", "exact-2", 2),
                ("e2e/exact", "end-exact", 1),
            ]
        ),
    ), got
    c_exact_got = c_exact.collect_until(b"end-exact")
    assert summary(c_exact_got) == expected(
        [
            ("e2e/exact", "exact-0", 0),
            ("e2e/exact", "exact-1", 1),
            ("e2e/exact", "exact-2", 1),
            ("e2e/exact", "end-exact", 1),
        ]
    )
    b_plus_got = b_plus.collect_until(b"end-plus")
    assert summary(b_plus_got) == expected(
        [
            ("e2e/y/x", "plus-0", 0),
            ("e2e/y/x", "plus-1", 1),
            ("e2e/y/x", "plus-2", 1),
            ("e2e/props/x", '{"a": 1}', 1),
            ("e2e/end/x", "end-plus", 1),
        ]
    )
    assert summary(c_hash.collect_until(b"end-plus")) == expected(
        [
            *((topic, f"{kind}-{qos}", 0) for qos in (0, 1, 2) for topic, kind in (
                ("e2e/exact", "exact"), ("e2e/y/x", "plus"), ("e2e/other", "other"))),
            ("e2e/props/x", '{"a": 1}', 0),
            ("e2e/exact", "end-exact", 0),
            ("e2e/end/x", "end-plus", 0),
        ]
    )  # fmt: skip

    received = b_plus_got[3].properties
    assert received.UserProperty == [("k", "v1"), ("k", "v2"), ("trace", "é-ü")]
    assert received.ContentType == "application/json"
    assert received.ResponseTopic == "e2e/reply"
    assert received.CorrelationData == b"\x00corr\xff"
    assert received.PayloadFormatIndicator == 1
    assert 3590 <= received.MessageExpiryInterval <= 3600
    # A message without properties gets none on the way.
    assert not hasattr(c_exact_got[0].properties, "UserProperty")
    assert not hasattr(c_exact_got[0].properties, "ContentType")


def test_no_local_for_a_publisher_subscribed_on_its_own_node(shared_nodes: Trio) -> None:
    trio = shared_nodes
    pub = trio.client("a", V5)
    other = trio.client("a", V5)
    remote = trio.client("b", V5)
    assert pub.subscribe("nl/t", options=SubscribeOptions(qos=1, noLocal=True)) == [1]
    subscribe_with_probe(remote, ("nl/t", 1))
    wait_routed(other, remote)

    pub.publish("nl/t", b"from pub", 1)
    other.publish("nl/t", b"from other", 1)
    # pub's own message is not sent back to it; the other client's is.
    assert pub.expect_message().payload == b"from other"
    assert [m.payload for m in take(remote, 2)] == [b"from pub", b"from other"]
    # Nor does it come back by way of another node.
    pub.publish("nl/t", b"from pub again", 1)
    other.publish("nl/t", b"end", 1)
    assert pub.expect_message().payload == b"end"


def test_shared_group_across_nodes_gets_each_message_once(shared_nodes: Trio) -> None:
    """$share/g/... with a member on B and one on C, published on A (no local member:
    prefer_local picks among all): each message to exactly one member, both get some."""
    trio = shared_nodes
    pub = trio.client("a", V5)
    m_b = trio.client("b", V5)
    m_c = trio.client("c", V311)
    subscribe_with_probe(m_b, ("$share/g/sh/t", 1))
    subscribe_with_probe(m_c, ("$share/g/sh/t", 1))
    wait_routed(pub, m_b)
    wait_routed(pub, m_c)

    count = 60
    sent = [f"{n}".encode() for n in range(count)]
    for payload in sent:
        pub.publish("sh/t", payload, 1)
    got: dict[str, list[bytes]] = {"b": [], "c": []}

    def all_arrived() -> bool:
        for name, member in (("b", m_b), ("c", m_c)):
            with contextlib.suppress(queue.Empty):
                while True:
                    message = member.messages.get_nowait()
                    assert message.topic == "sh/t" and message.qos == 1, message
                    got[name].append(message.payload)
        return len(got["b"]) + len(got["c"]) >= count

    eventually(all_arrived, what=f"{count} shared messages")
    # Nothing more comes: the markers on the probe topics follow on the same links.
    drain_probes(pub, m_b)
    drain_probes(pub, m_c)
    assert Counter(got["b"] + got["c"]) == Counter(sent), got
    assert got["b"] and got["c"], got
    # Each member gets its share in publish order.
    assert got["b"] == sorted(got["b"], key=int) and got["c"] == sorted(got["c"], key=int)
    print(f"\nshared group: {len(got['b'])} to b, {len(got['c'])} to c")


def test_shared_group_prefers_the_local_member(shared_nodes: Trio) -> None:
    """prefer_local (the default): with a member on A online, A's publishes go to it."""
    trio = shared_nodes
    pub = trio.client("a", V5)
    m_a = trio.client("a", V5)
    m_b = trio.client("b", V5)
    subscribe_with_probe(m_a, ("$share/h/pl/t", 1))
    subscribe_with_probe(m_b, ("$share/h/pl/t", 1))
    wait_routed(pub, m_b)  # A knows the remote member
    # ...and B does route to A's member (so the group is whole on both nodes).
    b_pub = trio.client("b", V5)
    wait_routed(b_pub, m_a)

    count = 30
    for n in range(count):
        pub.publish("pl/t", f"{n}".encode(), 1)
    assert [m.payload for m in take(m_a, count)] == [f"{n}".encode() for n in range(count)]
    drain_probes(pub, m_a)
    drain_probes(pub, m_b)  # B's member got none of them (same link as the marker)
    # And published on B, B's member is the local one.
    for n in range(5):
        b_pub.publish("pl/t", f"b{n}".encode(), 1)
    assert [m.payload for m in take(m_b, 5)] == [f"b{n}".encode() for n in range(5)]
    drain_probes(b_pub, m_a)


# --------------------------------------------------------------------------- 2. propagation


def test_subscription_propagation_delay(shared_nodes: Trio) -> None:
    """After the SUBACK on B, how long until A routes to B: the time until the first of
    the probes published on A (one every few milliseconds from the SUBACK on) arrives.
    That includes one hop A -> B, measured alone for comparison. Printed; bounded
    generously."""
    trio = shared_nodes
    pub = trio.client("a", V311)
    samples = 20
    delays = []
    for _ in range(samples):
        sub = trio.client("b", V311)
        assert sub.subscribe(probe_topic(sub), 0) == [0]  # the SUBACK is in: time starts
        delays.append(wait_routed(pub, sub))
    assert admin(trio["a"], "cluster/status")[0]["remote_subscribers"] == samples
    hops = []
    for n in range(samples):  # a message already routed: publish to arrival
        sent = time.monotonic()
        pub.publish(probe_topic(sub), f"hop {n}".encode(), 0)
        assert sub.expect_message().payload == f"hop {n}".encode()
        hops.append(time.monotonic() - sent)
    ms = sorted(d * 1000 for d in delays)
    print(
        f"\nsubscription propagation B -> A, SUBACK to first routed probe received "
        f"({samples} samples): median {statistics.median(ms):.1f} ms, min {ms[0]:.1f}, "
        f"max {ms[-1]:.1f}; one publish hop A -> B alone: median "
        f"{statistics.median(hops) * 1000:.1f} ms"
    )
    assert max(delays) < 2.0

    # An unsubscribe propagates too: A stops forwarding to B.
    topic = probe_topic(sub)
    sub.unsubscribe(topic)

    def not_forwarded() -> bool:
        before = trio["a"].metrics()["router_matches_remote"]
        pub.publish(topic, b"after unsubscribe", 1)
        return trio["a"].metrics()["router_matches_remote"] == before

    eventually(not_forwarded, what="A stops routing the unsubscribed filter to B")
    assert admin(trio["a"], "cluster/status")[0]["remote_subscribers"] == samples


# --------------------------------------------------------------------------- 3. retained


def test_retained_set_on_a_and_cleared_on_b(shared_nodes: Trio) -> None:
    trio = shared_nodes
    pub = trio.client("a", V311)
    pub.publish("ret/t", b"kept", 1, retain=True)
    on_c = trio.client("c", V311)
    message = eventually(lambda: retained_seen(on_c, "ret/t"), what="retained on C")
    assert (message.payload, message.retain, message.qos) == (b"kept", True, 1)
    on_b = trio.client("b", V311)
    assert eventually(lambda: retained_seen(on_b, "ret/t"), what="retained on B").payload == (
        b"kept"
    )

    on_b.publish("ret/t", b"", 1, retain=True)  # cleared on B
    eventually(lambda: retained_seen(on_c, "ret/t") is None, what="cleared on C")
    eventually(lambda: retained_seen(pub, "ret/t") is None, what="cleared on A")
    assert retained_seen(on_b, "ret/t") is None

    # A later retained message on C replaces nothing stale on A.
    on_c.publish("ret/t", b"second", 1, retain=True)
    message = eventually(lambda: retained_seen(pub, "ret/t"), what="second on A")
    assert message.payload == b"second"


# --------------------------------------------------------------------------- 4. takeover


def wait_routed_raw(publisher: PahoClient, raw: RawClient, topic: str) -> None:
    """wait_routed for a RawClient subscribed to `topic` (QoS 1): probes until one
    arrives, then an end marker; everything up to it acknowledged."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        publisher.publish(topic, b"probe", 0)
        try:
            packet = raw.read_packet(0.005)
        except TimeoutError:
            assert time.monotonic() < deadline, f"{topic} not routed within {TIMEOUT}s"
            continue
        assert packet is not None and packet.type == PUBLISH and packet.topic == topic, packet
        break
    publisher.publish(topic, b"end", 1)
    while True:
        packet = raw.expect(PUBLISH)
        assert packet.topic == topic, packet
        raw.ack(packet)
        if packet.payload == b"end":
            return


@pytest.mark.parametrize("version", [V5, V311], ids=["v5", "v311"])
def test_takeover_across_nodes(three_nodes: Trio, version: int) -> None:
    takeover_across_nodes(three_nodes, version)


@pytest.mark.parametrize("version", [V5, V311], ids=["v5", "v311"])
def test_takeover_across_nodes_with_the_leaderless_metadata(
    swc_three_nodes: Trio, version: int
) -> None:
    takeover_across_nodes(swc_three_nodes, version)


def takeover_across_nodes(trio: Trio, version: int) -> None:
    """The same client id connecting on C while connected on B: the old connection is
    closed (MQTT 5: DISCONNECT 0x8E first), the session with its subscriptions and its
    unacknowledged messages continues on C, and A routes to C alone."""
    pub = trio.client("a", V311)
    persistent: dict[str, Any] = {"clean": False}
    if version == V5:
        persistent["session_expiry"] = 300
    old = trio.client("b", version, "dev", **persistent)
    subscribe_with_probe(old, ("dev/in", 1))
    wait_routed(pub, old)
    settled(old, trio["b"])  # else the probes' end marker may move along, unacknowledged

    new = trio.client("c", version, "dev", connect=False)
    result = new.connect(**persistent)
    assert result.session_present  # the session lived on B
    code = old.expect_disconnected()
    if version == V5:
        assert code == SESSION_TAKEN_OVER
    else:
        assert code != 0  # the connection was closed under it

    wait_routed(pub, new)  # A routes to C now (the subscriptions came along)
    for n in range(5):
        pub.publish("dev/in", f"{n}".encode(), 1)
    assert [m.payload for m in take(new, 5)] == [f"{n}".encode() for n in range(5)]
    drain_probes(pub, new)  # no duplicate
    assert old.messages.empty()
    assert session_rows(trio["b"], "dev") == []
    [row] = session_rows(trio["c"], "dev")
    assert row["is_online"] and row["num_subscriptions"] == 2

    # On the wire, with messages sent to the old connection and not acknowledged.
    raw = RawClient(HOST, trio["b"].port, version)
    try:
        props = {SESSION_EXPIRY_INTERVAL: 300} if version == V5 else None
        raw.connect("dev-raw", clean=False, properties=props)
        assert raw.subscribe(("raw/in", 1), ("probe/dev-raw", 1)) == [1, 1]
        wait_routed_raw(pub, raw, "probe/dev-raw")
        for n in range(3):
            pub.publish("raw/in", f"unacked {n}".encode(), 1)
        unacked = [raw.expect(PUBLISH) for _ in range(3)]
        assert [p.payload for p in unacked] == [f"unacked {n}".encode() for n in range(3)]
        taker = trio.client("c", version, "dev-raw", connect=False)
        assert taker.connect(**persistent).session_present
        before_close = raw.expect_closed()
    finally:
        raw.close()
    if version == V5:
        assert [(p.type, p.reason_code) for p in before_close] == [(DISCONNECT, SESSION_TAKEN_OVER)]
    else:
        assert before_close == []  # MQTT 3.1.1: closed, nothing said
    redelivered = take(taker, 3)
    assert [m.payload for m in redelivered] == [f"unacked {n}".encode() for n in range(3)]
    assert {m.qos for m in redelivered} == {1}
    trio["b"].wait_line(r"dev-raw moved to node c with 3 queued messages")


# --------------------------------------------------------------------------- 5. 10k moving


def moving_10000(trio: Trio) -> None:
    """A persistent session on B with 10,000 QoS 1 messages queued while offline
    connects to C: everything arrives once, in order."""
    count = 10_000
    pub = trio.client("a", V311)
    mover = trio.client("b", V311, "mover", clean=False)
    subscribe_with_probe(mover, ("mv/t", 1))
    wait_routed(pub, mover)
    barrier = trio.client("b", V311)
    subscribe_with_probe(barrier)
    wait_routed(pub, barrier)
    disconnect(mover, trio["b"])

    started = time.monotonic()
    publish_many(trio["a"].port, "mv/t", [f"{n}".encode() for n in range(count)])
    published = time.monotonic() - started
    # The link A -> B is ordered: once the barrier's marker is through, so are the 10k.
    drain_probes(pub, barrier)
    [row] = session_rows(trio["b"], "mover")
    assert (row["is_online"], row["queue_size"]) == (False, count)

    moved = trio.client("c", V311, "mover", connect=False)
    connect_at = time.monotonic()
    result = moved.connect(clean=False)
    assert result.session_present
    got: list[Received] = []
    with contextlib.suppress(AssertionError):  # what arrived is checked below
        while len(got) < count:
            got.append(moved.expect_message(3.0))
    last_at = time.monotonic()
    payloads = [int(m.payload) for m in got]
    missing = sorted(set(range(count)) - set(payloads))
    print(
        f"\n{count} QoS 1 published on A in {published:.2f}s; moved B -> C: "
        f"{len(got)} received, CONNECT to last message {last_at - connect_at:.2f}s"
    )
    assert not missing, (
        f"{len(missing)} of {count} never reached the client on C "
        f"(from {missing[0]}; received {len(got)}, the last {payloads[-3:]}); C's metrics: "
        f"queue_message_drop {trio['c'].metrics()['queue_message_drop']:.0f}; B's log: "
        f"{[line for line in trio['b'].drain_log() if 'mover moved' in line]}"
    )
    duplicates = [p for p, n in Counter(payloads).items() if n > 1]
    assert not duplicates, duplicates[:10]
    assert payloads == list(range(count))  # in order
    assert {m.topic for m in got} == {"mv/t"} and {m.qos for m in got} == {1}

    match = trio["b"].wait_line(r"mover moved to node c with (\d+) queued messages")
    assert int(match[1]) == count
    assert session_rows(trio["b"], "mover") == []
    [row] = session_rows(trio["c"], "mover")
    assert row["is_online"]
    # A routes to C now; one more message arrives once, and nothing else was left over.
    wait_routed(pub, moved)
    pub.publish("mv/t", b"after", 1)
    assert moved.expect_message().payload == b"after"
    drain_probes(pub, moved)
    metrics = trio["b"].metrics()
    assert metrics["cluster_messages_migrated"] == count
    assert metrics["cluster_enqueue_dropped"] == 0


def test_persistent_session_moves_with_10000_queued_messages(three_nodes: Trio) -> None:
    """The default online queue limit (max_online_messages = 1000); 10,000 may wait
    offline (max_offline_messages = 20000): the whole backlog must reach the client."""
    moving_10000(three_nodes)


def test_persistent_session_moves_with_its_queue_with_the_leaderless_metadata(
    swc_three_nodes: Trio,
) -> None:
    moving_10000(swc_three_nodes)


@pytest.mark.parametrize(
    "three_nodes",
    [BROKER_SETTINGS + "max_online_messages = 20000\n"],
    ids=["max_online_messages=20000"],
    indirect=True,
)
def test_persistent_session_moves_with_10000_queued_messages_room_online(
    three_nodes: Trio,
) -> None:
    """The same with room for all of it in C's online queue: the migration itself (the
    takeover, the chunks, the order, the record) works."""
    moving_10000(three_nodes)


def test_moved_queue_keeps_message_properties(three_nodes: Trio) -> None:
    """MQTT 5 properties and subscription identifiers of queued messages survive the
    move; a message's expiry counts down rather than restarting."""
    trio = three_nodes
    pub = trio.client("a", V5)
    sub = trio.client("b", V5, "props-mover", clean=False, session_expiry=300)
    assert sub.subscribe("pm/t", 1, sub_id=7) == [1]
    assert sub.subscribe(probe_topic(sub), 1) == [1]
    wait_routed(pub, sub)
    disconnect(sub, trio["b"])
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("k", "v")]
    props.ContentType = "text/plain"
    props.CorrelationData = b"corr"
    props.MessageExpiryInterval = 3600
    pub.publish("pm/t", b"queued", 1, properties=props)
    barrier = trio.client("b", V5)
    subscribe_with_probe(barrier)
    wait_routed(pub, barrier)

    moved = trio.client("c", V5, "props-mover", connect=False)
    assert moved.connect(clean=False, session_expiry=300).session_present
    message = moved.expect_message()
    assert (message.topic, message.payload, message.qos) == ("pm/t", b"queued", 1)
    assert message.properties.UserProperty == [("k", "v")]
    assert message.properties.ContentType == "text/plain"
    assert message.properties.CorrelationData == b"corr"
    assert 3590 <= message.properties.MessageExpiryInterval <= 3600
    assert message.subscription_ids == [7]


def test_moved_queue_keeps_retain_as_published(three_nodes: Trio) -> None:
    trio = three_nodes
    pub = trio.client("a", V5)
    sub = trio.client("b", V5, "rap-mover", clean=False, session_expiry=300)
    options = SubscribeOptions(qos=1, retainAsPublished=True)
    assert sub.subscribe("rap/t", options=options) == [1]
    assert sub.subscribe(probe_topic(sub), 1) == [1]
    wait_routed(pub, sub)
    pub.publish("rap/t", b"online", 1, retain=True)
    assert sub.expect_message().retain  # retain as published, online
    disconnect(sub, trio["b"])
    pub.publish("rap/t", b"offline", 1, retain=True)
    pub.publish("rap/t", b"offline plain", 1)
    barrier = trio.client("b", V5)
    subscribe_with_probe(barrier)
    wait_routed(pub, barrier)

    moved = trio.client("c", V5, "rap-mover", connect=False)
    assert moved.connect(clean=False, session_expiry=300).session_present
    got = [(m.payload, m.retain) for m in take(moved, 2)]
    assert got == [(b"offline", True), (b"offline plain", False)]


# --------------------------------------------------------------------------- 6. clean moving


def test_clean_session_moving_starts_empty(three_nodes: Trio) -> None:
    trio = three_nodes
    pub = trio.client("a", V311)
    # Connected on B, then connecting on C: taken over, nothing kept.
    old = trio.client("b", V311, "cl", clean=True)
    subscribe_with_probe(old, ("cl/t", 1))
    wait_routed(pub, old)
    new = trio.client("c", V311, "cl", connect=False)
    assert not new.connect(clean=True).session_present
    old.expect_disconnected()
    assert new.subscribe(probe_topic(new), 1) == [1]
    wait_routed(pub, new)
    pub.publish("cl/t", b"to the old subscription", 1)
    drain_probes(pub, new)  # the message would come first on the same link
    [row] = session_rows(trio["c"], "cl")
    assert row["num_subscriptions"] == 1

    # Disconnected from C, then clean on B: again nothing of the earlier session.
    assert new.subscribe("cl/t", 1) == [1]
    new.disconnect()
    again = trio.client("b", V311, "cl", connect=False)
    assert not again.connect(clean=True).session_present
    assert again.subscribe(probe_topic(again), 1) == [1]
    wait_routed(pub, again)
    pub.publish("cl/t", b"to the old subscription", 1)
    drain_probes(pub, again)
    assert session_rows(trio["c"], "cl") == []

    # A persistent session with messages queued on B, connecting clean on C: none of it.
    keeper = trio.client("b", V311, "cl2", clean=False)
    subscribe_with_probe(keeper, ("cl2/t", 1))
    wait_routed(pub, keeper)
    disconnect(keeper, trio["b"])
    for n in range(3):
        pub.publish("cl2/t", f"{n}".encode(), 1)
    b_pub = trio.client("b", V311)
    barrier = trio.client("b", V311)
    subscribe_with_probe(barrier)
    wait_routed(pub, barrier)  # the 3 are queued on B now
    [row] = session_rows(trio["b"], "cl2")
    assert row["queue_size"] == 3
    fresh = trio.client("c", V311, "cl2", connect=False)
    assert not fresh.connect(clean=True).session_present
    assert session_rows(trio["b"], "cl2") == []
    assert fresh.subscribe(probe_topic(fresh), 1) == [1]
    # A migrated queue would come on the link B -> C before these probes.
    wait_routed(b_pub, fresh)
    wait_routed(pub, fresh)
    pub.publish("cl2/t", b"to the old subscription", 1)
    drain_probes(pub, fresh)
    assert trio["b"].metrics()["cluster_messages_migrated"] == 0


@pytest.mark.parametrize(
    ("version", "where"),
    [(V311, "c"), (V5, "c"), (V311, "b")],
    ids=["v311-other-node", "v5-other-node", "v311-same-node"],
)
def test_clean_session_taken_over_by_persistent_connect_is_not_resumed(
    three_nodes: Trio, version: int, where: str
) -> None:
    trio = three_nodes
    pub = trio.client("a", V311)
    old = trio.client("b", version, "cp", clean=True)  # MQTT 5: no expiry, i.e. 0
    subscribe_with_probe(old, ("cp/t", 1))
    wait_routed(pub, old)
    new = trio.client(where, version, "cp", connect=False)
    persistent: dict[str, Any] = {"clean": False}
    if version == V5:
        persistent["session_expiry"] = 300
    result = new.connect(**persistent)
    old.expect_disconnected()
    rows = session_rows(trio[where], "cp")
    assert (result.session_present, rows[0]["num_subscriptions"]) == (False, 0)
    assert new.subscribe(probe_topic(new), 1) == [1]
    wait_routed(pub, new)
    pub.publish("cp/t", b"to the clean session's subscription", 1)
    drain_probes(pub, new)


# --------------------------------------------------------------------------- 7. status


def test_cluster_status_and_metrics(shared_nodes: Trio) -> None:
    trio = shared_nodes
    pub = trio.client("a", V311)
    subs = [trio.client("b", V311), trio.client("c", V311)]
    for sub in subs:
        subscribe_with_probe(sub, ("st/t", 1))
        wait_routed(pub, sub)

    before = trio["a"].metrics()
    count = 10
    for n in range(count):
        pub.publish("st/t", f"{n}".encode(), 1)
    for sub in subs:
        assert len(take(sub, count)) == count
    after = trio["a"].metrics()
    # One forward per message per node with subscribers, none of it local.
    assert after["router_matches_remote"] - before["router_matches_remote"] == 2 * count
    assert after["router_matches_local"] == before["router_matches_local"]
    assert after["cluster_bytes_sent"] > before["cluster_bytes_sent"] > 0
    assert after["cluster_bytes_dropped"] == 0
    assert trio["b"].metrics()["cluster_bytes_received"] > 0

    status = trio["a"].cluster_status()
    assert status["node"] == "a" and status["metadata"] == "available"
    nodes = {row["node"]: row for row in status["nodes"]}
    assert sorted(nodes) == ["a", "b", "c"]
    assert all(row["alive"] for row in nodes.values())
    assert nodes["a"]["self"] and nodes["a"]["link"] is None
    assert nodes["b"]["link"] is True and nodes["c"]["link"] is True
    assert nodes["b"]["bytes_sent"] > 0 and nodes["c"]["bytes_sent"] > 0
    assert status["routing_score"]["remote"] >= 2 * count
    assert status["remote_subscribers"] == 2


# --------------------------------------------------------------------------- 8. restart


def test_node_restarted_under_its_name(three_nodes: Trio) -> None:
    """B stopped (SIGTERM) and started again in its directory on its cluster port: pub/sub
    both ways (VerneMQ issue 58), and B's persistent subscriber keeps its subscription."""
    trio = three_nodes
    pub = trio.client("a", V311)
    on_a = trio.client("a", V311)
    subscribe_with_probe(on_a, ("rs/ba", 1))
    keeper = trio.client("b", V311, "keeper", clean=False)
    subscribe_with_probe(keeper, ("rs/ab", 1))
    wait_routed(pub, keeper)
    disconnect(keeper, trio["b"])

    a_mark, c_mark = len(trio["a"].drain_log()), len(trio["c"].drain_log())
    assert trio["b"].stop() == 0
    b = trio.restart("b")
    b.wait_links(["a", "c"])
    trio["a"].wait_line(r"cluster link to b \(\S+\) up", a_mark)
    trio["c"].wait_line(r"cluster link to b \(\S+\) up", c_mark)
    reaped = any("node b silent" in line for line in trio["a"].drain_log()[a_mark:])
    print(f"\nB restarted; its sessions reaped meanwhile: {reaped}")

    # A -> B: to the persistent subscriber, offline, then online.
    pub.publish("rs/ab", b"while offline", 1)
    keeper = trio.client("b", V311, "keeper", connect=False)
    assert keeper.connect(clean=False).session_present
    assert keeper.expect_message().payload == b"while offline"
    pub.publish("rs/ab", b"online", 1)
    assert keeper.expect_message().payload == b"online"
    drain_probes(pub, keeper)

    # A -> B: a new subscriber on the restarted B.
    new_b = trio.client("b", V311)
    subscribe_with_probe(new_b, ("rs/new", 1))
    wait_routed(pub, new_b)
    pub.publish("rs/new", b"new", 1)
    assert new_b.expect_message().payload == b"new"

    # B -> A: A's subscriber, which B learned at its start.
    b_pub = trio.client("b", V311)
    b_pub.publish("rs/ba", b"from b", 1)
    assert on_a.expect_message().payload == b"from b"
    drain_probes(b_pub, on_a)
    # and C -> B, B -> C still work too
    on_c = trio.client("c", V311)
    subscribe_with_probe(on_c)
    wait_routed(b_pub, on_c)
    c_pub = trio.client("c", V311)
    wait_routed(c_pub, new_b)
