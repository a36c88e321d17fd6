"""Client id -> session: takeover, clean start, session expiry and delayed wills.

The lifetime rules, MQTT 5 wording (MQTT 3 maps clean session on to expiry 0 and off to
`persistent_client_expiration`, 0 meaning never):
- A CONNECT for a client id that is connected takes the session over: the old connection
  is closed (MQTT 5: DISCONNECT 0x8E) [MQTT-3.1.4-3].
- Clean start discards an existing session; otherwise the session resumes and a will still
  waiting for its delay is cancelled [MQTT-3.1.2-4/5, 3.1.3.2.2].
- When the connection ends the session lives on for its expiry interval; its will is
  published after min(will delay, session expiry), or at once when the session ends.
- With `allow_multiple_sessions` the session is a MultiSession: a CONNECT joins it
  instead of taking it over, and it goes offline only when its last connection ends
  (broker/multi_session.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.multi_session import MultiSession
from broker.session import AWAITING_ACK, Session
from hooks import ClientContext

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.server import Broker

log = logging.getLogger("nautilus.registry")


class Registry:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.sessions: dict[str, Session] = {}

    def connect(
        self, connection: Connection, client_id: str, clean_start: bool, expiry: int | None
    ) -> tuple[Session, bool]:
        """Attach `connection` to its session; returns (session, session_present)."""
        session = self.sessions.get(client_id)
        if session is not None and session.connection is not None:
            old = session.connection
            old.take_over()
            self._release(old)
            session = self.sessions.get(client_id)
        if session is not None and not session.online:
            if session.expiry_timer is not None:
                session.expiry_timer.cancel()
                session.expiry_timer = None
            if clean_start:
                self.end(session)
                session = None
            elif session.pending_will is not None:
                session.pending_will[0].cancel()
                session.pending_will = None
        present = session is not None
        if session is None:
            session = self.broker.new_session(client_id)
            self.sessions[client_id] = session
        session.expiry = expiry
        if expiry == 0:
            self.broker.store.delete_session(client_id)
        else:
            self.broker.save_session(session)
        if isinstance(session, MultiSession):
            return session.new_member(), present  # allow_multiple_sessions: join the others
        return session, present

    def adopt(self, session: Session, expires_in: float | None) -> None:
        """Register an offline session restored from the store."""
        self.sessions[session.client_id] = session
        if expires_in is not None:
            session.expiry_timer = self.broker.loop.call_later(expires_in, self.expire, session)

    def disconnected(self, connection: Connection) -> None:
        session = connection.session
        if session is not None and session.connection is connection:
            self._release(connection)

    def _release(self, connection: Connection) -> None:
        session = connection.session
        connection.session = None
        session.detach()
        will, connection.will = connection.will, None
        if session.owner is not session:  # one of a client id's several connections
            owner = session.owner
            owner.leave(session)
            if owner.online:  # the others carry on: only this connection's will is due
                self._event("on_client_offline", connection)
                if will is not None:
                    self.broker.loop.call_later(connection.will_delay, self.broker.publish, will)
                return
            session = owner  # that was the last: the client id goes offline
        self.broker.save_session(session)
        if session.expiry == 0:
            if will is not None:
                self.broker.publish(will)
            self.end(session)
            self._event("on_client_gone", connection)
            return
        self._event("on_client_offline", connection)
        if will is not None:
            delay = connection.will_delay
            if session.expiry is not None:
                delay = min(delay, session.expiry)
            if delay:
                timer = self.broker.loop.call_later(delay, self._publish_will, session)
                session.pending_will = (timer, will)
            else:
                self.broker.publish(will)
        if session.expiry is not None:
            session.expiry_timer = self.broker.loop.call_later(session.expiry, self.expire, session)

    def expire(self, session: Session) -> None:
        """The session stayed offline past its expiry interval."""
        self.end(session)
        hooks = self.broker.hooks
        if hooks.chain("on_session_expired"):
            hooks.notify("on_session_expired", ClientContext(client_id=session.client_id))

    def _event(self, hook: str, connection: Connection) -> None:
        hooks = self.broker.hooks
        if hooks.chain(hook):
            context = ClientContext(
                client_id=connection.client_id,
                username=connection.username,
                attributes=connection.attributes,
            )
            hooks.notify(hook, context)

    def _publish_will(self, session: Session) -> None:
        _, will = session.pending_will
        session.pending_will = None
        self.broker.publish(will)

    @staticmethod
    def _shared_deliveries(session: Session) -> list:
        """(group, message) of the QoS 1/2 messages that reached this session through a
        shared group and were not acknowledged (PUBLISH unanswered, or still queued):
        when the session ends they go to another member of the group."""
        found = []
        pending = [
            delivery for delivery, state in session.inflight.values() if state == AWAITING_ACK
        ]
        pending.extend(session.queue)
        for message, qos, _, sub_ids in pending:
            group = getattr(sub_ids, "group", None)
            if group is not None and qos:
                found.append((group, message))
        return found

    def end(self, session: Session) -> None:
        """The session is over: publish a will still pending, forget its state."""
        if session.pending_will is not None:
            timer, will = session.pending_will
            timer.cancel()
            session.pending_will = None
            self.broker.publish(will)
        if session.expiry_timer is not None:
            session.expiry_timer.cancel()
            session.expiry_timer = None
        unacked = self._shared_deliveries(session)
        for topic_filter in list(session.subscriptions):
            self.broker.unsubscribe(session, topic_filter)
        session.queue.clear()
        session.inflight.clear()
        if unacked:
            settings = self.broker.settings
            for group, message in unacked:
                # The session left the group above: another member gets it, if any remains.
                group.deliver(
                    message, settings.shared_subscription_policy, settings.upgrade_outgoing_qos
                )
        self.broker.store.delete_session(session.client_id)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
