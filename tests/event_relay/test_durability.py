"""Durability: the spool keeps events, the sequence, the epoch and commits across a
broker restart (in-process) and, with `durability = "acknowledged"`, every publish the
broker acknowledged has its on_publish event after `kill -9` (a real broker process with
the LevelDB store). Without a spool the log starts again: new epoch, sequence from 1."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from tests.broker.helpers import PUBACK, RawClient, publish_packet, unique_id
from tests.test_cli import TIMEOUT, BrokerProcess

from .conftest import RELAY, RELAY_LISTENING, RelayBroker, assert_gap_free, flood

HOST = "127.0.0.1"


def in_process(start_broker, relay: dict[str, Any]) -> RelayBroker:
    server = start_broker(event_relay={**RELAY, **relay})
    return RelayBroker(server, dict(server.broker.plugins)["event_relay"])


async def everything_and_info(address: tuple[str, int], name: str) -> tuple[list, dict]:
    from event_relay.client import RelayClient

    async with await RelayClient.connect(*address, name=name, start=None) as client:
        info = await asyncio.wait_for(client.info(), 5)
        events = await asyncio.wait_for(client.read(info["first_seq"], info["next_seq"]), 10)
        return events, info


def test_trim_committed_lets_go_once_every_named_consumer_committed(start_broker, tmp_path):
    relay = {
        "durability": "spool",
        "spool_path": str(tmp_path / "spool"),
        "trim_committed": ["spark", "audit"],
    }
    broker = in_process(start_broker, relay)
    end = flood(broker, 2500)  # 5,003 events: two memory segments

    def spool_first() -> int:
        return broker.server.call(lambda: broker.plugin.log.spool.first_seq)

    async def commit(name: str, position: int) -> None:
        async with await broker.connect(name=name, start=None) as client:
            await client.commit(position)

    asyncio.run(commit("spark", 4500))
    assert spool_first() == 1  # audit has not committed: nothing goes
    asyncio.run(commit("someone-else", 5000))
    assert spool_first() == 1  # not a named consumer
    asyncio.run(commit("audit", 4200))
    assert spool_first() == 4200  # the lowest of the named consumers' positions
    _, info = asyncio.run(everything_and_info(broker.address, "reader"))
    # Memory let go of its first segment (4,096 events), all processed.
    assert (info["first_seq"], info["next_seq"]) == (4097, end)


def test_spool_keeps_events_sequence_epoch_and_commits_across_a_restart(start_broker, tmp_path):
    relay = {"durability": "spool", "spool_path": str(tmp_path / "spool")}
    first = in_process(start_broker, relay)
    flood(first, 20)
    before = first.read_all()
    assert_gap_free(before, first=1)

    async def commit() -> None:
        async with await first.connect(name="keeper", start=None) as client:
            await client.commit(10)

    asyncio.run(commit())
    epoch = first.plugin.epoch
    first.server.stop()

    second = in_process(start_broker, relay)
    assert second.plugin.epoch == epoch
    after, info = asyncio.run(everything_and_info(second.address, "keeper"))
    assert info["epoch"] == epoch
    assert (info["first_seq"], info["next_seq"]) == (1, len(before) + 1)
    assert info["committed"] == 10
    assert after == before  # readable by sequence, field for field

    next_seq = flood(second, 1)
    assert next_seq == len(before) + 1 + 5
    events = second.read_all()
    assert_gap_free(events, first=1)
    assert events[: len(before)] == before
    assert events[len(before)]["seq"] == before[-1]["seq"] + 1  # the sequence goes on
    assert events[len(before)]["type"] == "on_register"

    async def resume() -> int | None:
        async with await second.connect(name="keeper", start="committed") as client:
            return client.start

    assert asyncio.run(resume()) == 10


def test_without_a_spool_a_restart_starts_a_new_epoch(start_broker):
    first = in_process(start_broker, {})
    flood(first, 5)
    epoch = first.plugin.epoch
    first.server.stop()

    second = in_process(start_broker, {})
    events, info = asyncio.run(everything_and_info(second.address, "reader"))
    assert info["epoch"] != epoch
    assert (info["first_seq"], info["next_seq"], events) == (1, 1, [])
    assert info["committed"] is None
    flood(second, 1)
    assert second.read_all()[0]["seq"] == 1  # numbering starts again: a new epoch


# --------------------------------------------------------------------------- kill -9


def relay_config(tmp_path: Path, durability: str) -> Path:
    config = tmp_path / f"relay-{durability}.toml"
    config.write_text(
        "[broker]\nallow_anonymous = true\n\n"
        '[[listeners]]\ntype = "tcp"\naddress = "127.0.0.1:0"\n\n'
        f'[store]\nbackend = "leveldb"\npath = "{tmp_path / "store"}"\n\n'
        f'[event_relay]\nenabled = true\naddress = "127.0.0.1:0"\n'
        f'durability = "{durability}"\nspool_path = "{tmp_path / "spool"}"\n',
        encoding="utf-8",
    )
    return config


def relay_address(proc: BrokerProcess) -> tuple[str, int]:
    for line in proc.lines:
        if match := RELAY_LISTENING.search(line):
            return HOST, int(match[1])
    raise AssertionError(f"no relay address in {proc.lines}")


def publish_acknowledged(port: int, count: int, window: int) -> list[bytes]:
    """QoS 1 publishes, `window` on the wire at a time; the payloads of those that got
    their PUBACK (every one)."""
    pub = RawClient(HOST, port)
    acked: list[bytes] = []
    try:
        pub.connect(unique_id("acked"))
        for start in range(1, count + 1, window):
            ids = list(range(start, min(start + window, count + 1)))
            pub.send(
                b"".join(
                    publish_packet("durable/x", b"m%05d" % pid, qos=1, packet_id=pid) for pid in ids
                )
            )
            for _ in ids:
                packet_id = pub.expect(PUBACK).packet_id
                assert packet_id is not None
                acked.append(b"m%05d" % packet_id)
    finally:
        pub.sock.close()
    return acked


def crash(proc: BrokerProcess) -> None:
    """kill -9: nothing but what is on disk is left."""
    proc.proc.kill()
    proc.proc.wait(TIMEOUT)


@pytest.mark.parametrize(
    ("durability", "kept"), [("acknowledged", True), ("none", False)], ids=["acknowledged", "none"]
)
def test_acknowledged_publishes_have_their_events_after_kill_9(
    tmp_path, start_process, durability, kept
):
    config = relay_config(tmp_path, durability)
    first = start_process(config)
    before_events, before = asyncio.run(everything_and_info(relay_address(first), "probe"))
    acked = publish_acknowledged(first.port, 300, window=25)
    assert len(acked) == 300
    crash(first)  # right after the last PUBACK

    second = start_process(config)
    events, info = asyncio.run(everything_and_info(relay_address(second), "probe"))
    published = [e["payload"] for e in events if e["type"] == "on_publish"]
    if kept:
        assert info["epoch"] == before["epoch"]
        assert set(acked) <= set(published), sorted(set(acked) - set(published))[:5]
        assert_gap_free(events, first=1)
        assert events[: len(before_events)] == before_events
    else:  # what kept them above is the spool: without it they are gone
        assert info["epoch"] != before["epoch"]
        assert info["next_seq"] == 1 and published == []
    assert not any("Traceback" in line for line in second.lines)


def test_the_spool_is_locked_by_a_running_broker(tmp_path, start_process):
    config = relay_config(tmp_path, "spool")
    start_process(config)
    other = tmp_path / "other.toml"
    other.write_text(config.read_text().replace(str(tmp_path / "store"), str(tmp_path / "s2")))
    from tests.test_cli import nautilus

    result = nautilus("--config", str(other), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr, result.stderr
    # One line says it, last (the relay opens its spool as it starts, after the INFO
    # lines of the plugins built).
    last = result.stderr.splitlines()[-1]
    assert re.match(r"^nautilus: event_relay\.spool_path: event spool .*: cannot open it", last)
