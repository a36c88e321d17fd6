"""The ingress: the one way a message comes into routing, whatever brought it.

Every message takes the same steps, in the same order, and each step is written here
once:

    admission -> authorize -> modifiers -> flow check -> recorder -> on_publish ->
    route -> drop accounting -> the acknowledgement promise

What brought it decides only which of the steps it takes:
- an MQTT PUBLISH (client/publish.py): authorized by auth_on_publish(_m5); held while a
  subscriber it feeds is full; its events; its PUBACK / PUBREC waits in its writer for
  `kept`;
- a publish over HTTP (on_behalf.py): authorized by auth_on_publish_m5; refused while a
  subscriber is full; its events; answered once `kept`;
- a will (registry.py), authorized at its CONNECT, and $SYS (systree.py), the broker's
  own: routed, with no events (`publish_own`);
- another node's (cluster/): authorized and told at its origin; its link waits while a
  subscriber is full (`forwarded`).

"Events" are the recorder's `published`, `on_publish`, and `on_message_drop` for a
message nobody subscribed to (Courier's). Per-connection MQTT rules (topic aliases, the
UTF-8 flag, QoS 2 duplicates, the run of QoS 0 PUBLISHes one read brought) stay with the
client; what they route comes here.

An authorization is data (`Decision`): a caller may keep it and reuse it for a run of
messages it holds for. The chain's answer itself is kept per connection when every plugin
it asked said how long its answer holds (`cache_for`, hooks/decisions.py): `recall` gives
it back for the next message to the same (topic, QoS, retain) until then, or until a
plugin or an operator calls `forget_decisions()` (a reload, `admin auth invalidate`), so
the chain is not asked again (`remember` keeps it). A kept denial is handled as a fresh
one: refused, logged, counted, told.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.authorization import apply_publish_modifiers
from broker.message import Message
from broker.mountpoints import inside
from broker.protocol import MQTT5, Publish, Will
from hooks import Chain, MatchedAcl, Ok, PublishContext, Result
from hooks.decisions import GENERATION
from hooks.spec import new_publish_context

if TYPE_CHECKING:
    from broker.client_state import ClientState
    from broker.flow import FlowControl, Reader, Subscriber
    from broker.hook_callers import HookCallers
    from broker.metrics import Metrics
    from broker.routing import Routing
    from broker.store import MessageStore
    from hooks.recorder import RecordedClient

# Why a message is not taken before anything is asked of it (`closed_for`).
NETSPLIT = "a netsplit (allow_publish_during_netsplit is off)"
UNSTORABLE = "the broker cannot store messages now"
NO_SUBSCRIBERS = "no_matching_subscribers"  # on_message_drop's reason (Courier's)
_NOBODY: list[Subscriber] = []  # shared, never appended to: nobody to wait for
DECISIONS_KEPT = 64  # auth_on_publish answers kept per connection; the oldest goes first


@dataclass(frozen=True, slots=True)
class Decision:
    """What authorization decided for one message: allowed or not, and whether the
    plugins' modifiers changed it (then the context holds the message as it goes)."""

    allowed: bool
    changed: bool
    result: Result


ALLOWED = Decision(True, False, Ok())  # no plugin decides: every message is allowed


