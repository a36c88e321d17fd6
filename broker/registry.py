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
session `connect` returns, and hands it back with `disconnected` (with its will) when it
ends; a takeover asks the old connection to `take_over()`, which hands it back before
returning.

It is also where sessions are made (`new_session`), saved to the store (`save`), restored
from it at start (`restore`), and where their subscriptions change (`subscribe`), so that
the router, the store and the other nodes (`routing.peers`) hear of each change. It reads
as a mapping, client id -> session; only its methods change it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, ValuesView
from typing import TYPE_CHECKING, Any

from broker.message import Delivery, Message
from broker.multi_session import MultiSession
from broker.session import Session
from broker.store import SessionRecord
from broker.subscription_trie import SHARE_PREFIX
from hooks import Chain, ClientContext

if TYPE_CHECKING:
    from broker.clock import Clock
    from broker.config import BrokerSettings
    from broker.flow import FlowControl
    from broker.hook_callers import HookCallers
    from broker.ingress import Ingress
    from broker.metrics import Metrics
    from broker.routing import Routing
    from broker.store import MessageStore
    from broker.subscription_trie import SharedGroup, SubOptions

log = logging.getLogger("nautilus.registry")


def session_factory(
    settings: BrokerSettings,
    metrics: Metrics,
    store: MessageStore,
    chains: HookCallers,
    clock: Clock,
    flow: FlowControl,
    find_group: Callable[[str], SharedGroup | None],
) -> Callable[[str], Session]:
    """What makes a client's session, as the settings say (allow_multiple_sessions: one
    shared by several connections)."""

    def new_session(subscriber_id: str) -> Session:
        s = settings
        options: dict[str, Any] = dict(
            max_inflight=s.max_inflight_messages,
            max_online=s.max_online_messages,
            max_offline=s.max_offline_messages,
            lifo=s.queue_type == "lifo",
            metrics=metrics,
            store=store,
            chains=chains,
            clock=clock,
            flow=flow,
            retry_interval=s.retry_interval,
            find_group=find_group,
            drain_step=s.max_msgs_per_drain_step,
        )
        if s.allow_multiple_sessions:
            balance = s.queue_deliver_mode == "balance"
            return MultiSession(subscriber_id, balance=balance, **options)
        return Session(subscriber_id, **options)

    return new_session


