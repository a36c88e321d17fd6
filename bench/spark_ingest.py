"""`python -m bench.spark_ingest [--events N] [--runs R]`: events per second from a relay
into a Spark aggregation, in local mode.

A relay alone (bench/relay/logserver.py: its log filled with N events as the broker
makes them, on_publish and on_deliver in turn) is read from the earliest event by an
`availableNow` query of the `nautilus_events` source into the `topic-traffic` job (a
one-day window, so the aggregation is the same whatever the clock) and a memory sink, on
`local[2]`. Each run is a new query on a new checkpoint in the same session: the first
pays Spark's cold start (its first streaming query), the later ones show the steady rate.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from spark_consumers import jobs
from spark_consumers.session import local_session

from .brokers import HOST, BrokerSpec, RunningBroker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_ingest")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--read-on", default="executors", choices=["executors", "driver"], help="readOn option"
    )
    args = parser.parse_args(argv)
    relay = BrokerSpec(
        "relay-log",
        "relay log server",
        lambda workdir, port: [
            *(sys.executable, "-m", "bench.relay.logserver"),
            *("--port", str(port), "--events", str(args.events)),
        ],
        lambda: "-",
    )
    with RunningBroker(relay) as server, tempfile.TemporaryDirectory() as work:
        spark = local_session("local[2]")
        for run in range(args.runs):
            started = time.perf_counter()
            events = (
                spark.readStream.format("nautilus_events")
                .option("relay", f"{HOST}:{server.target.port}")
                .option("eventsPerPartition", "100000")
                .options(**jobs.SOURCE_OPTIONS["topic-traffic"])  # as nautilus-spark does
                .option("readOn", args.read_on)
                .load()
            )
            query = (
                jobs.topic_traffic(events, window="1 day")
                .writeStream.format("memory")
                .queryName(f"run{run}")
                .outputMode("complete")
                .option("checkpointLocation", f"{work}/checkpoint{run}")
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            seconds = time.perf_counter() - started
            counted = sum(row.messages for row in spark.table(f"run{run}").collect())
            print(
                f"run {run + 1}: {args.events:,} events in {seconds:.1f} s = "
                f"{args.events / seconds:,.0f} events/s ({counted:,} publishes counted)"
            )
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
