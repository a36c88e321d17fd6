"""Routing: a message to every session whose subscriptions match its topic.

`publish` keeps a retained message (in memory, in the store, and told to the other nodes),
matches the topic in the router and offers the message to each matching session, and to
one member of each matching shared group. A session whose queue is at its high-water mark
is returned: the publisher waits for it (broker/flow.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.message import Delivery, Message
from broker.peers import ALONE, SharedRecords

if TYPE_CHECKING:
    from broker.client_state import ClientState
    from broker.clock import Clock
    from broker.config import BrokerSettings
    from broker.flow import Subscriber
    from broker.metrics import Metrics
    from broker.retain import RetainedMessages
    from broker.session import Session
    from broker.store import MessageStore
    from broker.subscription_trie import Route, SharedGroup, SubOptions, SubscriptionTrie


class Routing:
    def __init__(
        self,
        settings: BrokerSettings,
        router: SubscriptionTrie,
        retained: RetainedMessages,
        store: MessageStore,
        metrics: Metrics,
        clock: Clock,
    ) -> None:
        self.settings = settings
        self.router = router
        self.retained = retained
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.peers: SharedRecords = ALONE  # the cluster's, when this node is in one
        # Whether the last message `publish` routed matched a subscription (or a shared
        # group): on_message_drop's "no subscribers" without matching the topic again.
        self.reached_anyone = False

    def publish(
        self, message: Message, shared_policy: str | None = None
    ) -> list[Subscriber] | None:
        """Route one message to every matching session (and keep it if retained).
        `shared_policy`: the publisher's own shared_subscription_policy, if a plugin set one.

        Returns the subscriber sessions whose queues reached their high-water marks (and
        the shared groups whose members all did), if any: the publisher is held until
        they drain (broker/flow.py).
        """
        if message.retain:
            self.retained.update(message)
            if message.payload:
                self.store.put_retained(message)
            else:
                self.store.delete_retained(message.topic)
            self.peers.retained(message)
        routes = self.router.match(message.topic)
        self.reached_anyone = bool(routes)
        congested = None
        if routes:
            self.metrics.router_matches_local += len(routes)  # a RemoteNode takes its back
            congested = self._offer(routes, message, local_only=False)
        if self.router.group_count:  # $share/<group>/<filter>: one member per group
            policy = shared_policy or self.settings.shared_subscription_policy
            for group in self.router.match_shared(message.topic):
                self.reached_anyone = True
                full = self.deliver_shared(group, message, policy)
                if full is not None:
                    if congested is None:
                        congested = []
                    congested.append(full)
        return congested

    def publish_run(
        self, topic: str, packets: list[bytes], publisher: ClientState
    ) -> list[Session] | None:
        """The fast path of QoS 0 floods: a run of QoS 0 PUBLISHes to `topic`, unretained
        and without properties, as `publisher` sent them, written in one piece to every
        matching session, when each of them would be sent exactly these bytes now
        (Session.takes_run). Returns the sessions written to; None when one would not
        take them, and none of them written (a subscriber may have sent what it had
        queued: takes_run): the caller routes them one at a time."""
        router = self.router
        if router.group_count and router.match_shared(topic):
            return None  # a shared group picks a member per message
        routes = router.match(topic)
        level = publisher.protocol_level
        upgrade = self.settings.upgrade_outgoing_qos
        longest = max(map(len, packets))
        for route in routes:
            if (
                route.subscription_ids
                or (upgrade and route.qos)
                or (route.no_local and route.subscriber.subscriber_id == publisher.subscriber_id)
                or not route.subscriber.takes_run(level, longest)
            ):
                return None
        self.metrics.router_matches_local += len(routes) * len(packets)
        sessions: list[Session] = [route.subscriber for route in routes]
        if sessions:
            data = b"".join(packets)
            for session in sessions:
                session.write_run(data, len(packets))
        return sessions

    def publish_forwarded(self, message: Message) -> list[Subscriber] | None:
        """A message another node forwarded: for this node's own sessions only (the
        origin sent it to every node that needs it, and chose the shared groups' members).
        Returns the sessions whose queues it filled, as `publish` does: the link from
        that node waits for them."""
        return self._offer(self.router.match(message.topic), message, local_only=True)

    def _offer(
        self, routes: list[Route], message: Message, local_only: bool
    ) -> list[Subscriber] | None:
        """Give `message` to the subscriber of each route (this node's sessions only, if
        `local_only`); the subscribers whose queues it filled, if any."""
        sender = message.sender
        qos = message.qos
        retain = message.retain
        upgrade = self.settings.upgrade_outgoing_qos
        congested: list[Subscriber] | None = None
        for route in routes:
            session = route.subscriber
            if local_only and not session.local:
                continue
            if route.no_local and session.subscriber_id == sender:
                own = route.without_no_local()  # [MQTT-3.8.3-3]
                if own is None:
                    continue
                route = own
            full = session.deliver(
                Delivery(
                    message,
                    route.qos if upgrade or qos > route.qos else qos,
                    retain and route.retain_as_published,
                    route.subscription_ids,
                )
            )
            if full is not None:
                if congested is None:
                    congested = []
                congested.append(full)
        return congested

    def has_subscribers(self, topic: str) -> bool:
        """Whether a message to `topic` reaches anyone (the router caches the matches)."""
        if self.router.match(topic):
            return True
        return bool(self.router.group_count and self.router.match_shared(topic))

    def full_subscribers(self, topic: str) -> list[Subscriber]:
        """The online subscribers of `topic` whose queues are at their high-water marks,
        and for each shared group whose online members all are, one of them."""
        full: list[Subscriber] = []
        for route in self.router.match(topic):
            session = route.subscriber.must_wait_for()
            if session is not None:
                full.append(session)
        if self.router.group_count:
            full += [group for group in self.router.match_shared(topic) if group.full()]
        return full

    def deliver_shared(
        self, group: SharedGroup, message: Message, policy: str | None = None
    ) -> SharedGroup | None:
        """Give `message` to one member of a shared group (`policy`: the
        shared_subscription_policy, by default the broker's). Returns the group when no
        member has room left (the publisher waits for it), else None."""
        session = group.pick(policy or self.settings.shared_subscription_policy)
        if session is None:
            return None
        options = group.members[session]
        qos = message.qos
        sub_ids = () if options.subscription_id is None else (options.subscription_id,)
        full = session.deliver(
            Delivery(
                message,
                options.qos if self.settings.upgrade_outgoing_qos or qos > options.qos else qos,
                message.retain and options.retain_as_published,
                sub_ids,
                group,
            )
        )
        # The publisher waits for the group only once no member has room left.
        return group if full is not None and group.full() else None

    def send_retained(self, session: Session, topic_filter: str, options: SubOptions) -> None:
        """Retained messages for a new subscription, with the retain flag set [MQTT-3.3.1-6]."""
        sub_ids = (options.subscription_id,) if options.subscription_id is not None else ()
        for message in self.retained.matching(topic_filter, self.clock.time()):
            session.deliver(Delivery(message, min(message.qos, options.qos), True, sub_ids))
