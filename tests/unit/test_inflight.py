"""The in-flight window (broker/inflight.py): packet ids, the window's size, the QoS 1 and
QoS 2 exchanges, inbound QoS 2 ids. Pure state, driven directly."""

from __future__ import annotations

from broker.inflight import AWAITING_ACK, AWAITING_COMP, InflightWindow
from broker.message import Delivery, Message


def delivery(qos: int, payload: bytes = b"m") -> Delivery:
    return Delivery(Message("t", payload, qos), qos, False)


def test_the_window_is_the_smaller_of_the_limit_and_the_clients_receive_maximum():
    window = InflightWindow(20)
    window.open(5)
    assert window.size == 5
    window.open(100)
    assert window.size == 20
    assert InflightWindow(0).size == 65535  # 0: no limit of ours


def test_packet_ids_wrap_at_65535_and_skip_those_in_flight():
    window = InflightWindow(0)
    window.restore([(65534, delivery(1), AWAITING_ACK), (1, delivery(1), AWAITING_ACK)])
    assert window.add(delivery(1)) == 65535
    assert window.add(delivery(1)) == 2  # 1 is still in flight


def test_puback_completes_qos1_only():
    window = InflightWindow(10)
    one, two = delivery(1), delivery(2)
    id_one, id_two = window.add(one), window.add(two)
    assert window.puback(id_two) is None  # a QoS 2 message is not completed by PUBACK
    assert window.puback(id_one) is one
    assert window.puback(id_one) is None  # once
    assert list(window.entries) == [id_two]


def test_qos2_pubrec_then_pubcomp():
    window = InflightWindow(10)
    two = delivery(2)
    packet_id = window.add(two)
    assert not window.pubcomp(packet_id)  # PUBCOMP before PUBREC ends nothing
    assert window.pubrec(packet_id) is two
    assert window.entries[packet_id] == [two, AWAITING_COMP]
    assert window.unacknowledged() == []  # answered: not sent again as a PUBLISH
    assert window.pubcomp(packet_id)
    assert not window.entries


def test_remove_sent_takes_out_the_deliveries_that_left():
    window = InflightWindow(10)
    kept, gone = delivery(1, b"kept"), delivery(1, b"gone")
    kept_id, gone_id = window.add(kept), window.add(gone)
    assert window.remove_sent({id(gone)}) == [gone_id]
    assert list(window.entries) == [kept_id]


def test_inbound_qos2_ids_are_released_once():
    window = InflightWindow(10)
    window.receive_qos2(7)
    assert 7 in window.received
    assert window.release_qos2(7)
    assert not window.release_qos2(7)
    assert not InflightWindow(10).release_qos2(7)


def test_due_for_retry_is_what_was_in_flight_at_the_mark_and_still_is():
    window = InflightWindow(10)
    acked, kept = window.add(delivery(1)), window.add(delivery(1))
    window.mark_for_retry()
    later = window.add(delivery(1))  # sent after the mark: not due yet
    window.puback(acked)
    assert window.due_for_retry() == [kept]
    window.mark_for_retry()
    assert window.due_for_retry() == [kept, later]
