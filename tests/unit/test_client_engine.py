"""The per-client engine with bytes alone: no event loop, no transport, no task, no
Broker.

The engines are served by the broker's real parts (registry, routing, ingress, sessions,
hook chains, a memory store), assembled here as the broker's ClientServices port; each
engine's shell is a fake that records what the engine asks of the I/O (reading paused or
not, hook flows to run, calls later, the keepalive watch, the close) and its outlet keeps
the bytes it is given. Bytes go in through `receive`; what a client would read is decoded
from its outlet. Nothing runs unless the test runs it: a hook flow is a coroutine the
test steps by hand, a call later is a callback the test calls.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest

from broker.client.engine import ClientEngine, ConnectTerms, Listener, PacketHandlers
from broker.client.handlers import HANDLERS
from broker.client_state import ClientState
from broker.config import BrokerSettings, ListenerSettings, config_from_dict
from broker.flow import FlowControl
from broker.hook_callers import HookCallers
from broker.ingress import Ingress
from broker.metrics import Metrics
from broker.peers import ALONE, Alone, ClientOwnership
from broker.protocol import (
    MAX_PACKET_SIZE,
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Property,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)
from broker.read_gate import YIELDED
from broker.registry import Registry, session_factory
from broker.retain import RetainedMessages
from broker.routing import Routing
from broker.session import Session
from broker.store import open_store
from broker.subscription_trie import SubscriptionTrie
from hooks import Error, Hooks, Ok

from .fakes import FakeLoop

V311, V5 = 4, 5
LISTENER = Listener(0, ListenerSettings(), ("127.0.0.1", 1883))
TERMS = ConnectTerms(MAX_PACKET_SIZE, {Property.RECEIVE_MAXIMUM: 65535})


class FakeFlow:
    """broker.client.engine.Flow: remembers whether the engine cancelled it."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeShell:
    """broker.client.engine.Shell that records what the engine asks for."""

    def __init__(self) -> None:
        self.reading = True
        self.flows: list[Coroutine[Any, Any, None]] = []
        self.handles: list[FakeFlow] = []  # one per flow, the engine's handle on it
        self.later: list[tuple[float, Callable[[], None]]] = []
        self.soon: list[Callable[[], None]] = []
        self.keepalive: int | None = None
        self.closed = False

    def read(self, wanted: bool) -> None:
        self.reading = wanted

    def spawn(self, flow: Coroutine[Any, Any, None]) -> FakeFlow:
        self.flows.append(flow)
        self.handles.append(FakeFlow())
        return self.handles[-1]

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        self.later.append((when, callback))

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def watch_keepalive(self, seconds: int) -> None:
        self.keepalive = seconds

    def close_transport(self) -> None:
        self.closed = True


class BytesOutlet:
    """broker.client.engine.ClientOutlet that keeps every byte, in order; `acks` counts
    the acknowledgements (the writes that wait for the store); `take_over` goes to the
    client's engine, as a Writer's does."""

    def __init__(self) -> None:
        self.client = ClientState(("192.0.2.1", 50000))
        self.writable = True
        self.session: Session | None = None
        self.written = bytearray()
        self.writes = 0  # calls of write: a run of QoS 0 messages is one
        self.acks = 0
        self.engine: ClientEngine | None = None

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.written += data

    def send(self, packet: Packet) -> None:
        self.written += encode(packet, self.client.protocol_level)

    def acknowledge(self, data: bytes) -> None:
        self.acks += 1
        self.written += data

    def take_over(self) -> None:
        assert self.engine is not None
        self.engine.take_over()


class Client:
    """One client's engine: packets in as bytes, what it was answered read back."""

    def __init__(self, broker: Services, level: int = V311) -> None:
        self.level = level
        self.shell = FakeShell()
        self.outlet = BytesOutlet()
        self.engine = self.outlet.engine = ClientEngine(
            broker, self.shell, self.outlet, broker.loop.time, LISTENER
        )
        self._decoder = Decoder("client", level)
        self._read = 0

    def send(self, *packets: Packet) -> None:
        self.engine.receive(b"".join(encode(p, self.level) for p in packets))

    def received(self) -> list[Packet]:
        self._decoder.receive_data(bytes(self.outlet.written[self._read :]))
        self._read = len(self.outlet.written)
        packets = []
        while (packet := self._decoder.next_packet()) is not None:
            packets.append(packet)
        return packets


