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

The registry never touches a connection's attributes: a connection attaches itself to the
session `connect` returns, and hands it back with `release` (with its will) when it ends;
a takeover asks the old connection to `take_over()`, which releases synchronously.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.message import Delivery, Message
from broker.multi_session import Member, MultiSession
from broker.router import SHARE_PREFIX
from broker.session import AWAITING_ACK, Session
from hooks import Chain, ClientContext

if TYPE_CHECKING:
    from broker.server import Broker

log = logging.getLogger("nautilus.registry")


class Registry:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.sessions: dict[str, Session] = {}

    def connect(
        self, client_id: str, clean_start: bool, expiry: int | None
    ) -> tuple[Session, bool]:
        """The session a new connection of `client_id` attaches to, and whether it existed
        (CONNACK's session present); an older connection of that client is taken over."""
        session = self.sessions.get(client_id)
        if session is not None and session.outlet is not None:
            session.outlet.take_over()  # it releases the session before returning
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
        if expiry == 0 and session.durable:
            session.make_volatile()  # it ends with this connection: memory holds it all
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

    def release(
        self, session: Session, will: Message | None, will_delay: int, client: ClientContext
    ) -> None:
        """A connection ended: its session goes offline (or ends), its will is due."""
        session.detach()
        owner = session.owner
        if isinstance(session, Member) and isinstance(owner, MultiSession):  # one of several
            owner.leave(session)
            if owner.online:  # the others carry on: only this connection's will is due
                self._event(self.broker.chains.on_client_offline, client)
                if will is not None:
                    self.broker.loop.call_later(will_delay, self.broker.publish, will)
                return
            session = owner  # that was the last: the client id goes offline
        self.broker.save_session(session)
        if session.expiry == 0:
            if will is not None:
                self.broker.publish(will)
            self.end(session)
            self._event(self.broker.chains.on_client_gone, client)
            return
        self._event(self.broker.chains.on_client_offline, client)
        if will is not None:
            delay = will_delay
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
        chains = self.broker.chains
        if chains.on_session_expired:
            context = ClientContext(
                client_id=session.client_id,
                username=session.username,
                session_id=session.session_id,
            )
            chains.notify(chains.on_session_expired, context)

    def _event(self, chain: Chain, client: ClientContext) -> None:
        if chain:
            self.broker.chains.notify(chain, client)

    def _publish_will(self, session: Session) -> None:
        assert session.pending_will is not None
        _, will = session.pending_will
        session.pending_will = None
        self.broker.publish(will)

    @staticmethod
    def _shared_deliveries(session: Session) -> list[Delivery]:
        """The QoS 1/2 deliveries that reached this session through a shared group and
        were not acknowledged (PUBLISH unanswered, or still queued): when the session ends
        they go to another member of the group."""
        pending = [
            delivery for delivery, state in session.inflight.values() if state == AWAITING_ACK
        ]
        pending.extend(session.queue)
        if any(topic_filter.startswith(SHARE_PREFIX) for topic_filter in session.subscriptions):
            pending.extend(session.stored_backlog())  # read only when it may hold some
        return [d for d in pending if d.group is not None and d.qos]

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
        policy = self.broker.settings.shared_subscription_policy
        for delivery in unacked:
            # The session left the group above: another member gets it, if any remains.
            assert delivery.group is not None
            self.broker.deliver_shared(delivery.group, delivery.message, policy)
        self.broker.store.delete_session(session.client_id)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
            if self.broker.cluster is not None:
                self.broker.cluster.changed(session.client_id)
