"""The registry (broker/registry.py) inside a real Broker on a fake loop: takeover, clean
start, session expiry, wills and the client lifecycle events, with time driven by hand.

A connection is played by `Client`: it asks the registry for a session, attaches a
FakeOutlet, and releases the session (with its will) when it goes; a takeover releases
it at once, as broker.connection.Connection.take_over does.
"""

from __future__ import annotations

import pytest

from broker.config import config_from_dict
from broker.message import Message
from broker.peers import Alone
from broker.server import Broker
from broker.session import Session
from broker.subscription_trie import SubOptions
from hooks import ClientContext

from .fakes import FakeLoop, FakeOutlet

WILL_TOPIC = "will/c"


class Lifecycle:
    """A plugin that records the client lifecycle events, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_client_offline(self, ctx: ClientContext) -> None:
        self.seen.append(("offline", ctx.client_id))

    def on_client_gone(self, ctx: ClientContext) -> None:
        self.seen.append(("gone", ctx.client_id))

    def on_session_expired(self, ctx: ClientContext) -> None:
        self.seen.append(("expired", ctx.client_id))


class Client:
    """One network connection of `client_id`, as the registry sees it."""

    def __init__(
        self,
        broker: Broker,
        client_id: str,
        *,
        clean: bool = True,
        expiry: int | None = 0,
        will_delay: int = 0,
        will: bool = False,
    ) -> None:
        self.broker = broker
        self.client_id = client_id
        self.will = Message(WILL_TOPIC, b"gone: " + client_id.encode(), 1) if will else None
        self.will_delay = will_delay
        self.outlet = FakeOutlet(client_id, 5, on_take_over=self.leave)
        self.session, self.present = broker.registry.connect(client_id, clean, expiry)
        self.session.attach(self.outlet, 65535)

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        self.broker.registry.subscribe(self.session, topic_filter, SubOptions(qos))

    def leave(self) -> None:
        """The connection ends (a lost socket: the will is due)."""
        will, self.will = self.will, None
        self.broker.registry.disconnected(
            self.session, will, self.will_delay, ClientContext(client_id=self.client_id)
        )


@pytest.fixture
def loop() -> FakeLoop:
    return FakeLoop()


@pytest.fixture
def lifecycle() -> Lifecycle:
    return Lifecycle()


@pytest.fixture
def broker(loop, lifecycle) -> Broker:
    config = config_from_dict({"store": {"backend": "memory"}})
    return Broker(config, loop=loop, plugins=[("lifecycle", lifecycle)])


@pytest.fixture
def watcher(broker) -> FakeOutlet:
    """The outlet of a client subscribed to every will."""
    client = Client(broker, "watcher")
    client.subscribe("will/#")
    return client.outlet


def session_of(broker: Broker, client_id: str) -> Session | None:
    return broker.registry.get(client_id)


def subscribers(broker: Broker, topic: str) -> list[str]:
    return [route.subscriber.client_id for route in broker.router.match(topic)]


# --------------------------------------------------------------------------- takeover


def test_takeover_closes_the_old_connection_and_keeps_the_session(broker, lifecycle):
    first = Client(broker, "c", clean=False, expiry=60)
    first.subscribe("t")
    second = Client(broker, "c", clean=False, expiry=60)
    assert first.outlet.taken_over == 1
    assert second.present
    assert second.session is first.session
    assert second.session.outlet is second.outlet
    assert lifecycle.seen == [("offline", "c")]
    broker.routing.publish(Message("t", b"for the new one", 1))
    assert first.outlet.payloads() == []
    assert second.outlet.payloads() == [b"for the new one"]


def test_takeover_with_clean_start_begins_a_new_session(broker):
    first = Client(broker, "c", clean=False, expiry=60)
    first.subscribe("t")
    second = Client(broker, "c", clean=True, expiry=60)
    assert first.outlet.taken_over == 1
    assert not second.present
    assert second.session is not first.session
    assert subscribers(broker, "t") == []


def test_a_new_client_id_takes_nothing_over(broker):
    first = Client(broker, "a")
    Client(broker, "b")
    assert first.outlet.taken_over == 0
    assert first.session.online


# --------------------------------------------------------------------------- clean start


def test_clean_start_discards_an_offline_session(broker):
    old = Client(broker, "c", clean=False, expiry=60)
    old.subscribe("t")
    old.leave()
    assert subscribers(broker, "t") == ["c"]  # offline, still subscribed
    new = Client(broker, "c", clean=True, expiry=60)
    assert not new.present
    assert new.session is not old.session
    assert subscribers(broker, "t") == []
    assert session_of(broker, "c") is new.session


def test_without_clean_start_the_session_resumes_with_what_was_queued(broker):
    old = Client(broker, "c", clean=False, expiry=60)
    old.subscribe("t")
    old.leave()
    broker.routing.publish(Message("t", b"while away", 1))
    new = Client(broker, "c", clean=False, expiry=60)
    assert new.present
    assert new.session is old.session
    assert new.outlet.payloads() == [b"while away"]


# --------------------------------------------------------------------------- session expiry


def test_an_offline_session_expires_after_its_interval(broker, loop, lifecycle):
    client = Client(broker, "c", clean=False, expiry=10)
    client.subscribe("t")
    client.leave()
    loop.advance(9.9)
    assert session_of(broker, "c") is client.session
    assert lifecycle.seen == [("offline", "c")]
    loop.advance(0.2)
    assert session_of(broker, "c") is None
    assert subscribers(broker, "t") == []
    assert lifecycle.seen == [("offline", "c"), ("expired", "c")]
    assert not Client(broker, "c", clean=False, expiry=10).present


def test_reconnecting_cancels_the_expiry(broker, loop):
    client = Client(broker, "c", clean=False, expiry=10)
    client.leave()
    loop.advance(5)
    again = Client(broker, "c", clean=False, expiry=10)
    assert again.present
    loop.advance(60)  # connected: the interval starts only when it goes offline again
    assert session_of(broker, "c") is again.session
    again.leave()
    loop.advance(9.9)
    assert session_of(broker, "c") is again.session
    loop.advance(0.2)
    assert session_of(broker, "c") is None


def test_a_session_with_no_expiry_lives_on(broker, loop):
    client = Client(broker, "c", clean=False, expiry=None)
    client.leave()
    loop.advance(365 * 24 * 3600)
    assert session_of(broker, "c") is client.session
    assert loop.pending == []


def test_a_clean_session_ends_with_its_connection(broker, lifecycle):
    client = Client(broker, "c", expiry=0)
    client.subscribe("t")
    client.leave()
    assert session_of(broker, "c") is None
    assert subscribers(broker, "t") == []
    assert lifecycle.seen == [("gone", "c")]


# --------------------------------------------------------------------------- wills


def test_the_will_of_a_clean_session_is_published_at_once(broker, watcher, lifecycle):
    client = Client(broker, "c", expiry=0, will=True, will_delay=30)
    client.leave()
    # The session ends now, so the will goes now, whatever its delay [MQTT-3.1.3-9].
    assert watcher.payloads() == [b"gone: c"]
    assert lifecycle.seen == [("gone", "c")]


def test_a_will_without_delay_is_published_at_once(broker, watcher):
    client = Client(broker, "c", clean=False, expiry=60, will=True)
    client.leave()
    assert watcher.payloads() == [b"gone: c"]
    assert session_of(broker, "c") is client.session


def test_a_delayed_will_waits_for_its_delay(broker, loop, watcher):
    client = Client(broker, "c", clean=False, expiry=60, will=True, will_delay=5)
    client.leave()
    loop.advance(4.9)
    assert watcher.payloads() == []
    loop.advance(0.2)
    assert watcher.payloads() == [b"gone: c"]
    assert session_of(broker, "c") is client.session  # the session lives on
    loop.advance(60)
    assert watcher.payloads() == [b"gone: c"]  # once


def test_a_will_delay_longer_than_the_session_ends_with_the_session(broker, loop, watcher):
    # The will is published after min(will delay, session expiry).
    client = Client(broker, "c", clean=False, expiry=10, will=True, will_delay=30)
    client.leave()
    loop.advance(9.9)
    assert watcher.payloads() == []
    loop.advance(0.2)
    assert watcher.payloads() == [b"gone: c"]
    assert session_of(broker, "c") is None
    loop.advance(30)
    assert watcher.payloads() == [b"gone: c"]  # once


def test_reconnecting_within_the_delay_cancels_the_will(broker, loop, watcher):
    # [3.1.3.2.2]
    client = Client(broker, "c", clean=False, expiry=60, will=True, will_delay=5)
    client.leave()
    loop.advance(3)
    assert Client(broker, "c", clean=False, expiry=60).present
    loop.advance(60)
    assert watcher.payloads() == []


def test_a_taken_over_connection_leaves_its_will(broker, loop, watcher):
    first = Client(broker, "c", clean=False, expiry=60, will=True, will_delay=5)
    Client(broker, "c", clean=False, expiry=60)
    loop.advance(10)  # the new connection resumed the session: the delayed will is off
    assert watcher.payloads() == []
    assert first.outlet.taken_over == 1


# --------------------------------------------------------------------------- events


def test_lifecycle_events(broker, loop, lifecycle):
    clean = Client(broker, "clean", expiry=0)
    persistent = Client(broker, "kept", clean=False, expiry=5)
    clean.leave()
    persistent.leave()
    assert lifecycle.seen == [("gone", "clean"), ("offline", "kept")]
    loop.advance(5)
    assert lifecycle.seen == [("gone", "clean"), ("offline", "kept"), ("expired", "kept")]


# ------------------------------------------------ what the cluster asks of the registry


class Told(Alone):
    """Peers that note which client ids they were told changed."""

    def __init__(self) -> None:
        self.changed_ids: list[str] = []

    def changed(self, client_id: str) -> None:
        self.changed_ids.append(client_id)

    def retained(self, message: Message) -> None:
        self.changed_ids.append(f"retained {message.topic}")


def test_subscriptions_and_an_ended_session_are_told_to_the_peers(broker):
    told = Told()
    broker.routing.peers = told
    client = Client(broker, "c", expiry=60)
    client.subscribe("a/b")
    broker.registry.unsubscribe(client.session, "a/b")
    broker.registry.unsubscribe(client.session, "a/b")  # had none: nothing to tell
    broker.registry.end(client.session)
    assert told.changed_ids == ["c", "c", "c"]


def test_a_retained_publish_is_told_to_the_peers(broker):
    told = Told()
    broker.routing.peers = told
    broker.routing.publish(Message("r/t", b"kept", 0, retain=True))
    broker.routing.publish(Message("r/t", b"not kept", 0))
    assert told.changed_ids == ["retained r/t"]


def test_forget_unregisters_only_the_session_registered(broker):
    client = Client(broker, "c", expiry=60)
    stranger = broker.registry.new_session("c")  # another object for the same client id
    assert not broker.registry.forget(stranger)
    assert session_of(broker, "c") is client.session
    assert broker.registry.forget(client.session)
    assert "c" not in broker.registry


def test_disconnect_takes_over_every_connection_of_a_session(loop, lifecycle):
    config = config_from_dict(
        {"store": {"backend": "memory"}, "broker": {"allow_multiple_sessions": True}}
    )
    broker = Broker(config, loop=loop, plugins=[("lifecycle", lifecycle)])
    first, second = Client(broker, "c", expiry=60), Client(broker, "c", expiry=60)
    owner = first.session.owner
    assert owner is second.session.owner and len(owner.members) == 2
    broker.registry.disconnect(owner)
    assert first.outlet.taken_over and second.outlet.taken_over
    assert not owner.online
