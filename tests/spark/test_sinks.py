"""Analytics back into MQTT: a job's results as retained messages under $analytics/, read
by a real MQTT client; the same through the `nautilus-spark` command with a SQL query."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spark_consumers import jobs
from spark_consumers.sinks import writer

from .test_source import relay_of

pytestmark = pytest.mark.timeout(240)


def traffic(server, paho_client, **login) -> None:
    """6 messages of 2 bytes to dash/a, 2 of 3 bytes to dash/b (`login`: username and
    password, for a broker that wants them)."""
    publisher = paho_client(server, 4, **login)
    for _ in range(6):
        publisher.publish("dash/a", b"xx", qos=1)
    for _ in range(2):
        publisher.publish("dash/b", b"yyy", qos=1)


def retained(server, paho_client, pattern: str, count: int, **login) -> dict[str, dict]:
    """The retained messages of `pattern` (`count` of them), their payloads decoded."""
    reader = paho_client(server, 4, **login)
    reader.subscribe(pattern, 1)
    messages = [reader.expect_message() for _ in range(count)]
    assert all(m.retain for m in messages)
    return {m.topic: json.loads(m.payload) for m in messages}


def test_topic_traffic_is_published_as_retained_messages(
    spark, start_broker, paho_client, tmp_path
):
    server = start_broker(event_relay={"enabled": True, "address": "127.0.0.1:0"})
    _, address = relay_of(server)
    traffic(server, paho_client)
    host, port = server.host, server.port
    events = spark.readStream.format("nautilus_events").option("relay", address).load()
    # A day-long window: the few seconds of traffic fall into one.
    results = jobs.topic_traffic(events, window="1 day")
    query = (
        writer(results, f"mqtt:{host}:{port}", "topic_traffic")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    got = retained(server, paho_client, "$analytics/topic_traffic/#", 2)
    assert {topic: (row["messages"], row["bytes"]) for topic, row in got.items()} == {
        "$analytics/topic_traffic/dash/a": (6, 12),
        "$analytics/topic_traffic/dash/b": (2, 6),
    }
    assert got["$analytics/topic_traffic/dash/a"]["window"]["start"].endswith("T00:00:00Z")


def test_the_command_runs_a_sql_query_into_mqtt(start_broker, paho_client, tmp_path):
    server = start_broker(event_relay={"enabled": True, "address": "127.0.0.1:0"})
    _, address = relay_of(server)
    traffic(server, paho_client)
    host, port = server.host, server.port
    query = "SELECT topic, count(*) AS n FROM events WHERE event_type = 'on_publish' GROUP BY topic"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_consumers.cli",
            "sql",
            query,
            "--relay",
            address,
            "--sink",
            f"mqtt:{host}:{port}",
            "--checkpoint",
            str(tmp_path / "checkpoint"),
            "--trigger",
            "available-now",
            "--master",
            "local[2]",
            "--prefix",
            "dashboards/live",  # any prefix, not only $analytics
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = retained(server, paho_client, "dashboards/live/sql/#", 2)
    assert {topic: row["n"] for topic, row in got.items()} == {
        "dashboards/live/sql/dash/a": 6,
        "dashboards/live/sql/dash/b": 2,
    }


def test_an_unknown_sink_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_consumers.cli",
            "topic-traffic",
            "--sink",
            "kafka:x",
            "--checkpoint",
            str(tmp_path / "c"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("nautilus-spark: --sink kafka:x: unknown sink: expected console, ")


def test_the_mqtt_sink_across_a_restart_counts_every_publish_once(
    spark, start_broker, paho_client, tmp_path
):
    server = start_broker(event_relay={"enabled": True, "address": "127.0.0.1:0"})
    _, address = relay_of(server)
    host, port = server.host, server.port
    checkpoint = str(tmp_path / "checkpoint")

    def run() -> None:
        events = spark.readStream.format("nautilus_events").option("relay", address).load()
        query = (
            writer(jobs.topic_traffic(events, window="1 day"), f"mqtt:{host}:{port}", "t")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    traffic(server, paho_client)
    run()
    assert (
        retained(server, paho_client, "$analytics/t/dash/a", 1)["$analytics/t/dash/a"]["messages"]
        == 6
    )
    traffic(server, paho_client)  # while the query is stopped
    run()  # the same checkpoint: only what is new, added to the window's state
    got = retained(server, paho_client, "$analytics/t/#", 2)
    assert {topic: row["messages"] for topic, row in got.items()} == {
        "$analytics/t/dash/a": 12,
        "$analytics/t/dash/b": 4,
    }
