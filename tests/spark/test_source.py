"""The nautilus_events source in real Spark (local mode) over a real broker's relay:
every event once, across a restart on the same checkpoint, a clear failure when the
events a query needs are gone, and a relay with TLS and a secret (read by the source;
refused to `nautilus-spark` with a wrong secret, naming the relay)."""

from __future__ import annotations

import logging
import re
import socket

import pytest

from event_relay.client import RelayError, tls_context
from spark_consumers.relay import RelayConnection
from tests.broker.test_tls import pki
from tests.conftest import BrokerThread

from .commands import failure_line, nautilus_spark

__all__ = ["pki"]  # a fixture, used by name

pytestmark = pytest.mark.timeout(240)
SECRET = "s3cret"


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


def tls_relay(pki) -> dict[str, object]:
    """[event_relay] with TLS (a certificate for 127.0.0.1) and the secret SECRET."""
    return {
        "enabled": True,
        "address": "127.0.0.1:0",
        "certfile": pki.server.certfile,
        "keyfile": pki.server.keyfile,
        "secret": SECRET,
    }


def test_the_source_reads_a_relay_with_tls_and_a_secret(
    spark, start_broker, paho_client, tmp_path, pki
):
    server = start_broker(event_relay=tls_relay(pki))
    relay, address = relay_of(server)
    publish(server, paho_client, relay, 20)
    out = str(tmp_path / "out")
    # Read on the executors (the default): each opens its own TLS connection.
    options = {"tls": "true", "cafile": pki.cafile, "secret": SECRET, "types": "on_publish"}
    run_once(spark, address, out, str(tmp_path / "checkpoint"), **options)
    rows = spark.read.parquet(out).where("event_type = 'on_publish'").collect()
    assert sorted(r.payload for r in rows) == sorted(f"m{i}".encode() for i in range(20))


def test_the_tls_options_are_checked_as_the_stream_is_loaded(spark):
    with pytest.raises(Exception, match=r"nautilus_events: tls is true or false, not 'yes'"):
        spark.readStream.format("nautilus_events").option("tls", "yes").load()
    with pytest.raises(Exception, match=r"nautilus_events: cafile: cannot load missing\.pem: No"):
        spark.readStream.format("nautilus_events").option("cafile", "missing.pem").load()


def test_a_refused_source_connection_is_one_line_on_each_side(start_broker, pki, caplog):
    # The source's blocking connection (the driver's and the executors'): a refusal is a
    # RelayError naming the relay, and one WARNING on the relay's side.
    caplog.set_level(logging.WARNING, logger="nautilus.event_relay")
    server = start_broker(event_relay=tls_relay(pki))
    _, address = relay_of(server)

    def refused(secret: str, cafile: str) -> tuple[str, str]:
        """What the connection raised, and the one line the relay logged."""
        caplog.clear()
        with pytest.raises(RelayError) as caught:
            RelayConnection(address, "spark", secret, tls_context(cafile))
        server.wait_for(lambda: caplog.records)
        (logged,) = [r.getMessage() for r in caplog.records]
        return str(caught.value), logged

    client, logged = refused(SECRET, pki.other_cafile)
    assert client.startswith(f"relay {address}: tls: the relay's certificate is not trusted (")
    assert re.fullmatch(
        r"event relay: 127\.0\.0\.1:\d+: TLS handshake failed: the consumer does not trust "
        r"the relay's certificate \(unknown CA\)",
        logged,
    ), logged
    client, logged = refused("wrong", pki.cafile)
    assert client == f"relay {address}: unauthorized: a valid secret is required"
    assert re.fullmatch(
        r"event relay: 127\.0\.0\.1:\d+: consumer 'spark' refused: wrong or missing secret",
        logged,
    ), logged
    RelayConnection(address, "spark", SECRET, tls_context(pki.cafile)).close()


def test_nautilus_spark_with_a_wrong_secret_fails_naming_the_relay(start_broker, tmp_path, pki):
    server = start_broker(event_relay=tls_relay(pki))
    _, address = relay_of(server)
    wrong = tmp_path / "secret"
    wrong.write_text("not the secret\n")
    done = nautilus_spark(
        "topic-traffic",
        "--relay", address, "--relay-cafile", pki.cafile, "--relay-secret-file", str(wrong),
        "--sink", "console", "--checkpoint", str(tmp_path / "checkpoint"),
        "--trigger", "available-now", "--master", "local[1]",
    )  # fmt: skip
    assert failure_line(done) == (
        f"nautilus-spark: relay {address}: unauthorized: a valid secret is required"
    )


def test_nautilus_spark_relay_options_that_do_not_load_are_one_line_exit_2(tmp_path):
    done = nautilus_spark(
        "topic-traffic", "--relay-cafile", "missing.pem", "--checkpoint", str(tmp_path / "c")
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "nautilus-spark: --relay-cafile: cannot load missing.pem: No such file or directory"
    ]


def test_an_unreachable_relay_is_named_in_the_error():
    """What `nautilus-spark` prints in one line (spark_consumers.cli.ONE_LINE), as the
    wrong secret above is, through a real run."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
    with pytest.raises(RelayError) as info:
        RelayConnection(address, "spark")
    assert str(info.value) == f"relay {address}: unreachable: [Errno 111] Connection refused"
