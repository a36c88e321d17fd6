"""What a session's client acknowledges, and what is sent again while it does not.

Outbound QoS 1/2 messages wait in the in-flight window (broker/inflight.py, state only)
under their packet ids: PUBACK ends a QoS 1 delivery, PUBREC a QoS 2 one's PUBLISH (then
PUBREL is owed until PUBCOMP). Each acknowledgement frees a slot, refilled from the
queue; a durable session's store forgets the delivery as the window does. The packet
ids of inbound QoS 2 PUBLISHes wait in the window for their PUBREL, so that a resent
PUBLISH is not routed twice [MQTT-4.3.3].

What is unacknowledged is sent again, with DUP, when the session resumes on a new
connection [MQTT-4.4.0-1], and for an MQTT 3 client also every `retry_interval`
(VerneMQ's; MQTT 5 forbids resending within a connection).

`Acknowledgements` is a part of the Session (broker/session.py): it works on the
session's state (broker/session_state.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.inflight import AWAITING_ACK, AWAITING_COMP
from broker.protocol import MQTT5, PubRel, ReasonCode
from broker.session_state import SessionState

if TYPE_CHECKING:
    from broker.message import Delivery
    from broker.outlet import Outlet


class Acknowledgements(SessionState):
    __slots__ = ()

    # The Session's (broker/session.py): refilling the window from the queue; and
    # broker/delivery_hooks.py's on_delivery_complete.
    drain: Callable[[], None]
    _completed: Callable[[Delivery], None]

    def _resend(self, outlet: Outlet, packet_id: int) -> None:
        """Send an unacknowledged PUBLISH again with DUP, or its PUBREL [MQTT-4.4.0-1]."""
        delivery, state = self.window.entries[packet_id]
        if state == AWAITING_ACK:
            template = delivery.message.template(
                outlet.client.protocol_level,
                delivery.qos,
                delivery.retain,
                delivery.sub_ids,
                self.clock.time(),
            )
            outlet.write(template.with_packet_id(packet_id, dup=True))
        else:
            outlet.send(PubRel(packet_id))

    # -- retry_interval: MQTT 3 clients only ---------------------------------------------

    def _arm_retry(self, outlet: Outlet) -> None:
        """VerneMQ's retry_interval: resend what a 3.x client left unacknowledged that long.
        MQTT 5 forbids resending within a connection [MQTT-4.4.0-1], so never for 5.0."""
        if (
            self.retry_interval
            and outlet.client.protocol_level < MQTT5
            and self._retry_timer is None
        ):
            self.window.mark_for_retry()
            self._retry_timer = self.clock.call_later(self.retry_interval, self._retry)

    def _retry(self) -> None:
        """Resend what was in flight at the last tick and still is: unacknowledged for
        between one and two intervals."""
        self._retry_timer = None
        outlet = self.outlet
        if outlet is None:
            return
        for packet_id in self.window.due_for_retry():
            self.metrics.queue_message_retried += 1
            self._resend(outlet, packet_id)
        if self.window.entries:
            self._arm_retry(outlet)

    # -- inbound QoS 2 -------------------------------------------------------------------

    def receive_qos2(self, packet_id: int) -> None:
        """An inbound QoS 2 PUBLISH was routed: a resend of it must not be [MQTT-4.3.3]."""
        self.window.receive_qos2(packet_id)
        if self.durable:
            self.store.put_received(self.subscriber_id, packet_id)

    def release_qos2(self, packet_id: int) -> bool:
        """PUBREL: False when the packet id was not awaiting one."""
        if not self.window.release_qos2(packet_id):
            return False
        if self.durable:
            self.store.delete_received(self.subscriber_id, packet_id)
        return True

    # -- acknowledgements from the client ----------------------------------------------

    def on_pubacks(self, packet_ids: list[int]) -> None:
        """PUBACKs, in order: their deliveries are complete, and the window's free slots
        are refilled from the queue in one drain."""
        window = self.window
        completed = False
        for packet_id in packet_ids:
            delivery = window.puback(packet_id)
            if delivery is not None:
                if self.durable:
                    self.store.delete_inflight(self.subscriber_id, packet_id)
                    self.queue.forget(delivery)
                self._completed(delivery)
                completed = True
        if completed:
            self.drain()

    def on_pubrec(self, packet_id: int, reason_code: int) -> int:
        """Returns the reason code for our PUBREL [MQTT-4.3.3]."""
        delivery = self.window.pubrec(packet_id)
        if delivery is None:
            return ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        stored = self.durable
        if stored:
            self.queue.forget(delivery)  # the receiver has it (or refused it): the body goes
        if reason_code >= 0x80:  # the receiver refused the message: the exchange ends here
            self.window.remove(packet_id)
            if stored:
                self.store.delete_inflight(self.subscriber_id, packet_id)
            self.drain()
            return -1
        if stored:  # only the packet id is kept now, for the PUBREL
            self.store.put_inflight(self.subscriber_id, packet_id, 0, AWAITING_COMP)
        self._completed(delivery)  # Courier: on PUBREC for QoS 2
        return ReasonCode.SUCCESS

    def on_pubcomp(self, packet_id: int) -> None:
        if self.window.pubcomp(packet_id):
            if self.durable:
                self.store.delete_inflight(self.subscriber_id, packet_id)
            self.drain()
