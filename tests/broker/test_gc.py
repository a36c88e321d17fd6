"""The garbage collector on a running broker (broker/collector.py): what start-up made is
frozen, sessions made later are frozen by the next full collection, and the passes show
on the broker's figures. The collector's rules themselves: tests/unit/test_collector.py."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture
def broker(start_broker):
    yield start_broker()
    gc.unfreeze()  # (the test process's objects: collectable again by the next tests)


def test_start_up_is_frozen_and_later_sessions_by_the_next_full_pass(broker, paho_client):
    assert gc.get_freeze_count() > 0
    client = paho_client(broker, client_id="kept", clean=False)
    client.subscribe("gc/t", 1)
    client.disconnect()
    session = broker.call(lambda: broker.broker.registry.get("kept"))
    assert session is not None
    assert any(o is session for o in gc.get_objects())  # what a full pass walks
    gc.collect()
    assert not any(o is session for o in gc.get_objects())  # frozen: walked no more


def test_the_passes_show_on_the_figures(broker):
    before = broker.call(broker.broker.metrics.snapshot)["gc_collections"]
    gc.collect()
    assert broker.call(broker.broker.metrics.snapshot)["gc_collections"] > before
    gauges = broker.call(broker.broker.gauges)
    assert 0 < gauges["gc_pause_seconds_max"] < 1
    assert gauges["gc_frozen_objects"] > 0  # (counted at start-up, then every 60 s)
