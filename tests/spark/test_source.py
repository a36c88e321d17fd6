"""The nautilus_events source in real Spark (local mode) over a real broker's relay:
every event once, across a restart on the same checkpoint, and a clear failure when the
events a query needs are gone."""

from __future__ import annotations

import pytest

from tests.conftest import BrokerThread

pytestmark = pytest.mark.timeout(240)


def relay_of(server: BrokerThread) -> tuple[object, str]:
    relay = dict(server.broker.plugins)["event_relay"]
    host, port = relay.server.address
    return relay, f"{host}:{port}"


def publish(server: BrokerThread, paho_client, relay, count: int) -> int:
    """`count` QoS 1 publishes; returns the relay's next sequence number once all their
    events are in its log."""
    client = paho_client(server, 4)
    before = server.call(lambda: relay.log.next_seq)
    for i in range(count):
        client.publish(f"spark/{i % 3}", f"m{i}".encode(), qos=1)
    # One on_publish and one on_message_drop each (nobody subscribes): wait for the last.
    server.wait_for(lambda: relay.log.next_seq >= before + 2 * count)
    return server.call(lambda: relay.log.next_seq)


def run_once(spark, address: str, out: str, checkpoint: str, **options: str) -> None:
    reader = spark.readStream.format("nautilus_events").option("relay", address)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


@pytest.mark.parametrize("read_on", ["executors", "driver"])
def test_a_restarted_query_reads_every_event_once(
    spark, start_broker, paho_client, tmp_path, read_on
):
    server = start_broker(event_relay={"enabled": True, "address": "127.0.0.1:0"})
    relay, address = relay_of(server)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    options = {"maxEventsPerTrigger": "25", "eventsPerPartition": "10", "readOn": read_on}
    publish(server, paho_client, relay, 30)
    run_once(spark, address, out, checkpoint, **options)
    first = sorted(r.seq for r in spark.read.parquet(out).select("seq").collect())
    assert first == list(range(1, len(first) + 1))  # from the earliest, no gap

    end = publish(server, paho_client, relay, 20)  # the query is down meanwhile
    run_once(spark, address, out, checkpoint, **options)
    rows = spark.read.parquet(out).collect()
    seqs = sorted(r.seq for r in rows)
    # No duplicate, no gap, across the restart; each run read up to a heartbeat it asked
    # for as it began (the relay's clock then), so past the last publish.
    assert seqs == list(range(1, seqs[-1] + 1)) and seqs[-1] >= end
    assert rows[[r.seq for r in rows].index(seqs[-1])].event_type == "heartbeat"
    published = [r for r in rows if r.event_type == "on_publish"]
    assert len(published) == 50
    one = next(r for r in published if r.payload == b"m7")
    assert (one.topic, one.qos, one.retain, one.payload_size) == ("spark/1", 1, False, 2)
    assert one.node == "nautilus" and one.session_id and one.event_time is not None
    # The relay knows how far the query got (Spark commits a batch's end once a later
    # batch runs, so the last batch of a run may not be committed yet).
    committed = server.call(lambda: relay.server.committed("spark"))
    assert committed is not None and 25 < committed <= seqs[-1] + 1


@pytest.mark.parametrize("read_on", ["executors", "driver"])
def test_a_batch_cut_short_by_a_crash_is_read_again_exactly(
    spark, start_broker, paho_client, tmp_path, read_on
):
    # A crash after a batch was read, before it was committed: the restarted query runs
    # it again over exactly its logged range (with readOn=driver, Spark's replay reads on
    # an executor, through readBetweenOffsets), before anything newer.
    server = start_broker(event_relay={"enabled": True, "address": "127.0.0.1:0"})
    relay, address = relay_of(server)
    checkpoint = tmp_path / "checkpoint"
    publish(server, paho_client, relay, 30)
    batches: dict[int, list[list[int]]] = {}

    def run() -> None:
        def record(batch, batch_id: int) -> None:
            seqs = sorted(row.seq for row in batch.select("seq").collect())
            batches.setdefault(batch_id, []).append(seqs)

        events = (
            spark.readStream.format("nautilus_events")
            .option("relay", address)
            .option("maxEventsPerTrigger", "25")
            .option("readOn", read_on)
            .load()
        )
        query = (
            events.writeStream.foreachBatch(record)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    run()
    last = max(batches)
    for name in (str(last), f".{last}.crc"):  # the crash: its commit never written
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    publish(server, paho_client, relay, 10)
    run()
    assert len(batches[last]) == 2 and batches[last][0] == batches[last][1]
    assert batches[last][0]  # (a batch that read something)
    seqs = sorted(seq for runs in batches.values() for seq in runs[0])
    assert seqs == list(range(1, seqs[-1] + 1))  # and nothing else twice, nothing missed


def test_the_read_on_option_is_checked_as_the_stream_is_loaded(spark):
    with pytest.raises(Exception, match=r"readOn is executors or driver, not 'drivers'"):
        spark.readStream.format("nautilus_events").option("readOn", "drivers").load()


def test_a_range_the_relay_no_longer_holds_fails_the_query(
    spark, start_broker, paho_client, tmp_path
):
    server = start_broker(
        event_relay={"enabled": True, "address": "127.0.0.1:0", "memory_events": 10}
    )
    relay, address = relay_of(server)
    publish(server, paho_client, relay, 3000)  # far past what memory keeps
    with pytest.raises(Exception, match="no longer retained"):
        run_once(spark, address, str(tmp_path / "o"), str(tmp_path / "c"), startingOffsets="1")