class Ingress:
    __slots__ = ("before_ack", "chains", "flow", "metrics", "routing", "store")

    def __init__(
        self,
        routing: Routing,
        flow: FlowControl,
        chains: HookCallers,
        store: MessageStore,
        metrics: Metrics,
        before_ack: Sequence[Callable[[], bool]],
    ) -> None:
        self.routing = routing
        self.flow = flow
        self.chains = chains
        self.store = store
        self.metrics = metrics
        # The enabled plugins that keep something before an ack (the Broker sets them
        # anew when one is enabled or disabled).
        self.before_ack = before_ack

    # -- admission: before anything is asked of the message ----------------------------

    def closed_for(self, qos: int) -> str | None:
        """Why no message of this QoS is taken now: a netsplit while publishing is not
        allowed during one (VerneMQ's switch), or, for QoS 1/2, a store that cannot write
        (a full disk; tried again first: there may be room by now). None: it is taken."""
        peers = self.routing.peers
        if peers.split and peers.refuses("publish") is not None:
            return NETSPLIT
        if qos and self.store.failed:
            self.store.commit()
            if self.store.failed:
                return UNSTORABLE
        return None

    # -- authorize, modifiers ----------------------------------------------------------

    def authorizer(self, v5: bool) -> Chain | None:
        """The auth_on_publish chain for an MQTT 5 publisher (or an older one); None when
        no plugin decides: every message is allowed (ALLOWED)."""
        return self.chains.auth_on_publish[v5] or None

    @staticmethod
    def recall(client: ClientState, packet: Publish, now: float) -> Result | None:
        """The chain's kept answer for a message like `packet` from `client` while it
        holds (`now`: the broker's clock); None: the chain must be asked."""
        decisions = client.decisions
        if decisions is None:
            return None
        key = (packet.topic, packet.qos, packet.retain)
        kept = decisions.get(key)
        if kept is None:
            return None
        result, until, generation = kept
        if now < until and generation == GENERATION.value:
            return result
        del decisions[key]
        return None

    @staticmethod
    def remember(
        client: ClientState, packet: Publish, result: Result, now: float, generation: int
    ) -> None:
        """Keep the chain's answer for `packet` if it says how long it holds and nothing
        was forgotten since the chain was asked (`generation`: GENERATION.value then)."""
        cache_for = result.cache_for
        if cache_for is None or cache_for <= 0 or generation != GENERATION.value:
            return
        decisions = client.decisions
        if decisions is None:
            decisions = client.decisions = {}
        elif len(decisions) >= DECISIONS_KEPT:
            del decisions[next(iter(decisions))]  # the oldest
        decisions[(packet.topic, packet.qos, packet.retain)] = (result, now + cache_for, generation)

    @staticmethod
    def decided(context: PublishContext, result: Result) -> Decision:
        """The chain's result as a decision, its modifiers applied to `context`."""
        if type(result) is not Ok:
            return Decision(False, False, result)
        return Decision(True, apply_publish_modifiers(context, result), result)

    @staticmethod
    def message(context: PublishContext, sender: str, now: float) -> Message:
        """The message as the plugins left it (`context`, its modifiers applied): a
        plugin may have moved it to another tree."""
        return Message(
            inside(context.mountpoint, context.topic),
            context.payload,
            context.qos,
            context.retain,
            context.properties,
            sender,
            now=now,
        )

    # -- the flow check ----------------------------------------------------------------

    def hold(self, publisher: Reader, subscribers: list[Subscriber]) -> None:
        """Hold `publisher` (it is not read) until `subscribers` have drained."""
        self.flow.hold(publisher, subscribers)

    def forget(self, publisher: Reader) -> None:
        """The publisher is gone: it waits for nobody any more."""
        self.flow.forget_publisher(publisher)

    def waits_for(self, topic: str) -> list[Subscriber]:
        """The full subscribers a message to `topic` must wait for (broker/flow.py):
        looked for only while some subscriber holds publishers, so it costs nothing
        otherwise."""
        return self.routing.full_subscribers(topic) if self.flow.congested else _NOBODY

    # -- recorder, on_publish, route, drop accounting ----------------------------------

    def tells(self, v5: bool) -> bool:
        """Whether a client's publish is told to anyone (the recorder, on_publish, or
        on_message_drop), who must see it as authorization left it (`publish`'s
        context)."""
        chains = self.chains
        return bool(chains.recorder is not None or chains.on_publish[v5] or chains.on_message_drop)

    def publish(
        self,
        message: Message,
        publisher: RecordedClient,
        v5: bool,
        context: PublishContext | None,
        packet: Publish | None = None,
        shared_policy: str | None = None,
    ) -> list[Subscriber] | None:
        """Route an allowed message of a client's (`v5`: an MQTT 5 one, whose hooks are
        the `_m5` ones), with its events. `context`: the authorization's, if one ran: the
        events see the message as the plugins left it; when none ran, the events that
        need one get `context_of(publisher, packet)` (made only then: `publisher` is the
        client's ClientState). Returns the subscribers whose queues it filled
        (Routing.publish): the caller decides what waiting means for it."""
        chains = self.chains
        matched = context.matched_acl if context is not None else None
        if matched is not None:
            message.acl_name = matched.name  # deliveries report the publisher's rule
        recorder = chains.recorder
        if recorder is not None:  # before routing: the publish is told before its deliveries
            recorder.published(publisher, message, matched)
        on_publish = chains.on_publish[v5]
        if on_publish:
            if context is None:
                context = context_of(publisher, packet)  # type: ignore[arg-type]
            chains.notify(on_publish, context)
        routing = self.routing
        full = routing.publish(message, shared_policy)
        if chains.on_message_drop and not routing.reached_anyone:
            if context is None:
                context = context_of(publisher, packet)  # type: ignore[arg-type]
            # A copy: on_publish's tasks may still hold the context.
            dropped = dataclasses.replace(context, reason=NO_SUBSCRIBERS)
            chains.notify(chains.on_message_drop, dropped)
        return full

    def publish_run(
        self,
        publisher: ClientState,
        packets: Sequence[Publish],
        matched: MatchedAcl | None = None,
    ) -> bool:
        """The fast path of QoS 0 floods: a run of PUBLISHes to one topic, unretained,
        without properties, that no plugin authorizes or changes (or whose kept answer
        allows them unchanged: `matched`, the ACL rule it names), as the client sent them
        (their bytes), written in one piece to each matching session that takes them as
        they are (Routing.publish_run) and told to the recorder in one call. False when
        they must be published one at a time (`publish`): an on_publish hook, a subscriber
        that is full or would not take them as they are, a message nobody subscribed to
        while on_message_drop is watched. Then nothing of them was routed."""
        chains = self.chains
        client_topic = packets[0].topic
        topic = inside(publisher.mountpoint, client_topic)
        if (
            self.waits_for(topic)
            or chains.on_publish[publisher.protocol_level == MQTT5]
            or topic.startswith("$SYS")
        ):
            return False
        raws: list[bytes] = [packet.raw for packet in packets]  # type: ignore[misc]
        receivers = self.routing.publish_run(topic, raws, publisher)
        # Nobody subscribed: nothing was written, and each message is dropped, and said so.
        if receivers is None or (not receivers and chains.on_message_drop):
            return False
        recorder = chains.recorder
        if recorder is not None:
            payloads = [packet.payload for packet in packets]
            recorder.published_run(publisher, client_topic, payloads, receivers, matched)
        return True

    def publish_own(self, message: Message) -> None:
        """A message the broker publishes itself: $SYS, and a client's will (authorized at
        its CONNECT). No events: they are not a client's publishes."""
        self.routing.publish(message)

    def forwarded(self, message: Message) -> list[Subscriber] | None:
        """A message another node routed to this one (authorized, recorded and told at its
        origin, which chose the shared groups' members): for this node's sessions only.
        Returns the sessions whose queues it filled: the link from that node waits."""
        return self.routing.publish_forwarded(message)

    # -- the acknowledgement promise ---------------------------------------------------

    def kept(self) -> bool:
        """Keep what this turn acknowledges: the store's batch committed, and every plugin
        that keeps something of a message before it is acknowledged (before_ack: the event
        relay with acknowledged durability) has kept it. False: nothing may be
        acknowledged (the publisher sends again what it has not seen acknowledged)."""
        store = self.store
        store.commit()
        if store.failed:
            return False
        for before_ack in self.before_ack:
            if not before_ack():
                self.metrics.store_publish_refused += 1
                return False
        return True


def context_of(client: ClientState, packet: Publish | Will) -> PublishContext:
    """A client's PUBLISH (or the will its CONNECT carries) as hooks see it."""
    return new_publish_context(
        client.client_id,
        client.username,
        client.attributes,
        client.session_id,
        packet.topic,
        packet.payload,
        packet.qos,
        packet.retain,
        packet.properties,  # plugins change it by modifier, not in place
        mountpoint=client.mountpoint,
    )
