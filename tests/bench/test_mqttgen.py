"""bench/mqttgen.c, the compiled load generator, through its wrapper bench/cgen.py.

Against its own sink (the generator's ceiling) and against a real Nautilus (the in-process
broker of tests/conftest.py): QoS 0 and QoS 1 floods count deliveries and latencies, a
QoS 1 flood loses nothing Nautilus acknowledged, a paced load keeps its rate, the
bounded mode (--backlog) keeps what is owed under its bound with one thread and with
two, and a refused connection fails with its reason. Skipped where there is no C
compiler to build the binary (`make bench/bin/mqttgen`), which `make test` does not need
otherwise.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench import cgen
from bench.drops import SysCounter
from bench.scenarios import BY_NAME, Scenario, Settings, Target, in_modes

# Short runs: the file stays under 30 s on 2 cores.
WARMUP, DURATION, SETTLE = 0.3, 1.0, 0.3


@pytest.fixture(scope="module")
def mqttgen() -> Path:
    if shutil.which("cc") is None and not cgen.BINARY.exists():
        pytest.skip("no C compiler (cc) to build bench/bin/mqttgen")
    return cgen.path()  # a failed build with a compiler at hand fails the test


def load(**fields: Any) -> cgen.Load:
    fields.setdefault("warmup", WARMUP)
    fields.setdefault("duration", DURATION)
    fields.setdefault("settle", SETTLE)
    return cgen.Load(**fields)


def against_sink(work: cgen.Load) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with cgen.sink() as port:
            return await cgen.run("127.0.0.1", port, work)

    return asyncio.run(go())


def test_qos0_pairs_against_the_sink(mqttgen):
    result = against_sink(load(publishers=4, subscribers=4, qos=0))

    assert result["delivered"] > 0
    assert result["accepted"] > 0
    assert result["p50_ms"] is not None and result["p50_ms"] <= result["p99_ms"]
    assert result["max_ms"] >= result["p999_ms"]
    assert result["lost"] is None  # counted at QoS 1 only
    assert result["connections"] == 8


@pytest.mark.parametrize("threads", [1, 2])
def test_qos1_pairs_against_the_sink_lose_nothing(mqttgen, threads):
    result = against_sink(load(publishers=4, subscribers=4, qos=1, threads=threads))

    assert result["delivered"] > 0
    assert result["lost"] == 0
    assert result["p50_ms"] is not None and result["p99_ms"] is not None
    assert result["threads"] == threads


def test_qos1_shared_group_gets_each_message_once(mqttgen):
    result = against_sink(load(publishers=2, subscribers=3, topology="shared", qos=1))

    assert result["lost"] == 0
    assert result["delivered"] == pytest.approx(result["accepted"], rel=0.05)


def test_paced_load_keeps_its_rate(mqttgen):
    result = against_sink(load(publishers=2, subscribers=2, qos=1, mode="paced", rate=2000))

    assert result["delivered_per_s"] == pytest.approx(2000, rel=0.10)
    assert result["published_per_s"] == pytest.approx(2000, rel=0.10)
    assert result["lost"] == 0


def test_qos1_flood_of_nautilus_loses_nothing_acknowledged(mqttgen, start_broker):
    server = start_broker(broker={"max_inflight_messages": 100, "max_online_messages": 1000})
    work = load(publishers=4, subscribers=4, qos=1, warmup=0.5)

    result = asyncio.run(cgen.run(server.host, server.port, work))

    assert result["accepted"] > 0
    assert result["lost"] == 0
    # What the broker holds between the two (in flight and queued, per subscriber) is
    # bounded, so over a second what it delivered and what it acked are close.
    assert result["delivered"] == pytest.approx(result["accepted"], rel=0.15)


def test_measure_reads_the_drop_counter_at_the_events(mqttgen, start_broker):
    server = start_broker(broker={"max_inflight_messages": 100, "systree_interval": 1})
    node = server.config.broker.node_name
    target = Target(
        server.host, server.port, drops=SysCounter(f"$SYS/{node}/queue/message/drop", 1.0)
    )
    scenario = Scenario("paced", "QoS 0 paced", "throughput", 2, 2, mode="paced", rate=2000)

    result = asyncio.run(cgen.measure(scenario, target, Settings(warmup=WARMUP, duration=1.0)))

    assert result.error is None
    assert result.delivered == pytest.approx(2000, rel=0.10)
    assert result.drops == 0
    assert result.p50_ms is not None
    assert result.loadgen_cpu is not None and result.loadgen_cpu < 1.0
    assert result.lost is None  # QoS 0


def test_a_refused_connect_fails_with_its_reason(mqttgen, start_broker):
    server = start_broker(broker={"allow_anonymous": False})

    with pytest.raises(cgen.GeneratorError, match="CONNACK refused: not authorized"):
        asyncio.run(cgen.run(server.host, server.port, load(publishers=1, subscribers=1)))


def test_read_mark_stays_below_a_small_broker_window(mqttgen, start_broker):
    # 20 in flight per subscriber (Nautilus's default) against publishers keeping 100:
    # subscribers that waited for more bytes than the broker sends unacked would stall.
    server = start_broker(broker={"max_inflight_messages": 20})
    target = Target(server.host, server.port, inflight=20)
    scenario = Scenario("q1", "QoS 1 flood", "throughput", 2, 2, qos=1, mode="flood")
    settings = Settings(warmup=WARMUP, duration=DURATION, settle=SETTLE)

    result = asyncio.run(cgen.measure(scenario, target, settings))

    assert result.delivered is not None and result.delivered > 1000
    assert result.lost == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_bounded_flood_owes_at_most_its_backlog(mqttgen, threads):
    # QoS 0 publishers write batches of at most a quarter of their share of the bound,
    # each after checking it: owed stays under the bound plus a batch per thread, where
    # the same flood unbounded runs far ahead of the sink's deliveries.
    backlog = 500
    pairs = {"publishers": 4, "subscribers": 4, "threads": threads, "duration": 0.5}
    bounded = against_sink(load(**pairs, backlog=backlog))
    flood = against_sink(load(**pairs))

    assert bounded["delivered"] > 0
    assert bounded["owed"] <= backlog + threads * backlog // 4
    assert flood["owed"] > 4 * backlog


def test_bounded_fanout_counts_every_subscriber(mqttgen):
    # Owed is PUBLISHes x 20 subscribers: a bound of 400 lets ~20 messages ahead.
    result = against_sink(
        load(publishers=1, subscribers=20, topology="fanout", backlog=400, settle=0)
    )

    assert result["delivered"] == pytest.approx(20 * result["published"], rel=0.02)
    assert result["owed"] <= 400 + 20 * 5  # a batch of 400 / (4 x 20) PUBLISHes


def test_bounded_qos1_of_nautilus_waits_on_top_of_the_window(mqttgen, start_broker):
    server = start_broker(broker={"max_inflight_messages": 100})
    (scenario,) = in_modes([BY_NAME["qos1-4pairs"]], ["bounded"])
    settings = Settings(warmup=WARMUP, duration=DURATION, backlog=200, settle=SETTLE)
    work = cgen.load_of(scenario, settings, threads=2, inflight=100)
    assert (work.mode, work.backlog) == ("flood", 200)

    result = asyncio.run(cgen.run(server.host, server.port, work))

    assert result["delivered"] > 1000
    assert result["lost"] == 0
    assert result["acked_total"] >= result["accepted"]
    # 4 publishers x 100 in flight would owe up to 400; the bound holds them to 200 (plus
    # a PUBLISH per thread that passed its check at the same moment).
    assert result["owed"] <= 200 + 2


def test_paced_throughput_reads_in_bulk_and_keeps_its_rate(mqttgen):
    (scenario,) = in_modes([replace(BY_NAME["qos1-4pairs"], paced_rate=20_000)], ["paced"])
    settings = Settings(warmup=WARMUP, duration=DURATION, settle=SETTLE)
    work = cgen.load_of(scenario, settings, inflight=100)
    assert (work.mode, work.rate, work.bulk_reads) == ("paced", 20_000, True)
    assert work.read_low_water is not None and work.read_low_water > 1
    latency = cgen.load_of(BY_NAME["latency-qos1-48k"], settings)
    assert (latency.mode, latency.rate, latency.bulk_reads) == ("paced", 48_000, False)

    result = against_sink(work)

    assert result["delivered_per_s"] == pytest.approx(20_000, rel=0.10)
    assert result["lost"] == 0
