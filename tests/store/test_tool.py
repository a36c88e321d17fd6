"""`nautilus store stats|check|compact --path DIR` on real stores, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import plyvel

from broker.message import Delivery, Message
from broker.store import SessionRecord
from broker.store.leveldb import REFS, LevelDBStore


class Loop:
    """The store's clock and group commit; the test commits by hand."""

    def time(self) -> float:
        return 0.0

    def call_soon(self, callback, *args) -> None:
        pass


def store_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", "store", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def fill(path: Path) -> None:
    store = LevelDBStore(str(path), Loop(), sync=False)  # type: ignore[arg-type]
    shared = Message("t/shared", b"fan-out", 1, now=0.0)
    for client, count in (("big", 30), ("small", 2)):
        store.put_session(SessionRecord(client, None, 1.0))
        for seq in range(count):
            store.put_entry(client, seq, Delivery(Message("t", b"%d" % seq, 1, now=0.0), 1, False))
        store.put_entry(client, count, Delivery(shared, 1, False))
    store.put_retained(Message("r/kept", b"x", 1, True))
    store.close()


def test_stats_counts_what_the_store_holds(tmp_path):
    fill(tmp_path / "store")
    result = store_tool("stats", "--path", str(tmp_path / "store"))
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines() if line[:1] != " ")
    assert lines["sessions"].strip() == "2"
    assert "34" in lines["queued"]  # 30 + 2 + the shared one twice
    assert "1" in lines["shared"]
    assert "1" in lines["retained"]
    assert result.stdout.index("31  big") < result.stdout.index("3  small")  # largest first


def test_check_passes_a_sound_store_and_names_what_is_wrong(tmp_path):
    fill(tmp_path / "store")
    assert store_tool("check", "--path", str(tmp_path / "store")).stdout.strip() == (
        "ok: no problems found"
    )
    db = plyvel.DB(str(tmp_path / "store" / "messages"))
    (key,) = [k for k, _ in db.iterator(prefix=REFS)]
    db.put(key, (7).to_bytes(4, "big"))  # a reference count that lies
    db.close()
    result = store_tool("check", "--path", str(tmp_path / "store"))
    assert result.returncode == 1
    assert "count says 7, referenced 2 times" in result.stdout


def test_compact_reports_the_size_before_and_after(tmp_path):
    fill(tmp_path / "store")
    result = store_tool("compact", "--path", str(tmp_path / "store"))
    assert result.returncode == 0 and result.stdout.startswith("compacted: "), result


def test_a_store_in_use_or_missing_is_one_line(tmp_path):
    fill(tmp_path / "store")
    running = LevelDBStore(str(tmp_path / "store"), Loop(), sync=False)  # type: ignore[arg-type]
    try:
        result = store_tool("stats", "--path", str(tmp_path / "store"))
    finally:
        running.close()
    assert result.returncode == 1
    assert result.stderr.strip().endswith("(stop the broker first)")
    assert len(result.stderr.strip().splitlines()) == 1
    missing = store_tool("check", "--path", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no store at" in missing.stderr