class Verdicts:
    """A plugin whose auth_on_publish decides by the verdicts a test sets; `awaits`
    makes it a coroutine (a hook flow)."""

    def __init__(self, awaits: bool) -> None:
        self.refused: set[str] = set()
        if awaits:
            self.auth_on_publish = self._later  # type: ignore[method-assign]

    def auth_on_publish(self, context: Any) -> Ok | Error:
        return Error("refused") if context.topic in self.refused else Ok()

    async def _later(self, context: Any) -> Ok | Error:
        return Verdicts.auth_on_publish(self, context)


@dataclass
class Services:
    """broker.client.engine.ClientServices, made of the broker's real parts."""

    loop: FakeLoop
    settings: BrokerSettings
    metrics: Metrics
    chains: HookCallers
    ingress: Ingress
    registry: Registry
    handlers: PacketHandlers = HANDLERS
    terms: ConnectTerms = TERMS
    peers: ClientOwnership = ALONE


def make_broker(plugins: list[tuple[str, Any]] | None = None, **broker: Any) -> Services:
    config = config_from_dict({"store": {"backend": "memory"}, "broker": broker})
    settings, loop, metrics = config.broker, FakeLoop(), Metrics()
    store = open_store(config.store, loop)  # type: ignore[arg-type]
    router, chains = SubscriptionTrie(), HookCallers(Hooks(plugins or [], set()))
    flow = FlowControl(loop, settings.slow_subscriber_timeout, metrics)  # type: ignore[arg-type]
    routing = Routing(settings, router, RetainedMessages(), store, metrics, loop)
    ingress = Ingress(routing, flow, chains, store, metrics, [])
    new_session = session_factory(settings, metrics, store, chains, loop, flow, router.group)
    registry = Registry(new_session, routing, ingress, store, chains, loop)
    return Services(loop, settings, metrics, chains, ingress, registry)


def connected(broker: Services, client_id: str, level: int = V311, **connect: Any) -> Client:
    client = Client(broker, level)
    client.send(Connect(client_id, level, **connect))
    (connack,) = client.received()
    assert isinstance(connack, ConnAck) and connack.reason_code == 0
    return client


def run(flow: Coroutine[Any, Any, None]) -> None:
    """Run a hook flow that awaits nothing pending to its end."""
    with pytest.raises(StopIteration):
        flow.send(None)


def test_connect_is_answered_and_starts_the_keepalive_watch():
    broker = make_broker()
    client = Client(broker)
    client.send(Connect("engine", V311, keepalive=30))
    assert bytes(client.outlet.written) == b"\x20\x02\x00\x00"
    assert client.shell.keepalive == 30
    assert client.engine.session is client.outlet.session is broker.registry["engine"]


def test_a_packet_before_connect_closes_without_an_answer():
    client = Client(make_broker())
    client.send(Subscribe(1, [Subscription("a", 0)]))
    assert client.shell.closed and client.outlet.written == b""


def test_malformed_bytes_close_only_that_client_and_are_counted():
    broker = make_broker()
    good = connected(broker, "good")
    bad = Client(broker)
    bad.engine.receive(b"\x10\xff\xff\xff\xff\x7f")  # a remaining length past 4 bytes
    assert bad.shell.closed and not good.shell.closed
    assert broker.metrics.mqtt_protocol_error == 1


def test_packets_split_anywhere_are_handled_once_complete():
    client = connected(make_broker(), "split")
    data = encode(PingReq(), V311) * 3
    for byte in data:
        client.engine.receive(bytes([byte]))
    assert client.received() == [PingResp()] * 3


def test_a_qos1_publish_is_delivered_then_acknowledged_as_a_promise():
    broker = make_broker()
    sub = connected(broker, "sub")
    sub.send(Subscribe(1, [Subscription("t/#", 1)]))
    assert sub.received() == [SubAck(1, [1])]
    pub = connected(broker, "pub")
    pub.send(Publish("t/x", b"hello", 1, False, False, 7))
    (delivered,) = sub.received()
    assert isinstance(delivered, Publish)
    assert (delivered.topic, delivered.payload, delivered.qos) == ("t/x", b"hello", 1)
    assert pub.received() == [PubAck(7)]
    assert pub.outlet.acks == 1  # through acknowledge: the writer keeps it for the store


class Netsplit(Alone):
    """A node cut off from its cluster, with allow_publish_during_netsplit off."""

    split = True

    def refuses(self, action: str) -> str:  # type: ignore[override]
        return f"{action}: netsplit"


