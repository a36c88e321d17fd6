"""A cluster link whose handshake does not finish leaves nothing for asyncio to complain
about: no future holding an exception that nobody retrieves (asyncio logs each as
"Future exception was never retrieved ... ConnectionError('closed during the
handshake')" when it is collected; a netsplit logged two).

One node runs in-process (tests/conftest.py's start_broker, its clock moved by
`advance`) on the session's redis-server; its link goes to a peer that is a plain socket:
one that the kernel accepts for and that never answers (a hung or blackholed node), or
one that accepts and closes at once, or one that answers the handshake without knowing
the cluster's secret (an impostor: the link must not come up).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from broker.cluster import frames
from broker.cluster.frames import CHALLENGE, PROOF, REFUSED, WELCOME
from broker.cluster.link import (
    HANDSHAKE_TIMEOUT,
    RECONNECT_DELAY,
    REFUSED_DELAY_MAX,
    PeerLink,
    retry_delay,
)
from tests.cluster.nodes import cluster_of, read_frames, start_in_process_node

HOST = "127.0.0.1"


@pytest.fixture
def silent_peer() -> Iterator[tuple[str, int]]:
    """An address whose connections the kernel accepts, and nothing ever answers."""
    with socket.socket() as listening:
        listening.bind((HOST, 0))
        listening.listen(16)
        yield HOST, listening.getsockname()[1]


@pytest.fixture
def closing_peer() -> Iterator[tuple[tuple[str, int], list[int]]]:
    """An address that closes each connection as soon as it accepts it; and the count
    of connections it closed (one item)."""
    closed = [0]
    with socket.socket() as listening:
        listening.bind((HOST, 0))
        listening.listen(16)

        def close_each() -> None:
            while True:
                try:
                    connection, _ = listening.accept()
                except OSError:  # the fixture closed the listening socket
                    return
                connection.close()
                closed[0] += 1

        threading.Thread(target=close_each, daemon=True).start()
        yield (HOST, listening.getsockname()[1]), closed
        listening.shutdown(socket.SHUT_RDWR)


def unretrieved(caplog: pytest.LogCaptureFixture) -> list[str]:
    """asyncio's complaints so far, once whatever is unreachable has been collected."""
    gc.collect()
    return [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]


def link_to(node: Any, address: tuple[str, int]) -> PeerLink:
    """A link from the node to `address`, connecting (as the node makes one to each
    member it learns of)."""
    cluster = cluster_of(node)
    return node.call(lambda: PeerLink(cluster, "ghost", address))


def in_handshake(link: PeerLink) -> bool:
    return link.transport is not None and not link.up


def lost(link: PeerLink) -> bool:
    """Its connection is gone (connection_lost has run)."""
    return link.transport is None


def test_a_link_closed_during_its_handshake(start_broker, redis_url, silent_peer, caplog):
    """The node gives up on the peer (dead) while its link waits for WELCOME."""
    node = start_in_process_node(start_broker, redis_url)
    link = link_to(node, silent_peer)
    node.wait_for(functools.partial(in_handshake, link))
    node.call(link.close)
    node.wait_for(functools.partial(lost, link))
    del link  # and with it its future, if it held one
    assert unretrieved(caplog) == []


def test_a_handshake_that_times_out(start_broker, redis_url, silent_peer, caplog):
    """No WELCOME within HANDSHAKE_TIMEOUT: the attempt is cut, and the next one made.
    (What a netsplit does to each node's next attempt: the future was shielded from the
    timeout, then failed by the connection's loss, with nobody awaiting it.)"""
    node = start_in_process_node(start_broker, redis_url)
    link = link_to(node, silent_peer)
    node.wait_for(lambda: in_handshake(link))
    node.advance(HANDSHAKE_TIMEOUT)
    node.wait_for(lambda: lost(link))
    node.advance(RECONNECT_DELAY)  # the next attempt: the last one's future is let go of
    node.wait_for(lambda: in_handshake(link))
    assert unretrieved(caplog) == []
    node.call(link.close)


def test_a_peer_that_accepts_and_closes(start_broker, redis_url, closing_peer, caplog):
    address, closed = closing_peer
    node = start_in_process_node(start_broker, redis_url)
    link = link_to(node, address)
    for attempts in range(1, 4):
        node.wait_for(lambda attempts=attempts: closed[0] >= attempts and not in_handshake(link))
        node.advance(RECONNECT_DELAY)
    node.call(link.close)
    assert unretrieved(caplog) == []


@pytest.fixture
def impostor() -> Iterator[tuple[tuple[str, int], list[list[Any]]]]:
    """An address that answers a link's handshake as node "ghost" would, with a proof of
    another secret; and the frames the link sent it after that proof (on its first
    connection)."""
    said: list[list[Any]] = []
    with socket.socket() as listening:
        listening.bind((HOST, 0))
        listening.listen(16)

        def answer() -> None:
            with contextlib.suppress(OSError):
                connection, _ = listening.accept()
                with connection:
                    (hello,), _ = read_frames(connection, 10, bool)
                    nonce = frames.new_nonce()
                    connection.sendall(frames.encode(CHALLENGE, "ghost", nonce))
                    read_frames(connection, 10, lambda got: any(f[0] == PROOF for f in got))
                    greeting = frames.Hello(*hello[2:])
                    wrong = frames.accepting_proof("guess", greeting, "ghost", "g-boot", nonce)
                    connection.sendall(frames.encode(WELCOME, "ghost", "g-boot", wrong))
                    said.extend(read_frames(connection, 10)[0])

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        yield (HOST, listening.getsockname()[1]), said
        thread.join(10)


def test_a_peer_that_cannot_prove_the_secret_is_refused(start_broker, redis_url, impostor, caplog):
    """The accepting side proves the secret too: a WELCOME whose proof is not the one
    the secret makes is refused, and the link stays down."""
    address, said = impostor
    node = start_in_process_node(start_broker, redis_url, secret="the-secret")
    link = link_to(node, address)
    reason = "wrong cluster secret (its proof does not match)"
    line = f"cluster link to ghost ({HOST}:{address[1]}): refused: {reason}; closing it"
    node.wait_for(lambda: line in caplog.messages)
    node.wait_for(lambda: said == [[REFUSED, reason]])
    assert not link.up
    node.call(link.close)


def test_a_refused_link_is_tried_again_less_and_less_often() -> None:
    """Each refusal in a row doubles the wait (a wrong secret or certificate stays wrong
    until someone fixes it, and each attempt is a line on both nodes), up to a bound."""
    waits = [retry_delay(refusals) for refusals in range(8)]
    assert waits == [RECONNECT_DELAY, 1.0, 2.0, 4.0, 8.0] + [REFUSED_DELAY_MAX] * 3
    assert retry_delay(10_000) == REFUSED_DELAY_MAX
