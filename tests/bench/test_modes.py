"""The benchmark's modes and targets without a broker: the paced mode of bench/scenarios.py,
which scenarios the Python generator declines, which cells `compare` measures (amqtt in
the bounded and latency-qos1 rows only), and the targets and headroom sections that
bench/report.py renders from a run's medians.
"""

from __future__ import annotations

import argparse
import asyncio

from bench import compare, report
from bench.brokers import BROKERS
from bench.scenarios import BY_NAME, NOT_MEASURED, Measurement, Settings, Target, in_modes, measure


def test_paced_mode_offers_the_scenarios_paced_rate():
    scenarios = in_modes([BY_NAME["fanout-1to100"], BY_NAME["latency-qos0"]], ["bounded", "paced"])

    assert [s.name for s in scenarios] == ["fanout-1to100", "fanout-1to100/paced", "latency-qos0"]
    paced = scenarios[1]
    assert (paced.mode, paced.rate, paced.fanout) == ("paced", 6_000, 100)
    assert paced.base == "fanout-1to100"


def test_every_throughput_scenario_has_a_paced_rate():
    for scenario in BY_NAME.values():
        assert (scenario.paced_rate > 0) == (scenario.kind == "throughput"), scenario.name


def test_the_python_generator_declines_what_only_mqttgen_measures():
    (paced,) = in_modes([BY_NAME["qos0-4pairs"]], ["paced"])
    nowhere = Target("127.0.0.1", 1)  # never connected to

    for scenario in (paced, BY_NAME["latency-qos0"], BY_NAME["latency-qos1-48k"]):
        result = asyncio.run(measure(scenario, nowhere, Settings()))
        assert result.error is not None and result.error.startswith(NOT_MEASURED)


def test_amqtt_is_measured_bounded_and_at_5k_latency_only():
    amqtt, nautilus = BROKERS["amqtt"], BROKERS["nautilus"]
    bounded, flood, paced = in_modes([BY_NAME["qos0-4pairs"]], ["bounded", "flood", "paced"])

    assert compare._measures(amqtt, bounded)
    assert compare._measures(amqtt, BY_NAME["latency-qos1"])
    assert compare._measures(amqtt, BY_NAME["idle-10k"])
    assert not compare._measures(amqtt, flood)
    assert not compare._measures(amqtt, paced)
    assert not compare._measures(amqtt, BY_NAME["latency-qos0"])
    assert compare._measures(nautilus, paced)


def test_the_estimate_counts_every_cell_and_the_headroom():
    args = compare.parse_args(["--generator", "python", "--modes", "bounded,flood"])
    assert args.modes == "bounded,flood"
    scenarios = in_modes([BY_NAME["qos0-4pairs"]], ["bounded", "flood"])
    brokers = [BROKERS["nautilus"], BROKERS["mosquitto"]]
    python = compare.estimate(args, scenarios, brokers)
    compiled = compare.estimate(
        argparse.Namespace(**{**vars(args), "generator": "c"}), scenarios, brokers
    )

    # 4 cells of ~warm-up + duration each, 3 repeats; with mqttgen 2 headroom cells more.
    cell = args.warmup + args.duration
    assert 12 * cell <= python < 12 * (cell + 2)
    assert compiled - python >= 6 * cell


def _run(results: dict[tuple[str, str], Measurement], headroom=None) -> report.Run:
    scenarios = [
        *in_modes([BY_NAME["qos1-4pairs"]], ["bounded", "flood", "paced"]),
        BY_NAME["latency-qos0"],
        BY_NAME["idle-10k"],
    ]
    return report.Run(
        command="python -m bench.compare",
        date="today",
        machine={},
        settings={},
        scenarios=scenarios,
        brokers=[BROKERS["nautilus"], BROKERS["mosquitto"]],
        results=results,
        generator="c",
        headroom=headroom or {},
        settle=0.5,
    )


def _m(delivered: float, **fields) -> Measurement:
    return Measurement(delivered=delivered, accepted=delivered, **fields)


def test_targets_check_each_row_with_its_figures():
    complete = {"lost": 0.0, "acked": 1_000_000.0, "drops": 0.0}
    results = {
        ("qos1-4pairs", "nautilus"): _m(200_000, lost=0.0, acked=800_000.0),
        ("qos1-4pairs", "mosquitto"): _m(140_000, lost=0.0, acked=600_000.0),
        ("qos1-4pairs/flood", "nautilus"): _m(230_000, **complete),
        ("qos1-4pairs/flood", "mosquitto"): _m(145_000, **complete),
        # Paced above what either delivers: Nautilus 1.4x Mosquitto, and it lost some.
        ("qos1-4pairs/paced", "nautilus"): _m(196_000, lost=2_000.0, acked=1_000_000.0, drops=0.0),
        ("qos1-4pairs/paced", "mosquitto"): _m(140_000, **complete),
        ("latency-qos0", "nautilus"): _m(100_000, p50_ms=0.1, p99_ms=0.3, p999_ms=2.0),
        ("latency-qos0", "mosquitto"): _m(100_000, p50_ms=0.3, p99_ms=1.0, p999_ms=2.0),
        ("idle-10k", "nautilus"): Measurement(kib_per_connection=3.5),
        ("idle-10k", "mosquitto"): Measurement(kib_per_connection=0.7),
    }
    page = report.render(_run(results))
    targets = page.split("## Targets")[1].split("\n## ")[0]
    rows = {
        (cells[1], cells[2]): cells[-2]
        for line in targets.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.split("|")])[1] != "Row"
    }

    flood, paced = (
        "QoS 1, 4 pairs, 100 in flight, 64 B, flood",
        "QoS 1, 4 pairs, 100 in flight, 64 B, paced",
    )
    assert rows[flood, "delivered >= 1.5x Mosquitto"] == "yes"
    assert rows[paced, "delivered >= 1.5x Mosquitto"] == "NO"
    assert rows[paced, "QoS 1: >= 99.9% of acked delivered, no queue drops"] == "NO"
    assert rows[flood, "flood >= 0.9x min(paced delivered, offered)"] == "yes"
    assert rows["QoS 0 latency, 4 pairs at 100k msg/s, 64 B", "p99 <= 2x Mosquitto's"] == "yes"
    assert rows["10k idle connections", "memory <= 2 KiB per connection"] == "NO"
    assert "5 of 8 met" in targets
    assert "99.80% (2,000 lost of 1,000,000), 0 drops" in targets
    assert "| p99.9 (ms) |" in page  # mqttgen reports it


def test_headroom_replaces_the_calibration_with_mqttgen():
    results = {
        ("qos1-4pairs/flood", "nautilus"): _m(230_000, loadgen_cpu=0.05),
        ("qos1-4pairs/flood", "mosquitto"): _m(145_000, loadgen_cpu=0.17),
    }
    headroom = {
        ("qos1-4pairs/flood", report.SINK): _m(7_000_000, loadgen_cpu=0.5),
        ("qos1-4pairs/flood", report.MOSQUITTO_2T): _m(144_000),
    }
    page = report.render(_run(results, headroom))

    assert "## Generator headroom" in page and "## Load generator capacity" not in page
    assert "| 7,000,000 | 0.50 | 145,000 | 144,000 | 0.99x | 48.3x | 0.17 | 0.05 |" in page
    assert "the generator was not the limit" in page
    assert "mqttgen (`bench/mqttgen.c`" in page  # the method names the generator
