"""`python -m bench.cluster_ops`: the leaderless cluster as operators run it.

    python -m bench.cluster_ops                        # both figures
    python -m bench.cluster_ops --only ready --repeats 5
    python -m bench.cluster_ops --only rolling --rate 1000

Figures:
- ready: three nodes (`metadata = "swc"`) started at the same moment from one config:
  `seeds` names all three, each node itself included. Seconds from the start until every
  node accepts a CONNECT (CONNACK 0), per repeat and their median.
- rolling: a rolling restart of three nodes (SIGTERM, start it again, wait until it
  accepts clients, the next) under a QoS 1 stream of --rate msg/s from one publisher to
  one persistent subscriber (paho-mqtt, MQTT 5, each going to another node when its
  node stops). How long the restart took; CONNECTs refused by nodes that were not
  restarting (a prober connects to each of them every 100 ms); clients disconnected by
  a node that was not restarting; messages acknowledged to the publisher and never
  delivered; duplicates delivered.

Nodes are real `python -m broker` processes on loopback (bench/cluster_procs.py's Node),
memory store for `ready`, LevelDB for `rolling` (the subscriber's session outlives its
node's restart only there). Every process is stopped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from .brokers import HOST, free_port
from .cluster_procs import NAMES, Node, NodeConfig

READY_TIMEOUT = 60.0
CONNECT_TIMEOUT = 2.0
PROBE_INTERVAL = 0.1
TOPIC = "bench/rolling"


def _nodes(config: NodeConfig, count: int = 3) -> list[Node]:
    """`count` swc nodes whose seeds name every node, itself included (one config)."""
    ports = [free_port() for _ in range(count)]
    return [Node(name, config, None, ports[i], ports) for i, name in enumerate(NAMES[:count])]


@contextlib.contextmanager
def _running(nodes: Sequence[Node]) -> Iterator[None]:
    try:
        yield
    finally:
        for node in nodes:
            node.close()


def _accepts(port: int, client_id: str) -> bool:
    """Whether the node at `port` answers a CONNECT with CONNACK 0 now."""
    result: list[bool] = []
    done = threading.Event()

    def on_connect(
        client: mqtt.Client, _u: object, _f: object, code: ReasonCode, _p: object
    ) -> None:
        result.append(not code.is_failure)
        done.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    client.on_connect = on_connect
    try:
        client.connect(HOST, port, keepalive=10)
    except OSError:
        return False
    client.loop_start()
    try:
        done.wait(CONNECT_TIMEOUT + 10)  # a node that is not ready holds a CONNECT 10 s
        return bool(result and result[0])
    finally:
        client.disconnect()
        client.loop_stop()


def _wait_accepting(node: Node, deadline: float) -> None:
    while time.monotonic() < deadline:
        node.scan()
        if node.port and _accepts(node.port, f"probe-{node.name}"):
            return
        time.sleep(0.05)
    raise RuntimeError(
        f"node {node.label} accepts no client after {READY_TIMEOUT:.0f} s:\n{node.log_tail()}"
    )


def measure_ready(repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        nodes = _nodes(NodeConfig(mode="flood", metadata="swc"))
        with _running(nodes):
            started = time.monotonic()
            for node in nodes:
                node.start()
            deadline = started + READY_TIMEOUT
            for node in nodes:
                _wait_accepting(node, deadline)
            times.append(time.monotonic() - started)
        print(f"ready: {times[-1]:.2f} s", flush=True)
    return times


@dataclass
class _Client:
    """A paho client that goes to the next node when its own stops."""

    client_id: str
    clean: bool
    ports: list[int]
    on_message: object = None
    connected_to: int = -1  # index into ports
    disconnected_by_others: int = 0  # by a node that was not restarting
    restarting: set[int] = field(default_factory=set)
    client: mqtt.Client | None = None
    up: threading.Event = field(default_factory=threading.Event)  # CONNACK 0 came
    answered: threading.Event = field(default_factory=threading.Event)  # any CONNACK

    def start(self) -> None:
        self._connect(0)

    def _connect(self, first: int) -> None:
        for index in itertools.islice(itertools.cycle(range(len(self.ports))), first, first + 30):
            if index in self.restarting:
                continue
            client = mqtt.Client(
                CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5
            )
            client.on_connect = self._on_connect
            client.on_disconnect = self._on_disconnect
            if self.on_message is not None:
                client.on_message = self.on_message  # type: ignore[assignment]
            properties = Properties(mqtt.PacketTypes.CONNECT)
            properties.SessionExpiryInterval = 0 if self.clean else 3600
            try:
                client.connect(
                    HOST,
                    self.ports[index],
                    keepalive=10,
                    clean_start=self.clean,
                    properties=properties,
                )
            except OSError:
                time.sleep(0.05)
                continue
            self.client, self.connected_to = client, index
            self.answered.clear()
            client.loop_start()
            # A node that is not ready holds a CONNECT up to 10 s before refusing it.
            if self.answered.wait(CONNECT_TIMEOUT + 10) and self.up.is_set():
                return
            client.loop_stop()
        raise RuntimeError(f"{self.client_id}: no node accepts it")

    def _on_connect(
        self, client: mqtt.Client, _u: object, _f: object, code: ReasonCode, _p: object
    ) -> None:
        self.answered.set()
        if not code.is_failure:
            if not self.clean:
                client.subscribe(TOPIC, qos=1)
            self.up.set()

    def _on_disconnect(
        self, client: mqtt.Client, _u: object, _f: object, code: ReasonCode, _p: object
    ) -> None:
        if client is not self.client:
            return
        self.up.clear()
        if self.connected_to not in self.restarting:
            self.disconnected_by_others += 1
        nxt = self.connected_to + 1
        threading.Thread(target=self._reconnect, args=(client, nxt), daemon=True).start()

    def _reconnect(self, old: mqtt.Client, first: int) -> None:
        old.loop_stop()
        self._connect(first)


def measure_rolling(rate: int) -> dict[str, float]:
    nodes = _nodes(NodeConfig(mode="flood", store="leveldb", metadata="swc"))
    with _running(nodes):
        for node in nodes:
            node.start()
        deadline = time.monotonic() + READY_TIMEOUT
        for node in nodes:
            _wait_accepting(node, deadline)
        ports = [node.port for node in nodes]
        received: list[int] = []
        restarting: set[int] = set()

        def on_message(_c: mqtt.Client, _u: object, message: mqtt.MQTTMessage) -> None:
            received.append(int(message.payload))

        subscriber = _Client("rolling-sub", False, ports, on_message, restarting=restarting)
        subscriber.start()
        publisher = _Client("rolling-pub", True, ports, restarting=restarting)
        publisher.start()
        acked: set[int] = set()
        pending: dict[int, int] = {}  # paho mid -> number
        lock = threading.Lock()

        def on_publish(_c: mqtt.Client, _u: object, mid: int, _r: object, _p: object) -> None:
            with lock:
                number = pending.pop(mid, None)
            if number is not None:
                acked.add(number)

        refused = 0
        stop = threading.Event()

        def stream() -> None:
            number = 0
            interval = 1 / rate
            next_at = time.monotonic()
            while not stop.is_set():
                client = publisher.client
                if publisher.up.is_set() and client is not None:
                    client.on_publish = on_publish
                    info = client.publish(TOPIC, str(number).encode(), qos=1)
                    if info.rc == mqtt.MQTT_ERR_SUCCESS:
                        with lock:
                            pending[info.mid] = number
                        number += 1
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))

        restarts = [0] * len(nodes)  # per node: stops and starts so far

        def probe() -> None:
            nonlocal refused
            while not stop.is_set():
                for index, port in enumerate(ports):
                    before = restarts[index]
                    if index in restarting or _accepts(port, f"prober-{index}"):
                        continue
                    # Refused by a node that was not restarting at any time during the probe.
                    if restarts[index] == before and index not in restarting:
                        refused += 1
                stop.wait(PROBE_INTERVAL)

        threads = [
            threading.Thread(target=stream, daemon=True),
            threading.Thread(target=probe, daemon=True),
        ]
        for thread in threads:
            thread.start()
        time.sleep(2)  # a steady stream before the first stop
        started = time.monotonic()
        for index, node in enumerate(nodes):
            restarting.add(index)
            restarts[index] += 1
            assert node.proc is not None
            node.proc.terminate()
            node.proc.wait(30)
            node.start()
            _wait_accepting(node, time.monotonic() + READY_TIMEOUT)
            ports[index] = node.port
            restarting.discard(index)
            restarts[index] += 1
        took = time.monotonic() - started
        time.sleep(2)
        stop.set()
        for thread in threads:
            thread.join(15)
        time.sleep(3)  # the last deliveries
        got = set(received)
        return {
            "seconds": took,
            "acked": len(acked),
            "lost": len(acked - got),
            "duplicates": len(received) - len(got),
            "refused_by_others": refused,
            "disconnected_by_others": subscriber.disconnected_by_others
            + publisher.disconnected_by_others,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster_ops", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--only", default="ready,rolling", help="ready, rolling (comma-separated)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=int, default=1000, help="rolling: QoS 1 msg/s")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if "ready" in only:
        times = measure_ready(args.repeats)
        runs = ", ".join(f"{t:.2f}" for t in times)
        median = statistics.median(times)
        print(f"| 3 nodes started together, until each accepts | {median:.2f} s | {runs} |")
    if "rolling" in only:
        for _ in range(args.repeats):
            result = measure_rolling(args.rate)
            print(
                "| rolling restart | " + " | ".join(f"{k} {v:g}" for k, v in result.items()) + " |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
