"""The built-in analytics: each a function from the events (the `nautilus_events`
stream, or any DataFrame of its schema) to a windowed, watermarked aggregate.

Windows are tumbling, over the broker's event time; the watermark lets Spark drop the
state of windows older than it (rows later than that may be left out). In `update` mode
a window is emitted again as it grows, so a sink upserts on (window, key); `append`
emits each window once, when the watermark has passed it.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

WINDOW = "10 seconds"
WATERMARK = "30 seconds"
SINK_CLIENTS = "nautilus-spark-"  # the client ids of the MQTT sink (spark_consumers.sinks)


def broker_traffic(events: DataFrame) -> DataFrame:
    """The events of the clients' own traffic: not those of `$` topics (the broker's and
    the analytics', e.g. $analytics/...) nor of the MQTT sink's client. Without this, the
    results a job publishes back into the broker would be counted by the job, and
    publish again, in a loop."""
    topic = F.col("topic")
    return events.where(
        (topic.isNull() | ~topic.startswith("$")) & ~F.col("client_id").startswith(SINK_CLIENTS)
    )


def _count(condition: Column) -> Column:
    return F.sum(F.when(condition, 1).otherwise(0))


def topic_traffic(events: DataFrame, window: str = WINDOW, watermark: str = WATERMARK) -> DataFrame:
    """Messages and payload bytes published per topic per window."""
    return (
        broker_traffic(events)
        .where(F.col("event_type") == "on_publish")
        .withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window).alias("window"), "topic")
        .agg(F.count("*").alias("messages"), F.sum("payload_size").alias("bytes"))
    )


def client_activity(
    events: DataFrame, window: str = WINDOW, watermark: str = WATERMARK
) -> DataFrame:
    """Connects, and disconnects by reason (sessions kept: offline; ended: gone), per
    window: how many, by how many clients, the clients online just after the row's last
    event, and how long the ended sessions lasted."""
    kinds = ["on_register", "on_client_offline", "on_client_gone"]
    return (
        broker_traffic(events)
        .where(F.col("event_type").isin(kinds))
        .withWatermark("event_time", watermark)
        .groupBy(
            F.window("event_time", window).alias("window"),
            "event_type",
            F.coalesce(F.col("reason"), F.lit("")).alias("reason"),
        )
        .agg(
            F.count("*").alias("events"),
            F.approx_count_distinct("client_id").alias("clients"),
            F.max_by("online", "seq").alias("online"),
            F.avg("session_seconds").alias("avg_session_seconds"),
            F.max("session_seconds").alias("max_session_seconds"),
        )
    )


def auth_failures(events: DataFrame, window: str = WINDOW, watermark: str = WATERMARK) -> DataFrame:
    """Refused connects per reason and peer address per window (brute force shows as
    one peer with many)."""
    return (
        broker_traffic(events)
        .where(F.col("event_type") == "on_register_failed")
        .withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window).alias("window"), "reason", "peer_addr")
        .agg(
            F.count("*").alias("failures"),
            F.approx_count_distinct("client_id").alias("client_ids"),
        )
    )


def delivery_health(
    events: DataFrame, window: str = WINDOW, watermark: str = WATERMARK
) -> DataFrame:
    """Publishes against deliveries, drops and offline messages per window."""
    kind = F.col("event_type")
    return (
        broker_traffic(events)
        .withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window).alias("window"))
        .agg(
            _count(kind == "on_publish").alias("publishes"),
            _count(kind == "on_deliver").alias("deliveries"),
            _count(kind == "on_delivery_complete").alias("completed"),
            _count(kind == "on_offline_message").alias("offline"),
            _count((kind == "on_message_drop") & (F.col("reason") == "queue_full")).alias(
                "dropped_queue_full"
            ),
            _count((kind == "on_message_drop") & (F.col("reason") == "expired")).alias(
                "dropped_expired"
            ),
            _count(
                (kind == "on_message_drop") & (F.col("reason") == "no_matching_subscribers")
            ).alias("unrouted"),
        )
    )


JOBS = {
    "topic-traffic": topic_traffic,
    "client-activity": client_activity,
    "auth-failures": auth_failures,
    "delivery-health": delivery_health,
}
