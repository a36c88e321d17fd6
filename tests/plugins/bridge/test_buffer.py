"""The bridge's outgoing buffer: bounded, in order, in flight until done, back on a lost
send; on disk, the same after a reopen (plugins/bridge/buffer.py)."""

from __future__ import annotations

import pytest

from broker.protocol import Publish
from plugins.bridge.buffer import DiskBuffer, MemoryBuffer


@pytest.fixture(params=["memory", "disk"])
def make(request, tmp_path):
    def build(bound):
        if request.param == "memory":
            return MemoryBuffer(bound)
        return DiskBuffer(bound, str(tmp_path / "queue"))

    return build


def test_bounded_in_order_and_in_flight_until_done(make):
    buffer = make(3)
    for i in range(4):
        assert buffer.put(Publish(f"t/{i}", b"x", 1)) is (i < 3)  # the fourth: refused
    first, _ = buffer.take()
    second, message = buffer.take()
    assert message.topic == "t/1" and len(buffer) == 3  # in flight still counts
    buffer.back(second)  # its send was cut off: next again
    assert buffer.take()[1].topic == "t/1"
    buffer.done(first)
    assert len(buffer) == 2 and buffer.put(Publish("t/4", b"x", 0))
    buffer.close()


def test_a_disk_buffer_comes_back_in_order_without_what_was_done(tmp_path):
    path = str(tmp_path / "queue")
    buffer = DiskBuffer(10, path)
    properties = {38: [("origin", "edge")], 3: "text/plain"}
    for i in range(3):
        buffer.put(Publish(f"t/{i}", b"%d" % i, 1, i == 2, properties=properties))
    token, _ = buffer.take()
    buffer.done(token)  # the remote had t/0
    buffer.take()  # t/1 in flight when the broker stopped: sent again
    buffer.close()
    again = DiskBuffer(10, path)
    kept = [again.take()[1] for _ in range(len(again))]
    assert [(m.topic, m.payload, m.retain) for m in kept] == [
        ("t/1", b"1", False),
        ("t/2", b"2", True),
    ]
    assert kept[0].properties == properties  # user properties as pairs again
    assert again.put(Publish("t/3", b"3", 0))  # numbered after what was there
    again.close()
