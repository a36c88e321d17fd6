"""The relay's events are the same whether the broker keeps the acl plugin's publish
decisions (hooks/decisions.py) or asks the plugin for every message: the same traffic
(QoS 0 runs, QoS 1, a denied topic, a labelled rule) through two real brokers."""

from __future__ import annotations

from typing import Any

import pytest

from tests.broker.helpers import V5, RawClient, publish_packet

from .conftest import RECORDERS, RelayBroker, fields, with_recorder

RULES = "topic write t/+ label tee\ntopic read t/#\ntopic other\n"


def traffic(broker: RelayBroker) -> list[dict[str, Any]]:
    """A subscriber, then a publisher that sends QoS 0 runs, QoS 1 messages and denied
    ones in a few writes; the relay's events from the first to the last delivery."""
    sub, pub = RawClient(broker.host, broker.port, V5), RawClient(broker.host, broker.port, V5)
    try:
        sub.connect("sub")
        assert sub.subscribe(("t/#", 0), ("other", 0)) == [0, 0]
        pub.connect("pub")
        for round_ in range(3):
            burst = [publish_packet("t/a", b"%d-%d" % (round_, i), version=V5) for i in range(20)]
            burst.append(publish_packet("x/denied", b"no", version=V5))
            burst += [publish_packet("other", b"o", version=V5) for _ in range(3)]
            pub.send(b"".join(burst))
            pub.publish("t/b", b"one", qos=1)
            pub.publish("x/denied", b"refused", qos=1)
        pub.publish("t/end", b"end", qos=1)
        events = broker.read_all(lambda e: e["type"] == "on_deliver" and e["topic"] == "t/end")
    finally:
        sub.close()
        pub.close()
    first = next(
        i for i, e in enumerate(events) if e["type"] == "on_register" and e["client_id"] == "pub"
    )
    return [{k: v for k, v in fields(e).items() if k != "peer_port"} for e in events[first:]]


def runs_routed(broker: RelayBroker, topic: str) -> list[int]:
    """The lengths of the runs to `topic` the broker routes on its fast path
    (Routing.publish_run), from now on."""
    routing = broker.server.broker.routing
    publish_run = routing.publish_run
    lengths: list[int] = []

    def watched(to: str, packets: list[bytes], publisher: Any) -> Any:
        receivers = publish_run(to, packets, publisher)
        if receivers and to == topic:
            lengths.append(len(packets))
        return receivers

    routing.publish_run = watched  # type: ignore[method-assign]
    return lengths


@pytest.mark.parametrize("recorder", RECORDERS)
def test_the_events_are_the_same_with_kept_decisions(relay_broker, tmp_path, recorder):
    """With kept decisions, the labelled rule's QoS 0 runs take the fast path, recorded
    in one call each (published_run, with the rule): the same events as one by one."""
    path = tmp_path / "acl"
    path.write_text(RULES)
    acl = {"enabled": True, "acl_file": str(path)}
    kept = with_recorder(relay_broker, recorder, plugins={"acl": acl})
    unkept = {**acl, "module": "tests.broker.kept_plugins:UnkeptAcl"}
    asked = with_recorder(relay_broker, recorder, plugins={"acl": unkept})
    fast_runs = runs_routed(kept, "t/a")  # the labelled rule's
    with_kept, without = traffic(kept), traffic(asked)
    assert fast_runs, "no run allowed by the kept answer took the fast path"
    assert with_kept == without
    published = [e for e in with_kept if e["type"] == "on_publish"]
    assert len(published) == 3 * (20 + 3 + 1) + 1  # the denied ones are not published
    assert {e["acl_name"] for e in published if e["topic"].startswith("t/")} == {"tee"}
