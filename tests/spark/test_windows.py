"""Windows that close when time passes, not only when more traffic comes: the relay's
heartbeats move a query's watermark while the broker is quiet, an available-now run reads
up to the relay's clock, and the run says what it did (`nautilus-spark`, real Spark in
local mode, a real broker)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import pyarrow.parquet as pq
import pytest

from event_relay.schema import decode_event, expand
from tests.conftest import BrokerThread

from .test_source import relay_of

pytestmark = pytest.mark.timeout(300)

COUNTS = {"win/a": 30, "win/b": 20, "win/c": 10}


def publish_counts(server: BrokerThread, paho_client) -> None:
    publisher = paho_client(server, 4)
    for topic, count in COUNTS.items():
        for i in range(count):
            publisher.publish(topic, b"%d" % i, qos=1)
    publisher.disconnect()


def relay_clock_passes(server: BrokerThread, moment_ns: int) -> None:
    """Wait until the relay holds a heartbeat of `moment_ns` or later (the broker went
    quiet past it)."""
    relay = dict(server.broker.plugins)["event_relay"]

    def beat_after() -> bool:
        records, _ = relay.log.read(max(relay.log.first_seq, relay.log.next_seq - 50), 1000)
        events = map(decode_event, expand([msgpack.unpackb(r) for r in records]))
        return any(e["type"] == "heartbeat" and e["ts"] >= moment_ns for e in events)

    server.wait_for(beat_after, timeout=30)


TOPIC_TRAFFIC = ("topic-traffic",)


def command(
    address: str, sink: str, checkpoint: Path, *options: str, job: tuple[str, ...] = TOPIC_TRAFFIC
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "spark_consumers.cli",
        *job,
        "--relay",
        address,
        "--sink",
        sink,
        "--checkpoint",
        str(checkpoint),
        "--master",
        "local[2]",
        *options,
    ]


def traffic_then_quiet(start_broker, paho_client) -> str:
    """A broker with the relay, COUNTS published to it, then quiet past the end of the
    last publish's 2 s window (the relay's clock says so). Returns the relay's address."""
    server = start_broker(event_relay={"enabled": True, "address": "127.0.0.1:0"})
    _, address = relay_of(server)
    publish_counts(server, paho_client)
    relay_clock_passes(server, (time.time_ns() // 2_000_000_000 + 1) * 2_000_000_000)
    return address


def run_now(
    address: str, sink: str, checkpoint: Path, *options: str, job: tuple[str, ...] = TOPIC_TRAFFIC
) -> str:
    """One available-now run; its summary line (the last line of stderr)."""
    done = subprocess.run(
        command(address, sink, checkpoint, "--trigger", "available-now", *options, job=job),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


def committed(directory: Path) -> list[str]:
    """The Parquet files Spark's file sink committed (its `_spark_metadata` log): a
    file being written meanwhile is not one of them."""
    log = directory / "_spark_metadata"
    paths: set[str] = set()
    for entry in log.glob("*") if log.is_dir() else ():
        if entry.name.startswith(".") or entry.name.endswith(".tmp"):
            continue
        for line in entry.read_text().splitlines()[1:]:  # after the version line
            paths.add(json.loads(line)["path"].removeprefix("file://"))
    return sorted(paths)


def per_topic(directory: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in committed(directory):
        table = pq.read_table(path, columns=["topic", "messages"])
        for topic, messages in zip(
            table.column("topic").to_pylist(), table.column("messages").to_pylist(), strict=True
        ):
            counts[topic] = counts.get(topic, 0) + messages
    return counts


def test_an_available_now_run_after_the_traffic_writes_every_window_once(
    start_broker, paho_client, tmp_path
):
    address = traffic_then_quiet(start_broker, paho_client)  # 2 s windows, no watermark
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    sink = f"parquet:{out}"
    window = ("--window", "2 seconds", "--watermark", "0 seconds")
    line = run_now(address, sink, checkpoint, *window)
    assert per_topic(out) == COUNTS
    assert line.startswith("nautilus-spark: read ") and "; no window left open" in line
    rows = sum(pq.read_metadata(path).num_rows for path in committed(out))
    assert f"wrote {rows} rows to {sink}" in line
    # Again on the same checkpoint: exactly once, nothing added.
    again = run_now(address, sink, checkpoint, *window)
    assert per_topic(out) == COUNTS
    assert f"wrote 0 rows to {sink}" in again


def test_a_run_that_ends_before_its_windows_close_says_when_they_will(
    start_broker, paho_client, tmp_path
):
    server = start_broker(event_relay={"enabled": True, "address": "127.0.0.1:0"})
    _, address = relay_of(server)
    publish_counts(server, paho_client)
    out = tmp_path / "out"
    line = run_now(
        address,
        f"parquet:{out}",
        tmp_path / "checkpoint",
        *("--window", "1 day", "--watermark", "0 seconds"),
    )
    assert per_topic(out) == {}  # the day has not ended
    assert "wrote 0 rows" in line
    # One row per topic waits in the day's window, which closes at the next midnight UTC.
    assert line.endswith(
        "3 rows of open windows: the last closes once the broker's clock passes "
        + time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + 86400))
    )


# A batch's own time on this machine, at most (a one-row batch takes about 0.3 s; the
# margin is for a busy machine): the bound's "plus two micro-batches".
BATCH_ALLOWANCE = 3.0


def test_a_continuous_query_on_a_quiet_broker_writes_its_last_window_in_the_bound(
    start_broker, paho_client, tmp_path
):
    # docs/spark.md's rule: a window's rows reach an append sink within watermark +
    # heartbeat_interval of its end, plus two micro-batches; here 0 s + 1 s (the default)
    # + 2 x (a 0.5 s trigger + the batch's own time), traffic or not. A trigger under 1 s
    # reads on the driver (--read-on auto). (Measured: 4.0 s with a 1 s trigger, executors.)
    server = start_broker(event_relay={"enabled": True, "address": "127.0.0.1:0"})
    _, address = relay_of(server)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = ("--trigger", "500 milliseconds", "--window", "2 seconds", "--watermark", "0 seconds")
    log = tmp_path / "query.log"
    with log.open("w") as stderr:
        query = subprocess.Popen(
            command(address, f"parquet:{out}", checkpoint, *options),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )

    def wait_until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 120
        while not condition():
            assert query.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, what
            time.sleep(0.2)  # polling files another process writes: no event to await

    try:
        # Running: its first batch is committed (the heartbeats give it one).
        wait_until(lambda: (checkpoint / "commits" / "0").exists(), "no batch committed")
        publish_counts(server, paho_client)  # then nothing more
        window_end = (time.time() // 2 + 1) * 2  # the last publish's window ends then
        wait_until(lambda: per_topic(out) == COUNTS, f"written so far: {per_topic(out)}")
        late = time.time() - window_end
        assert late <= 1.0 + 2 * (0.5 + BATCH_ALLOWANCE), f"{late:.1f} s after its end"
    finally:
        query.terminate()
        query.wait(timeout=60)


def test_a_sql_query_that_reads_the_event_time_in_its_filter_closes_its_windows_too(
    start_broker, paho_client, tmp_path
):
    # Spark runs a filter that does not read the event time below the watermark, where
    # it would drop the heartbeats before they move it; one that reads it stays above.
    address = traffic_then_quiet(start_broker, paho_client)
    out = tmp_path / "out"
    query = (
        "SELECT window(event_time, :window) AS window, topic, count(*) AS messages "
        "FROM events WHERE event_type = 'on_publish' OR event_time IS NULL "
        "GROUP BY window, topic"
    )
    window = ("--window", "2 seconds", "--watermark", "0 seconds")
    run_now(address, f"parquet:{out}", tmp_path / "checkpoint", *window, job=("sql", query))
    assert per_topic(out) == COUNTS