def test_a_publish_dropped_in_a_netsplit_still_sets_its_topic_alias():
    broker = make_broker()
    sub = connected(broker, "sub")
    sub.send(Subscribe(1, [Subscription("t", 0)]))
    assert sub.received() == [SubAck(1, [0])]
    pub = connected(broker, "pub", V5)
    broker.ingress.routing.peers = Netsplit()
    pub.send(Publish("t", b"dropped", 0, properties={Property.TOPIC_ALIAS: 1}))
    broker.ingress.routing.peers = ALONE  # the netsplit heals
    pub.send(Publish("", b"by alias", 0, properties={Property.TOPIC_ALIAS: 1}))
    assert pub.received() == []  # no protocol error: the alias was set
    assert [(p.topic, p.payload) for p in sub.received()] == [("t", b"by alias")]


def test_mqtt5_close_tells_the_client_why_before_the_socket_closes():
    client = connected(make_broker(), "five", V5)
    client.send(Publish("a/+", b"", 0))  # a wildcard in a topic name
    (disconnect,) = client.received()
    assert isinstance(disconnect, Disconnect) and disconnect.reason_code == 0x90
    assert client.shell.closed
    assert client.engine.client.disconnect_reason == "topic_name_invalid"


def test_flow_control_holds_reading_and_release_resumes_it_later():
    client = connected(make_broker(), "held")
    client.engine.hold()
    assert not client.shell.reading
    client.send(PingReq())  # buffered, not handled while held
    assert client.received() == []
    client.engine.release()
    assert client.shell.reading
    (resume,) = client.shell.soon
    resume()
    assert client.received() == [PingResp()]


def test_a_synchronous_plugin_decides_inline():
    verdicts = Verdicts(awaits=False)
    verdicts.refused.add("no")
    client = connected(make_broker([("verdicts", verdicts)]), "five", V5)
    client.send(Publish("no", b"", 1, packet_id=1), Publish("yes", b"", 1, packet_id=2))
    assert [(p.packet_id, p.reason_code) for p in client.received()] == [(1, 0x87), (2, 0)]
    assert client.shell.flows == []


def test_an_awaiting_plugin_holds_the_next_packets_until_its_flow_ends():
    verdicts = Verdicts(awaits=True)
    client = connected(make_broker([("verdicts", verdicts)]), "five", V5)
    client.send(Publish("a", b"", 1, packet_id=1), PingReq())
    (flow,) = client.shell.flows
    assert not client.shell.reading and client.received() == []
    run(flow)
    client.engine.flow_done(None)
    assert client.shell.reading
    # The second PUBLISH is decided by a flow of its own, after the first's answer.
    assert client.received() == [PubAck(1), PingResp()]


def test_a_lost_connection_cancels_the_decision_it_awaits():
    # Its verdict would be dropped; cancelled, work the plugin queued is never done.
    client = connected(make_broker([("verdicts", Verdicts(awaits=True))]), "five", V5)
    client.send(Publish("a", b"", 1, packet_id=1))
    (handle,) = client.shell.handles
    client.engine.lost()
    assert handle.cancelled
    client.shell.flows.pop().close()  # as the cancelled task would


def test_a_decision_that_has_ended_is_not_cancelled_by_a_later_close():
    client = connected(make_broker([("verdicts", Verdicts(awaits=True))]), "five", V5)
    client.send(Publish("a", b"", 1, packet_id=1))
    (flow,), (handle,) = client.shell.flows, client.shell.handles
    run(flow)
    client.engine.flow_done(None)
    client.engine.close()
    assert not handle.cancelled and client.shell.closed


def test_a_failing_hook_flow_closes_the_client_as_an_internal_error():
    client = connected(make_broker([("verdicts", Verdicts(awaits=True))]), "five", V5)
    client.send(Publish("a", b"", 1, packet_id=1))
    client.shell.flows.pop().close()
    client.engine.flow_done(RuntimeError("a bug"))
    (disconnect,) = client.received()
    assert isinstance(disconnect, Disconnect) and disconnect.reason_code == 0x83
    assert client.shell.closed


def test_max_message_rate_throttles_until_the_second_is_over():
    broker = make_broker(max_message_rate=2)
    client = connected(broker, "fast")
    client.send(*(Publish("t", b"%d" % i, 0) for i in range(3)), PingReq())
    assert not client.shell.reading
    assert broker.metrics.mqtt_publish_received == 2
    ((when, end_throttle),) = client.shell.later
    assert when == pytest.approx(broker.loop.time() + 1.0)
    broker.loop.now = when  # type: ignore[attr-defined]  # the FakeLoop's clock
    end_throttle()
    assert client.shell.reading
    assert broker.metrics.mqtt_publish_received == 3
    assert client.received() == [PingResp()]


