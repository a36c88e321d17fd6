"""Where a job's results go: `console`, `parquet:DIR`, `memory:NAME` (tests) or MQTT
(`mqtt://[USER@]HOST[:PORT]`, `mqtts://...` for TLS, or the older `mqtt:HOST:PORT`), which
publishes each result row back into the broker as a retained message under
`<prefix>/<job>/<key>` (for example `$analytics/topic_traffic/sensors/t1`; for a SQL
query the row's text columns make the key), so any MQTT dashboard can subscribe to live
analytics. How the MQTT sink logs in, and what it does when the broker refuses or is
away: spark_consumers.mqtt_sink.

The MQTT sink is idempotent per batch: a row's topic is fixed by its key, and a retained
message replaces the one before, so a batch Spark runs again after a restart publishes
the same values to the same topics. Each row's payload is the row as JSON (times in ISO
8601, UTC: the session's time zone).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from spark_consumers.errors import SinkError
from spark_consumers.mqtt_sink import MqttOptions, MqttTarget, deliver, mqtt_target

__all__ = ["PREFIX", "MqttOptions", "RowCount", "SinkError", "writer"]

PREFIX = "$analytics"
MQTT_SINKS = ("mqtt:", "mqtts://")  # mqtt://, mqtts:// and the older mqtt:HOST:PORT
# The columns that make a job's row key (its MQTT topic below the job's name).
KEYS = {
    "topic_traffic": ["topic"],
    "client_activity": ["event_type", "reason"],
    "auth_failures": ["reason", "peer_addr"],
    "delivery_health": [],
}


PARTITION = "date"  # the Parquet sink's directories: date=YYYY-MM-DD


class RowCount:
    """The rows a sink wrote during one run (the summary line of `nautilus-spark`): for
    Parquet, the rows of the files that appeared under its directory (their footers);
    for MQTT, its publishes; otherwise what Spark's progress reports say, when they do."""

    def __init__(self, sink: str) -> None:
        kind, _, where = sink.partition(":")
        local = kind == "parquet" and where and "://" not in where  # not hdfs://, s3a://
        self.directory = Path(where) if local else None
        self.remote = kind == "parquet" and not local  # its files are not looked at here
        self._before = self._files()
        self.published = 0  # the MQTT sink's rows (foreachBatch runs on the driver)
        self.counts_publishes = sink.startswith(MQTT_SINKS)

    def _files(self) -> set[Path]:
        directory = self.directory
        return set(directory.rglob("*.parquet")) if directory and directory.is_dir() else set()

    def rows(self, progress: list[dict[str, Any]]) -> int | None:
        if self.remote:
            return None
        if self.directory is not None:
            new = self._files() - self._before
            return sum(pq.read_metadata(path).num_rows for path in new)
        if self.counts_publishes:
            return self.published
        reported = [p.get("sink", {}).get("numOutputRows", -1) for p in progress]
        return sum(reported) if all(n >= 0 for n in reported) else None


def writer(
    results: DataFrame,
    sink: str,
    job: str,
    prefix: str = PREFIX,
    count: RowCount | None = None,
    mqtt: MqttOptions | None = None,
    checkpoint: str | None = None,
) -> DataStreamWriter:
    """A stream writer of `results` to `sink` (output mode chosen for the sink); `count`,
    if given, is told what the MQTT sink publishes; `mqtt`, how the MQTT sink logs in;
    `checkpoint`, the query's checkpointLocation (it also makes the MQTT sink's client
    id, the same at every run). SinkError for a sink or option that cannot work."""
    stream = _writer(results, sink, job, prefix, count, mqtt or MqttOptions(), checkpoint)
    return stream if checkpoint is None else stream.option("checkpointLocation", checkpoint)


def _writer(
    results: DataFrame,
    sink: str,
    job: str,
    prefix: str,
    count: RowCount | None,
    mqtt: MqttOptions,
    checkpoint: str | None,
) -> DataStreamWriter:
    kind, _, where = sink.partition(":")
    stream = results.writeStream
    if kind == "console":
        return stream.format("console").outputMode("update").option("truncate", "false")
    if kind == "parquet" and where:
        # Files are written once: a window goes out when the watermark has passed it.
        day = _day(results)
        if day is not None:
            stream = results.withColumn(PARTITION, day).writeStream.partitionBy(PARTITION)
        return stream.format("parquet").outputMode("append").option("path", where)
    if kind == "memory" and where:
        return stream.format("memory").queryName(where).outputMode("complete")
    if sink.startswith(MQTT_SINKS):
        target = mqtt_target(sink, job, mqtt, checkpoint)
        publish = MqttPublisher(target, f"{prefix}/{job}", job, count)
        return stream.outputMode("update").foreachBatch(publish)
    raise SinkError(
        f"--sink {sink}: unknown sink: expected console, parquet:DIR, memory:NAME, "
        "mqtt://[USER@]HOST[:PORT] or mqtts://[USER@]HOST[:PORT]"
    )


def _day(results: DataFrame) -> Column | None:
    """The day a Parquet row belongs to: its window's start, or its event's time (UTC,
    the session's time zone); None when the rows have neither."""
    if PARTITION in results.columns:
        return F.col(PARTITION)
    if "window" in results.columns:
        return F.to_date(F.col("window.start"))
    if "event_time" in results.columns:
        return F.to_date(F.col("event_time"))
    return None


class MqttPublisher:
    """foreachBatch: each row of a batch as a retained QoS 1 message (on the driver)."""

    def __init__(
        self, target: MqttTarget, base: str, job: str, count: RowCount | None = None
    ) -> None:
        self.target, self.base = target, base
        self.keys = KEYS.get(job)  # None (a SQL query): the row's text columns
        self.count = count

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        if not rows:
            return
        deliver(self.target, [(self.topic(row), _json(row)) for row in rows])
        if self.count is not None:
            self.count.published += len(rows)

    def topic(self, row: Row) -> str:
        keys = self.keys
        if keys is None:
            keys = [name for name, value in row.asDict().items() if isinstance(value, str)]
        parts = [str(row[key]) or "-" for key in keys] or ["all"]
        return "/".join([self.base, *parts])


def _json(row: Row) -> bytes:
    return json.dumps(row.asDict(recursive=True), default=_plain, sort_keys=True).encode()


def _plain(value: Any) -> Any:
    if isinstance(value, datetime.datetime):  # naive, in the session's time zone: UTC
        return value.isoformat() + ("Z" if value.tzinfo is None else "")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"{type(value).__name__} is not JSON")
