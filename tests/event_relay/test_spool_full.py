"""A spool that cannot write (a full disk): memory keeps its bound, the events it lets go
of unwritten are lost, and readers are told so instead of being skipped past them; the
loss survives a restart (the floor is written once the disk takes writes again)."""

from __future__ import annotations

import asyncio

import pytest

from event_relay.log import SEGMENT, EventLog, OutOfRange
from event_relay.spool import Spool


class FullDisk(Spool):
    """A real LevelDB spool whose writes fail while `full` (the disk is full)."""

    full = False

    def write(self, events, sync=False):
        if self.full:
            self.failed = True
            return False
        return super().write(events, sync)


def event(i: int) -> list:
    return [0, i, 0, f"c{i}", "", None, "s"]


def test_events_memory_lets_go_unwritten_are_reported_lost_not_skipped(tmp_path):
    async def scenario() -> None:
        spool = FullDisk(str(tmp_path / "spool"), max_events=1_000_000)
        log = EventLog(memory_events=2 * SEGMENT, memory_bytes=1 << 30, spool=spool)
        for i in range(SEGMENT):
            log.append(10, event(i))
        assert log.flush()  # the first segment is on disk
        spool.full = True
        for i in range(3 * SEGMENT):  # memory lets two segments go, one of them unwritten
            log.append(10, event(i))
        assert log.lost == SEGMENT
        first = log.first_seq
        assert first == 2 * SEGMENT + 1  # after the lost events, not the spool's oldest
        with pytest.raises(OutOfRange):
            log.read(1, 10)  # before the loss: refused, although the disk still has it
        assert log.read(first, 10) == ([], first)  # served once on disk, not before
        spool.full = False
        assert log.flush()  # the disk works again: the floor is written with the events
        events, _ = log.read(first, 10)
        assert len(events) == 10
        log.close()

        reopened = Spool(str(tmp_path / "spool"), max_events=1_000_000)
        assert reopened.first_seq == first
        assert reopened.next_seq == 4 * SEGMENT + 1
        reopened.close()

    asyncio.run(scenario())
