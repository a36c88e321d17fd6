"""`python -m bench.spark_latency [--samples N] [--trigger '0 seconds']`: the time from a
PUBLISH to its analytics result on an MQTT topic.

A broker process with the relay on; a `topic-traffic` query (`nautilus_events` source,
MQTT sink back into the same broker, local[2]) running with a processing-time trigger;
a paho client that subscribes to `$analytics/topic_traffic/lat/#`, then publishes one
message at a time to a new topic `lat/<i>` and waits for the retained result of that
topic. Reported: median and worst of the samples, after a few warm-up ones.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

import paho.mqtt.client as mqtt

from spark_consumers import jobs
from spark_consumers.session import local_session
from spark_consumers.sinks import writer

from .brokers import HOST, BrokerSpec, RunningBroker, free_port

WARMUP = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_latency")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--trigger", default="0 seconds", help="the query's processing time")
    parser.add_argument(
        "--progress", action="store_true", help="print the last batches' durations (stderr)"
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
        f"{len(kept)} samples, trigger {args.trigger!r}: median "
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
    arrived: queue.Queue[tuple[str, float]] = queue.Queue()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.on_message = lambda _c, _u, message: arrived.put((message.topic, time.perf_counter()))
    client.connect(HOST, mqtt_port)
    client.loop_start()
    client.subscribe("$analytics/topic_traffic/lat/#", 1)
    latencies = []
    try:
        for i in range(WARMUP + args.samples):
            sent = time.perf_counter()
            client.publish(f"lat/{i}", b"x", qos=1).wait_for_publish(10)
            expected = f"$analytics/topic_traffic/lat/{i}"
            while True:
                try:
                    topic, when = arrived.get(timeout=60)
                except queue.Empty:
                    state = query.exception() or query.status
                    raise RuntimeError(f"no result in 60 s; the query: {state}") from None
                if topic == expected:
                    latencies.append(when - sent)
                    break
    finally:
        client.disconnect()
        client.loop_stop()
        if args.progress:  # where a micro-batch's time goes (Spark's own account)
            for report in query.recentProgress[-5:]:
                print(report.batchId, report.numInputRows, report.durationMs, file=sys.stderr)
        query.stop()
        spark.stop()
    return latencies


if __name__ == "__main__":
    sys.exit(main())
