"""The built-in jobs in real Spark over a real broker's relay, on known traffic: their
totals over all windows are exact (the windows themselves depend on the wall clock)."""

from __future__ import annotations

import msgpack
import pytest

from event_relay.schema import decode_event, expand
from spark_consumers import jobs
from tests.event_relay.conftest import PASSWORDS

from .test_source import relay_of

pytestmark = pytest.mark.timeout(240)


def events_of(relay, hook: str) -> list[dict]:
    """The `hook` events the relay's log holds."""
    records, _ = relay.log.read(relay.log.first_seq, 1_000_000)
    decoded = map(decode_event, expand([msgpack.unpackb(data) for data in records]))
    return [event for event in decoded if event["type"] == hook]


def count(relay, hook: str) -> int:
    return len(events_of(relay, hook))


def totals(spark, address: str, job, tmp_path, name: str) -> list:
    # Only the types and columns the job declares (as nautilus-spark reads them): a job
    # that reads others fails or miscounts here.
    (options,) = (jobs.SOURCE_OPTIONS[k] for k, function in jobs.JOBS.items() if function is job)
    reader = spark.readStream.format("nautilus_events").option("relay", address)
    events = reader.options(**options).load()
    query = (
        job(events)
        .writeStream.format("memory")
        .queryName(name)
        .outputMode("complete")
        .option("checkpointLocation", str(tmp_path / name))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return spark.table(name).collect()


def test_the_jobs_count_known_traffic(spark, start_broker, paho_client, tmp_path):
    server = start_broker(event_relay={"enabled": True, "address": "127.0.0.1:0"})
    relay, address = relay_of(server)
    subscriber = paho_client(server, 4)
    subscriber.subscribe("jobs/#", 1)
    publisher = paho_client(server, 4)
    for i in range(10):
        publisher.publish("jobs/a", f"a{i:02}".encode(), qos=1)  # 3 bytes each
    for i in range(5):
        publisher.publish("jobs/b", f"b{i}".encode(), qos=1)  # 2 bytes each
    for _ in range(4):
        publisher.publish("nowhere/x", b"x", qos=1)  # nobody subscribes
    # What the MQTT sink publishes back is left out, so it is never counted again.
    publisher.publish("$analytics/topic_traffic/jobs/a", b"{}", qos=1)
    for _ in range(15):
        subscriber.expect_message()
    # The subscriber's acknowledgements are in.
    server.wait_for(lambda: count(relay, "on_delivery_complete") == 15)
    publisher.disconnect()  # a clean session ends: on_client_gone, normal_disconnect
    server.wait_for(lambda: count(relay, "on_client_gone") == 1)

    traffic = totals(spark, address, jobs.topic_traffic, tmp_path, "traffic")
    by_topic: dict[str, list[int]] = {}
    for row in traffic:
        messages, size = by_topic.setdefault(row.topic, [0, 0])
        by_topic[row.topic] = [messages + row.messages, size + row.bytes]
    assert by_topic == {"jobs/a": [10, 30], "jobs/b": [5, 10], "nowhere/x": [4, 4]}

    health = totals(spark, address, jobs.delivery_health, tmp_path, "health")
    summed = {
        key: sum(getattr(row, key) for row in health)
        for key in ("publishes", "deliveries", "completed", "offline", "unrouted")
    }
    assert summed == {
        "publishes": 19,
        "deliveries": 15,
        "completed": 15,
        "offline": 0,
        "unrouted": 4,
    }

    activity = totals(spark, address, jobs.client_activity, tmp_path, "activity")
    summed_activity: dict[tuple[str, str], int] = {}
    for row in activity:
        key = (row.event_type, row.reason)
        summed_activity[key] = summed_activity.get(key, 0) + row.events
    assert summed_activity == {
        ("on_register", ""): 2,
        ("on_client_gone", "normal_disconnect"): 1,
    }
    # Online after the connects: 1, then 2 (a window boundary may split them); after the
    # publisher left: 1. Its session lasted from its on_register to its on_client_gone.
    assert max(row.online for row in activity if row.event_type == "on_register") == 2
    (gone,) = (row for row in activity if row.event_type == "on_client_gone")
    assert gone.online == 1
    (event,) = events_of(relay, "on_client_gone")
    lasted = (event["ts"] - event["connected_ts"]) / 1e9
    assert gone.avg_session_seconds == gone.max_session_seconds == pytest.approx(lasted)
    assert 0 < lasted < 60


def test_auth_failures_by_reason_and_peer(spark, start_broker, raw_client, fleet_files, tmp_path):
    files = fleet_files
    server = start_broker(
        broker={"allow_anonymous": False},
        plugins={"passwd": {"enabled": True, "password_file": files["passwd"]}},
        event_relay={"enabled": True, "address": "127.0.0.1:0"},
    )
    relay, address = relay_of(server)
    for attempt in range(3):
        intruder = raw_client(server, 4)
        bad = b"guess-" + str(attempt).encode()
        intruder.connect(f"intruder{attempt}", expect_code=4, username="bob", password=bad)
    friend = raw_client(server, 4)
    friend.connect("friend", username="bob", password=PASSWORDS["bob"].encode())
    server.wait_for(lambda: count(relay, "on_register") == 1)

    rows = totals(spark, address, jobs.auth_failures, tmp_path, "failures")
    by_reason: dict[tuple[str, str], int] = {}
    for row in rows:
        key = (row.reason, row.peer_addr)
        by_reason[key] = by_reason.get(key, 0) + row.failures
    assert by_reason == {("invalid_credentials", "127.0.0.1"): 3}
