"""Several connections on one client id: VerneMQ's `allow_multiple_sessions`.

With the setting on, a CONNECT for a client id that is already connected does not take the
session over: the new connection joins it. What belongs to the client id (subscriptions,
the offline queue, session expiry) is held by one MultiSession; each connection gets a
member: a Session of its own for what MQTT keeps per connection (packet ids, the in-flight
window, its own backlog when its socket is slow), whose `group` is the MultiSession.

While members are attached, `queue_deliver_mode` decides where a message goes:
- fanout: every member gets a copy;
- balance: one member: from a random one on, the first with room (in-flight window and
  socket), else the first whose queue is below its high-water mark, else that random one.

With no member attached the MultiSession is an ordinary offline session: QoS 1/2 messages
wait (and are stored) for the next connection, which gets them first.

When a member's connection ends, the messages it had not acknowledged are not lost: in
balance mode they go to another member (or the offline queue); in fanout mode the other
members have their own copies, so they are kept only when it was the last member.
Clean start is ignored while other connections are attached: their queue is in use.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from broker.message import Delivery
from broker.session import Session

if TYPE_CHECKING:
    from broker.flow import Subscriber


class MultiSession(Session):
    __slots__ = ("_member_options", "balance", "members")

    def __init__(self, subscriber_id: str, *, balance: bool, **options: Any) -> None:
        super().__init__(subscriber_id, **options)
        self.members: list[Session] = []
        self.balance = balance
        self._member_options = options  # each connection starts from the configured limits

    def __repr__(self) -> str:
        return f"<MultiSession {self.subscriber_id!r} members={len(self.members)}>"

    @property
    def online(self) -> bool:
        return bool(self.members)

    def full(self) -> bool:
        return self.must_wait_for() is not None

    def must_wait_for(self) -> Session | None:
        """fanout: a member at its high-water mark; balance: the client id itself when all
        its members are (released when any of them drains, see `watched`)."""
        if self.balance:
            if self.stuck or not self.members:
                return None
            for member in self.members:
                if not member.full():
                    return None
            return self
        for member in self.members:
            if member.full():
                return member
        return None

    def watched(self) -> tuple[Session, ...]:
        """balance: the members, any of which releases a publisher waiting for them all
        (flow.Subscriber); fanout: none (a publisher waits for the full member itself)."""
        return tuple(self.members) if self.balance else ()

    def new_member(self) -> Session:
        """A session for one more connection; it joins when the connection attaches."""
        member = Session(self.subscriber_id, **self._member_options)
        member.owner = self
        member.group = self
        member.subscriptions = self.subscriptions  # one set per client id
        return member  # expiry 0: a member is never stored itself

    def join(self, member: Session) -> None:
        """A member is attached: the queue kept while offline goes to the members."""
        self.members.append(member)
        if len(self.members) > 1:
            return
        backlog = list(self.queue)
        backlog += self.stored_backlog()
        self.queue.clear()
        for delivery in backlog:  # the members' state is per connection: never stored
            self.queue.forget(delivery)
            self.deliver(delivery)

    def wrote(self) -> None:
        """A member wrote a message: what flow control's stall check reads in balance
        mode, where this session is the subscriber publishers wait for."""
        self.progress += 1
        self.stuck = False

    def leave(self, member: Session) -> None:
        """A member's connection ended: hand on what it left unacknowledged."""
        self.members.remove(member)
        unacked = member.take_back()
        if self.members and not self.balance:
            return  # fanout: every other member got its own copy
        for delivery in unacked:
            self.deliver(delivery)  # another member, or the offline queue

    def takes_run(self, level: int, longest: int) -> bool:
        return False  # each message goes to one of its connections: one at a time

    def deliver(self, delivery: Delivery) -> Subscriber | None:
        """Returns the subscriber the publisher must wait for (a member whose queue is
        full enough, or with `balance` this session once no member has room), if any."""
        members = self.members
        if not members:
            return super().deliver(delivery)
        if self.balance:  # the publisher waits only once no member has room left
            return self._pick(delivery.qos).deliver(delivery) and self.must_wait_for()
        congested = None
        for member in members:
            congested = member.deliver(delivery) or congested
        return congested

    def _pick(self, qos: int) -> Session:
        """balance: from a random member on, the first with room (it sends at once), else
        the first whose queue is below its high-water mark, else that random one (no list
        built per message)."""
        members = self.members
        count = len(members)
        start = random.randrange(count)
        below = None
        for step in range(count):
            member = members[(start + step) % count]
            if member.has_room(qos):
                return member
            if below is None and not member.full():
                below = member
        return members[start] if below is None else below
