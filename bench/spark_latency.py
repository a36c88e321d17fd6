"""`python -m bench.spark_latency [--samples N] [--trigger '0 seconds'] [--read-on driver]`:
the time from a PUBLISH to its analytics result on an MQTT topic.

A broker process with the relay on; a `topic-traffic` query (`nautilus_events` source,
MQTT sink back into the same broker, local[2]) running with a processing-time trigger;
a paho client, in a process of its own (in the driver's process, Spark's callback
threads hold the GIL and delayed its PUBLISHes by up to 40 ms), that subscribes to
`$analytics/topic_traffic/lat/#`, then publishes one message at a time to a new topic
`lat/<i>` and waits for the retained result of that topic. Before each PUBLISH it waits
a random 0-`--spread` ms, so that PUBLISHes land anywhere in Spark's micro-batch cycle,
as a user's do (one sent as soon as the last result came would always land at the same
point of it). Reported: median and worst of the samples, after a few warm-up ones.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from spark_consumers import jobs
from spark_consumers.session import local_session
from spark_consumers.sinks import writer

from .brokers import HOST, BrokerSpec, RunningBroker, free_port

WARMUP = 3
RESULT_TIMEOUT = 60.0  # seconds a result may take before the run is called failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_latency")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--trigger", default="0 seconds", help="the query's processing time")
    parser.add_argument(
        "--read-on", default="driver", choices=["driver", "executors"], help="the readOn option"
    )
    parser.add_argument(
        "--spread", type=float, default=300.0, help="ms: a PUBLISH waits a random 0..spread"
    )
    parser.add_argument(
        "--progress", action="store_true", help="print Spark's account of the batches (stderr)"
    )
    args = parser.parse_args(argv)
    relay_port = free_port()

    def command(workdir: Path, port: int) -> list[str]:
        config = workdir / "nautilus.toml"
        config.write_text(
            f'[[listeners]]\naddress = "{HOST}:{port}"\n[store]\nbackend = "memory"\n'
            f'[event_relay]\nenabled = true\naddress = "{HOST}:{relay_port}"\n'
            'hooks = ["on_publish"]\n'
        )
        return [sys.executable, "-m", "broker", "--config", str(config)]

    spec = BrokerSpec("nautilus-relay", "Nautilus, relay on", command, lambda: "-")
    with RunningBroker(spec) as broker, tempfile.TemporaryDirectory() as work:
        # The relay listens before MQTT does (plugins start first): MQTT up, relay up.
        latencies = measure(args, broker.target.port, relay_port, f"{work}/checkpoint")
    kept = latencies[WARMUP:]
    print(
        f"{len(kept)} samples, trigger {args.trigger!r}, readOn {args.read_on}: median "
        f"{statistics.median(kept) * 1000:.0f} ms, worst {max(kept) * 1000:.0f} ms"
    )
    return 0


def measure(
    args: argparse.Namespace, mqtt_port: int, relay_port: int, checkpoint: str
) -> list[float]:
    spark = local_session("local[2]")
    events = (
        spark.readStream.format("nautilus_events")
        .option("relay", f"{HOST}:{relay_port}")
        .option("startingOffsets", "earliest")  # a fresh broker: all its events are ours
        .options(**jobs.SOURCE_OPTIONS["topic-traffic"])  # as nautilus-spark reads it
        .option("readOn", args.read_on)
        .load()
    )
    query = (
        writer(
            jobs.topic_traffic(events, window="1 day"), f"mqtt:{HOST}:{mqtt_port}", "topic_traffic"
        )
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=args.trigger)
        .start()
    )
    context = multiprocessing.get_context("spawn")  # not a fork of a process with a JVM's threads
    results = context.Queue()
    client = context.Process(
        target=publish_and_wait,
        args=(mqtt_port, WARMUP + args.samples, args.spread / 1000, results),
    )
    client.start()
    try:
        outcome = results.get(timeout=RESULT_TIMEOUT * (WARMUP + args.samples))
        if isinstance(outcome, str):
            raise RuntimeError(f"{outcome}; the query: {query.exception() or query.status}")
        latencies: list[float] = outcome
    finally:
        client.join(10)
        if args.progress:
            progress_report(query.recentProgress)
        query.stop()
        spark.stop()
    return latencies


def publish_and_wait(port: int, samples: int, spread: float, results: Any) -> None:
    """The measuring client (its own process): `samples` latencies, or what went wrong."""
    import queue

    import paho.mqtt.client as mqtt

    arrived: queue.Queue[tuple[str, float]] = queue.Queue()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.on_message = lambda _c, _u, message: arrived.put((message.topic, time.perf_counter()))
    client.connect(HOST, port)
    client.loop_start()
    client.subscribe("$analytics/topic_traffic/lat/#", 1)
    latencies = []
    try:
        for i in range(samples):
            time.sleep(random.uniform(0, spread))
            sent = time.perf_counter()
            client.publish(f"lat/{i}", b"x", qos=1).wait_for_publish(10)
            expected = f"$analytics/topic_traffic/lat/{i}"
            while True:
                try:
                    topic, when = arrived.get(timeout=RESULT_TIMEOUT)
                except queue.Empty:
                    results.put(f"no result for lat/{i} in {RESULT_TIMEOUT:.0f} s")
                    return
                if topic == expected:
                    latencies.append(when - sent)
                    break
        results.put(latencies)
    finally:
        client.disconnect()
        client.loop_stop()


def progress_report(progress: list[Any]) -> None:
    """Spark's account of the batches that read something: the median of each phase."""
    phases = ["latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets"]
    read = [report for report in progress if report.numInputRows][-20:]
    if read:
        medians = {
            phase: statistics.median(report.durationMs.get(phase, 0) for report in read)
            for phase in [*phases, "triggerExecution"]
        }
        print(f"{len(read)} batches, medians (ms): {medians}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
