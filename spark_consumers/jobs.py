"""The built-in analytics: each a function from the events (the `nautilus_events`
stream, or any DataFrame of its schema) to a windowed, watermarked aggregate.

Windows are tumbling, over the broker's event time; the watermark lets Spark drop the
state of windows older than it (rows later than that may be left out). In `update` mode
a window is emitted again as it grows, so a sink upserts on (window, key); `append`
emits each window once, when the watermark has passed it.

Event time moves on without traffic through the relay's heartbeats (rows of event_type
`heartbeat`, appended while the broker is quiet), but only if they reach the watermark:
Spark's optimizer moves a filter that does not read the event time below the watermark,
so a job that kept only its events would never show it a heartbeat. Each job therefore
lets heartbeats through its filter and drops them just above the watermark, with a
filter that reads the event time, which stays there (`_counted`).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

WINDOW = "10 seconds"
WATERMARK = "30 seconds"
SINK_CLIENTS = "nautilus-spark-"  # the client ids of the MQTT sink (spark_consumers.sinks)


def _heartbeat() -> Column:
    """A relay heartbeat's row (a Column is made under a session: not at import)."""
    return F.col("event_type") == "heartbeat"


def _traffic() -> Column:
    """The clients' own traffic: not the events of `$` topics (the broker's and the
    analytics', e.g. $analytics/...) nor of the MQTT sink's client, nor heartbeats."""
    topic = F.col("topic")
    return (
        ~_heartbeat()
        & (topic.isNull() | ~topic.startswith("$"))
        & ~F.col("client_id").startswith(SINK_CLIENTS)
    )


def broker_traffic(events: DataFrame) -> DataFrame:
    """The events of the clients' own traffic. Without this filter, the results a job
    publishes back into the broker would be counted by the job, and publish again, in a
    loop."""
    return events.where(_traffic())


def watermarked(events: DataFrame, watermark: str = WATERMARK) -> DataFrame:
    """The events with the watermark set (a query that filters them must let heartbeats
    through to move it: see above)."""
    return events.withWatermark("event_time", watermark)


def _counted(events: DataFrame, watermark: str, condition: Column) -> DataFrame:
    """The watermarked events of the clients' traffic that satisfy `condition`. The
    heartbeats pass the first filter (which Spark runs below the watermark) and are
    dropped by the second, which reads the event time and so runs above it."""
    kept = watermarked(events, watermark).where(_heartbeat() | (_traffic() & condition))
    return kept.where(F.when(_heartbeat(), None).otherwise(F.col("event_time")).isNotNull())


def _count(condition: Column) -> Column:
    return F.sum(F.when(condition, 1).otherwise(0))


def topic_traffic(events: DataFrame, window: str = WINDOW, watermark: str = WATERMARK) -> DataFrame:
    """Messages and payload bytes published per topic per window."""
    return (
        _counted(events, watermark, F.col("event_type") == "on_publish")
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
        _counted(events, watermark, F.col("event_type").isin(kinds))
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
        _counted(events, watermark, F.col("event_type") == "on_register_failed")
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
        _counted(events, watermark, F.lit(True))
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


# What each job reads of the source (its options): the event types it counts (the relay
# sends only those, and heartbeats) and the columns it reads (only those are made, and
# sent to Spark). The filters read event_type, event_time, topic, client_id.
_FILTERED = "event_type,event_time,topic,client_id"
SOURCE_OPTIONS = {
    "topic-traffic": {"types": "on_publish", "columns": f"{_FILTERED},payload_size"},
    "client-activity": {
        "types": "on_register,on_client_offline,on_client_gone",
        "columns": f"{_FILTERED},seq,reason,online,session_seconds",
    },
    "auth-failures": {"types": "on_register_failed", "columns": f"{_FILTERED},reason,peer_addr"},
    "delivery-health": {
        "types": "on_publish,on_deliver,on_delivery_complete,on_offline_message,on_message_drop",
        "columns": f"{_FILTERED},reason",
    },
}

JOBS = {
    "topic-traffic": topic_traffic,
    "client-activity": client_activity,
    "auth-failures": auth_failures,
    "delivery-health": delivery_health,
}