class Registry(Mapping[str, Session]):
    """The sessions by subscriber id: the client id, on a mountpoint prefixed by it
    (broker/mountpoints.py)."""

    def __init__(
        self,
        make_session: Callable[[str], Session],
        routing: Routing,
        ingress: Ingress,
        store: MessageStore,
        chains: HookCallers,
        clock: Clock,
    ) -> None:
        self.new_session = make_session  # a session for a client id, not registered
        self.routing = routing  # subscriptions (its router), a shared group's members
        self.publish_will = ingress.publish_own  # wills: authorized at their CONNECT
        self.store = store
        self.chains = chains
        self.clock = clock
        self._sessions: dict[str, Session] = {}

    # -- the mapping ------------------------------------------------------------------

    def __getitem__(self, client_id: str) -> Session:
        return self._sessions[client_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._sessions

    def get(self, client_id: str, default: Session | None = None) -> Session | None:  # type: ignore[override]
        return self._sessions.get(client_id, default)

    def values(self) -> ValuesView[Session]:
        """The sessions, from the dict itself (Mapping's would look each one up)."""
        return self._sessions.values()

    # -- connections come and go --------------------------------------------------------

    def connect(
        self, client_id: str, clean_start: bool, expiry: int | None
    ) -> tuple[Session, bool]:
        """The session a new connection of `client_id` attaches to, and whether it existed
        (CONNACK's session present); an older connection of that client is taken over."""
        sessions = self._sessions
        session = sessions.get(client_id)
        if session is not None and session.outlet is not None:
            session.outlet.take_over()  # it releases the session before returning
            session = sessions.get(client_id)
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
            session = self.new_session(client_id)
            sessions[client_id] = session
        if expiry == 0 and session.durable:
            session.make_volatile()  # it ends with this connection: memory holds it all
        session.expiry = expiry
        if expiry == 0:
            self.store.delete_session(client_id)
        else:
            self.save(session)
        if isinstance(session, MultiSession):
            return session.new_member(), present  # allow_multiple_sessions: join the others
        return session, present

    def adopt(self, session: Session, expires_in: float | None) -> None:
        """Register an offline session (restored from the store, or taken from a node
        that died) that ends in `expires_in` seconds unless its client comes back."""
        self._sessions[session.subscriber_id] = session
        if expires_in is not None:
            session.expiry_timer = self.clock.call_later(expires_in, self.expire, session)

    def disconnected(
        self, session: Session, will: Message | None, will_delay: int, client: ClientContext
    ) -> None:
        """A connection ended: its session goes offline (or ends), its will is due."""
        session.detach()
        owner = session.owner
        if isinstance(owner, MultiSession) and session is not owner:  # one of several
            owner.leave(session)
            if owner.online:  # the others carry on: only this connection's will is due
                self._event(self.chains.on_client_offline, client)
                if will is not None:
                    self.clock.call_later(will_delay, self.publish_will, will)
                return
            session = owner  # that was the last: the client id goes offline
        self.save(session)
        if session.expiry == 0:
            if will is not None:
                self.publish_will(will)
            self.end(session)
            self._event(self.chains.on_client_gone, client)
            return
        self._event(self.chains.on_client_offline, client)
        if will is not None:
            delay = will_delay
            if session.expiry is not None:
                delay = min(delay, session.expiry)
            if delay:
                timer = self.clock.call_later(delay, self._publish_will, session)
                session.pending_will = (timer, will)
            else:
                self.publish_will(will)
        if session.expiry is not None:
            session.expiry_timer = self.clock.call_later(session.expiry, self.expire, session)

    def send_retained(self, session: Session, topic_filter: str, options: SubOptions) -> None:
        """The retained messages a new subscription of `session` gets (Routing)."""
        self.routing.send_retained(session, topic_filter, options)

    def expire(self, session: Session) -> None:
        """The session stayed offline past its expiry interval."""
        self.end(session)
        chains = self.chains
        if chains.on_session_expired:
            context = ClientContext(
                client_id=session.client_id,
                mountpoint=session.mountpoint,
                username=session.username,
                session_id=session.session_id,
            )
            chains.notify(chains.on_session_expired, context)

    def _event(self, chain: Chain, client: ClientContext) -> None:
        if chain:
            self.chains.notify(chain, client)

    def _publish_will(self, session: Session) -> None:
        assert session.pending_will is not None
        _, will = session.pending_will
        session.pending_will = None
        self.publish_will(will)

    @staticmethod
    def _shared_deliveries(session: Session) -> list[Delivery]:
        """The QoS 1/2 deliveries that reached this session through a shared group and
        were not acknowledged (PUBLISH unanswered, or still queued): when the session ends
        they go to another member of the group."""
        pending = session.window.unacknowledged()
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
            self.publish_will(will)
        if session.expiry_timer is not None:
            session.expiry_timer.cancel()
            session.expiry_timer = None
        unacked = self._shared_deliveries(session)
        for topic_filter in list(session.subscriptions):
            self.unsubscribe(session, topic_filter)
        session.queue.clear()
        session.window.entries.clear()
        for delivery in unacked:
            # The session left the group above: another member gets it, if any remains.
            assert delivery.group is not None
            self.routing.deliver_shared(delivery.group, delivery.message)
        self.store.delete_session(session.subscriber_id)
        if self.forget(session):
            self.routing.peers.changed(session.subscriber_id)

    def forget(self, session: Session) -> bool:
        """Unregister the session, without ending it (it moved to another node); False
        when it is not the one registered for its client id."""
        if self._sessions.get(session.subscriber_id) is not session:
            return False
        del self._sessions[session.subscriber_id]
        return True

    def disconnect(self, session: Session) -> None:
        """Take the session's connections over (each releases it before this returns)."""
        members = session.members if isinstance(session, MultiSession) else (session,)
        for member in list(members):
            if member.outlet is not None:
                member.outlet.take_over()

    # -- what sessions are, and what they subscribe to ------------------------------------

    def save(self, session: Session) -> None:
        """Write a persistent session's record (not its queue) to the store."""
        if self.store.persistent and session.expiry != 0:
            offline_since = 0.0 if session.online else time.time()
            record = SessionRecord(
                session.subscriber_id, session.expiry, offline_since, dict(session.subscriptions)
            )
            self.store.put_session(record)

    def subscribe(self, session: Session, topic_filter: str, options: SubOptions) -> bool:
        """Add (or replace) a subscription of the session; True if it is new."""
        session.subscriptions[topic_filter] = options
        self.save(session)
        self.routing.peers.changed(session.subscriber_id)
        return self.routing.router.subscribe(session, topic_filter, options)

    def unsubscribe(self, session: Session, topic_filter: str) -> bool:
        """Remove a subscription of the session; True if it had it."""
        if session.subscriptions.pop(topic_filter, None) is not None:
            self.save(session)
            self.routing.peers.changed(session.subscriber_id)
        return self.routing.router.unsubscribe(session, topic_filter)

    def restore(self) -> int:
        """Register the persistent sessions a previous run stored, offline; those whose
        expiry passed meanwhile are deleted. Returns how many messages they have queued
        (read from the store when their clients connect)."""
        now = time.time()
        queued = 0
        router = self.routing.router
        for record in self.store.load_sessions():
            remaining = None
            if record.expiry is not None:
                # 0: it was online when the broker stopped: offline from this start on.
                offline_since = record.offline_since or now
                remaining = offline_since + record.expiry - now
                if remaining <= 0:
                    self.store.delete_session(record.client_id)
                    continue
            session = self.new_session(record.client_id)
            session.expiry = record.expiry
            for topic_filter, options in record.subscriptions.items():
                session.subscriptions[topic_filter] = options
                router.subscribe(session, topic_filter, options)
            session.restore(record.queued, record.next_seq)
            queued += record.queued
            self.adopt(session, remaining)
        return queued
