"""`nautilus-spark`: run a built-in job, or a streaming SQL query, over a relay.

    nautilus-spark JOB --relay HOST:PORT --checkpoint DIR
                   --sink console|parquet:DIR|mqtt://[USER@]HOST[:PORT]|mqtts://...
                   [--prefix $analytics] [--window '10 seconds'] [--watermark '30 seconds']
                   [--trigger available-now|'10 seconds'] [--read-on auto|driver|executors]
                   [--sink-password-file FILE] [--sink-cafile FILE] [--sink-certfile FILE]
                   [--sink-keyfile FILE] [--sink-client-id ID] [--sink-timeout SECONDS]
    nautilus-spark sql "SELECT ... FROM events ..." [the same options]
    relay TLS and secret: [--relay-tls] [--relay-cafile FILE] [--relay-certfile FILE
                   [--relay-keyfile FILE]] [--relay-secret-file FILE]

JOB is topic-traffic, client-activity, auth-failures or delivery-health (docs/spark.md).
In `sql`, the events are the streaming view `events`, with the watermark set; `--window`
is the query's `:window` parameter. Runs on `local[*]`, or `--master`; run by
spark-submit (`spark-submit .../spark_consumers/cli.py JOB ...`), on the cluster
spark-submit was given. An available-now run ends with one line on stderr: what it read,
what it wrote, and the windows still open. `--read-on auto` reads the relay on the driver
for a trigger under a second (small batches, low latency) and on executors otherwise
(throughput): the source's `readOn` option, docs/spark.md "Latency". The relay's secret
comes from --relay-secret-file, else $NAUTILUS_RELAY_SECRET; the TLS options are the
source's `tls`, `cafile`, `certfile` and `keyfile` (their files at the same path on every
executor).

A query stopped by something its user must fix (the MQTT sink refused or its broker away
too long, the relay refusing or gone, events no longer retained) ends with one line on
stderr saying what, and exit status 1; Spark's own report of it, a stack of Java and
Python tracebacks, is kept off stderr. Any other failure is raised as Spark raised it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from event_relay.cli import relay_arguments, relay_secret, relay_tls
from event_relay.client import RelayError
from spark_consumers.errors import QueryFailed, SinkError, one_line, qualified
from spark_consumers.jobs import JOBS, SOURCE_OPTIONS, WATERMARK, WINDOW, watermarked
from spark_consumers.mqtt_sink import PASSWORD_ENV, SINK_TIMEOUT, MqttOptions
from spark_consumers.session import JavaMissing, local_session, submitted, submitted_session
from spark_consumers.sinks import PREFIX, RowCount, writer
from spark_consumers.source import EventsGone
from spark_consumers.summary import seconds, summary

PROGRESS_KEPT = 1_000_000  # progress reports an available-now run keeps (one per batch)
DRIVER_TRIGGERS = 1.0  # --read-on auto: triggers shorter than this (seconds) read on the driver
# The failures reported in one line (a traceback's `module.Class`), wherever in Spark
# they were raised; each message says what failed (a RelayError names the relay).
ONE_LINE = frozenset(qualified(kind) for kind in (QueryFailed, RelayError, EventsGone))
# Spark's loggers whose ERRORs repeat the failure main() reports: the query's end and its
# sink's abort; in a local session, where a failed task fails the query (no retries),
# also the task's.
QUERY_LOGGERS: tuple[str, ...] = (
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
    "org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec",
)
LOCAL_TASK_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nautilus-spark", description="Spark Structured Streaming over a Nautilus relay."
    )
    parser.add_argument("job", choices=[*JOBS, "sql"], help="a built-in job, or sql")
    parser.add_argument("query", nargs="?", help="with sql: the query over the view `events`")
    parser.add_argument("--relay", default="127.0.0.1:7883", metavar="HOST:PORT")
    parser.add_argument(
        "--sink",
        default="console",
        help="console, parquet:DIR, mqtt://[USER@]HOST[:PORT], mqtts://[USER@]HOST[:PORT]",
    )
    parser.add_argument(
        "--prefix", default=PREFIX, help=f"mqtt sink: the topics' first levels ({PREFIX})"
    )
    parser.add_argument("--checkpoint", required=True, metavar="DIR")
    parser.add_argument(
        "--trigger", default="10 seconds", help="available-now, or an interval ('10 seconds')"
    )
    parser.add_argument(
        "--master", help="a local Spark master (default local[*]; under spark-submit: its own)"
    )
    parser.add_argument("--starting-offsets", default="earliest", help="for a new query")
    parser.add_argument(
        "--window", default=WINDOW, metavar="DURATION", help=f"tumbling windows ({WINDOW!r})"
    )
    parser.add_argument(
        "--watermark",
        default=WATERMARK,
        metavar="DURATION",
        help=f"how late an event may come ({WATERMARK!r}); a window closes this long after its end",
    )
    parser.add_argument(
        "--read-on",
        default="auto",
        choices=["auto", "driver", "executors"],
        help="where the relay is read (auto: the driver for a trigger under 1 s)",
    )
    relay_arguments(parser)
    add_mqtt_sink_options(parser)
    args = parser.parse_args(argv)
    if args.job == "sql" and not args.query:
        parser.error('sql needs a query, e.g. "SELECT topic, count(*) FROM events GROUP BY topic"')
    return args


def relay_options(args: argparse.Namespace) -> dict[str, str]:
    """The source's options for the relay's TLS and secret (a file that will not load is
    a ValueError naming its option)."""
    options = {}
    if relay_tls(args) is not None:  # (made here to check the files, before Spark starts)
        options["tls"] = "true"
        files = [
            ("cafile", args.relay_cafile),
            ("certfile", args.relay_certfile),
            ("keyfile", args.relay_keyfile),
        ]
        options |= {key: os.path.abspath(path) for key, path in files if path}
    secret = relay_secret(args)
    if secret is not None:
        options["secret"] = secret
    return options


def add_mqtt_sink_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "MQTT sink", "how --sink mqtt://USER@HOST:PORT or mqtts://... logs in (docs/spark.md)"
    )
    group.add_argument(
        "--sink-password-file",
        metavar="FILE",
        help=f"the user's password (a JWT for auth_jwt); else ${PASSWORD_ENV}",
    )
    group.add_argument(
        "--sink-cafile", metavar="FILE", help="mqtts: the broker's CAs (default: the system's)"
    )
    group.add_argument("--sink-certfile", metavar="FILE", help="mqtts: a client certificate")
    group.add_argument("--sink-keyfile", metavar="FILE", help="its key, if not in the certfile")
    group.add_argument(
        "--sink-client-id", metavar="ID", help="default nautilus-spark-JOB-<checkpoint's hash>"
    )
    group.add_argument(
        "--sink-timeout",
        type=float,
        default=SINK_TIMEOUT,
        metavar="SECONDS",
        help=f"how long the broker may be away before a batch fails ({SINK_TIMEOUT:g})",
    )


def mqtt_options(args: argparse.Namespace) -> MqttOptions:
    return MqttOptions(
        password_file=args.sink_password_file,
        cafile=args.sink_cafile,
        certfile=args.sink_certfile,
        keyfile=args.sink_keyfile,
        client_id=args.sink_client_id,
        timeout=args.sink_timeout,
    )


def results(
    spark: SparkSession, args: argparse.Namespace, relay: dict[str, str] | None = None
) -> DataFrame:
    """The job's (or query's) rows; `relay`: the source's options for the relay's TLS
    and secret (relay_options)."""
    reader = (
        spark.readStream.format("nautilus_events")
        .option("relay", args.relay)
        .option("startingOffsets", args.starting_offsets)
        .option("readOn", read_on(args.read_on, args.trigger))
        .options(**(relay or {}))
    )
    if args.job != "sql":  # only the types and columns the job reads (sql: all)
        reader = reader.options(**SOURCE_OPTIONS[args.job])
    events = reader.load()
    if args.job == "sql":
        watermarked(events, args.watermark).createOrReplaceTempView("events")
        if _window_of(args) is not None:  # the query's `:window` is --window
            return spark.sql(args.query, args={"window": args.window})
        return spark.sql(args.query)
    job: Callable[..., DataFrame] = JOBS[args.job]
    return job(events, window=args.window, watermark=args.watermark)


def read_on(choice: str, trigger: str) -> str:
    """The source's readOn: `auto` is the driver for a processing-time trigger shorter
    than DRIVER_TRIGGERS (each micro-batch then skips a Python task, about 70 ms), the
    executors for longer ones and available-now (their parallel reads go 2.5x faster)."""
    if choice != "auto":
        return choice
    interval = None if trigger == "available-now" else seconds(trigger)
    return "driver" if interval is not None and interval < DRIVER_TRIGGERS else "executors"


def _window_of(args: argparse.Namespace) -> str | None:
    """The window the results use: a job's --window; a SQL query's only when it names
    `:window` (named parameters are bound only when used)."""
    return None if args.job == "sql" and ":window" not in args.query else args.window


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        relay = relay_options(args)
    except ValueError as exc:
        print(f"nautilus-spark: {exc}", file=sys.stderr)
        return 2
    try:
        if args.master is None and submitted():
            spark = submitted_session()
        else:
            spark = local_session(args.master or "local[*]")
    except JavaMissing as exc:
        print(f"nautilus-spark: {exc}", file=sys.stderr)
        return 1
    name = args.job.replace("-", "_")
    count = RowCount(args.sink)
    try:
        stream = writer(
            results(spark, args, relay),
            args.sink,
            name,
            args.prefix,
            count,
            mqtt=mqtt_options(args),
            checkpoint=args.checkpoint,
        )
    except SinkError as exc:
        print(f"nautilus-spark: {exc}", file=sys.stderr)
        return 2
    once = args.trigger == "available-now"
    if once:
        # Every batch's report, for the summary line (Spark keeps the last 100 by default).
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(PROGRESS_KEPT))
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=args.trigger)
    quiet_query_end(spark)
    query = stream.start()
    try:
        query.awaitTermination()
        if once:
            progress = [json.loads(p.json) for p in query.recentProgress]
            written = {args.sink: count.rows(progress)}
            print(summary(progress, written, _window_of(args), args.watermark), file=sys.stderr)
    except StreamingQueryException as exc:
        line = one_line(str(exc), ONE_LINE)
        if line is None:
            raise
        print(f"nautilus-spark: {line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()
    return 0


def quiet_query_end(spark: SparkSession) -> None:
    """Keep Spark's own report of a failed query (ERRORs with the whole stack) off
    stderr: main() reports the failure itself, in one line, or raises it with the same
    stack. On a cluster, a task that failed and will be retried is still logged."""
    context = spark.sparkContext
    loggers = QUERY_LOGGERS
    if str(context.master).startswith("local"):
        loggers += LOCAL_TASK_LOGGERS
    jvm = context._jvm
    assert jvm is not None
    log4j = jvm.org.apache.logging.log4j
    for name in loggers:
        log4j.core.config.Configurator.setLevel(name, log4j.Level.OFF)


if __name__ == "__main__":
    sys.exit(main())