def test_a_takeover_closes_the_old_client_and_hands_its_session_on():
    broker = make_broker()
    old = connected(broker, "same", V5)
    new = Client(broker, V5)
    new.send(Connect("same", V5))
    (disconnect,) = old.received()
    assert isinstance(disconnect, Disconnect) and disconnect.reason_code == 0x8E
    assert old.shell.closed and old.engine.session is None
    (connack,) = new.received()
    assert isinstance(connack, ConnAck) and connack.reason_code == 0


def test_a_long_read_is_handled_over_several_loop_turns():
    """One read of many packets is not handled in one callback: past TURN_BUDGET of work
    the engine stops reading, asks for the next turn, and goes on there, in order."""
    broker = make_broker()
    sub = connected(broker, "sub")
    sub.send(Subscribe(1, [Subscription("t", 0)]))
    sub.received()
    pub = connected(broker, "pub")
    now = [0.0]

    def ticking() -> float:  # every look at the clock finds 1 ms more work done
        now[0] += 0.001
        return now[0]

    pub.engine.clock = ticking
    # QoS 1: handled one by one (a QoS 0 flood to one topic would be one run)
    pub.send(*(Publish("t", str(i).encode(), 1, packet_id=i + 1) for i in range(100)))
    first = [p.payload for p in sub.received()]
    assert 0 < len(first) < 100  # the budget ran out on the way
    assert not pub.shell.reading and pub.engine.gate.holds(YIELDED)
    assert broker.metrics.client_turns_yielded == 1
    while pub.shell.soon:  # the next turns
        pub.shell.soon.pop(0)()
    rest = [p.payload for p in sub.received()]
    assert first + rest == [str(i).encode() for i in range(100)]
    assert pub.shell.reading and not pub.engine.gate.holds(YIELDED)


def _subscribed(broker: Services, client_id: str, topic: str, level: int = V311) -> Client:
    sub = connected(broker, client_id, level)
    sub.send(Subscribe(1, [Subscription(topic, 0)]))
    sub.received()
    sub.outlet.writes = 0
    return sub


def test_a_qos0_run_to_one_topic_goes_to_each_subscriber_in_one_write():
    """QoS 0 PUBLISHes to one topic read together are routed as one run: each subscriber
    gets the publisher's bytes in one write, counted as if they went one by one."""
    broker = make_broker()
    subs = [_subscribed(broker, f"sub{i}", "t") for i in range(3)]
    pub = connected(broker, "pub")
    published = [Publish("t", b"%d" % i) for i in range(10)]
    pub.send(*published, Publish("other", b"x"))
    for sub in subs:
        assert sub.received() == published
        assert sub.outlet.writes == 1
    metrics = broker.metrics
    assert (metrics.mqtt_publish_received, metrics.mqtt_publish_sent) == (11, 30)
    assert metrics.queue_message_out == 30 and metrics.router_matches_local == 30


def test_a_run_one_subscriber_cannot_take_as_published_goes_message_by_message():
    """An MQTT 5 subscriber of a 3.1.1 publisher needs its own encoding: the run is
    routed one message at a time, to everyone, in order."""
    broker = make_broker()
    old = _subscribed(broker, "old", "t")
    five = _subscribed(broker, "five", "t", V5)
    pub = connected(broker, "pub")
    published = [Publish("t", b"%d" % i) for i in range(10)]
    pub.send(*published)
    assert old.received() == five.received() == published
    assert old.outlet.writes == five.outlet.writes == 10


def test_a_run_held_by_flow_control_goes_on_in_order_once_released():
    """A subscriber that cannot take more holds the publisher in the middle of a run: the
    rest of the run waits in the decoder, and nothing is lost or reordered."""
    broker = make_broker(max_online_messages=8)  # the publisher waits at 4 queued
    sub = _subscribed(broker, "slow", "t")
    sub.outlet.writable = False  # its socket is full: deliveries queue
    pub = connected(broker, "pub")
    published = [Publish("t", b"%d" % i) for i in range(30)]
    pub.send(*published)
    assert not pub.shell.reading and sub.received() == []
    for _ in range(30):  # the subscriber reads; the publisher goes on as it drains
        sub.outlet.writable = True
        assert sub.engine.session is not None
        sub.engine.session.drain()
        while pub.shell.soon:
            pub.shell.soon.pop(0)()
    assert sub.received() == published
    assert broker.metrics.queue_message_drop == 0
