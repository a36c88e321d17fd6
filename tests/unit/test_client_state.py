"""ClientState's phase moves only forward (broker/client_state.py)."""

from __future__ import annotations

import pytest

from broker.client_state import (
    AUTHENTICATING,
    AWAITING_CONNECT,
    CLOSING,
    CONNECTED,
    ClientState,
    IllegalTransition,
)


@pytest.mark.parametrize(
    "path",
    [
        [AUTHENTICATING, CONNECTED, CLOSING],  # CONNECT, CONNACK, close
        [AUTHENTICATING, CLOSING],  # refused
        [CLOSING],  # no CONNECT before the timeout, or over max_connections
    ],
)
def test_forward_paths(path):
    state = ClientState()
    assert state.phase == AWAITING_CONNECT
    for phase in path:
        state.advance(phase)
    assert state.phase == path[-1]


@pytest.mark.parametrize(
    ("done", "illegal"),
    [
        ([], CONNECTED),  # CONNACK without CONNECT being handled
        ([AUTHENTICATING, CONNECTED], AUTHENTICATING),  # back to before CONNACK
        ([AUTHENTICATING, CONNECTED, CLOSING], CLOSING),  # closing twice
        ([AUTHENTICATING, CONNECTED, CLOSING], CONNECTED),  # reopened
    ],
)
def test_backward_or_repeated_moves_are_refused(done, illegal):
    state = ClientState()
    for phase in done:
        state.advance(phase)
    with pytest.raises(IllegalTransition):
        state.advance(illegal)


def test_name_shows_the_client_id_once_known():
    state = ClientState(peer=("127.0.0.1", 5000))
    assert state.name() == "127.0.0.1:5000"
    state.client_id = "dev-1"
    assert state.name() == "127.0.0.1:5000 (dev-1)"
