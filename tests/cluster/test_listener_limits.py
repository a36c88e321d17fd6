"""The cluster listener's limits against strangers: what a connection that has not said
HELLO may cost, and how many connections the port takes.

A hostile probe opened ten connections to a node's cluster port that never sent HELLO,
each claiming a 64 MB frame: the node buffered toward max_frame_size (64 MiB) before it
checked the secret, from 61 MB to 658 MB until the 5 s handshake timeout; the port had no
connection cap, and the refusal's log line no peer address. Here, until HELLO is accepted
a frame may be HELLO_MAX_SIZE (4 KiB) at most, a longer length is refused from its 4
bytes; `[cluster] max_connections` caps the port, an episode of refusals logged once (then
counted); every refusal's line names the peer.

One node runs in-process (tests/conftest.py's start_broker, its clock moved by
`advance`) on the session's redis-server; the peers are raw sockets speaking the cluster
channel's frames (broker/cluster/frames.py).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker.cluster import frames
from broker.cluster.frames import PING, PONG, PUBLISH, REFUSED, WELCOME
from broker.cluster.link import (
    HANDSHAKE_TIMEOUT,
    HELLO_MAX_SIZE,
    REFUSALS_INTERVAL,
    listener_of,
)
from broker.config import ConfigError, config_from_dict, load_config
from broker.message import Message
from tests.cluster.nodes import cluster_of, handshake, read_frames, start_in_process_node

HOST = "127.0.0.1"
MiB = 1024 * 1024
CLUSTER_LOGGER = "nautilus.cluster"
# Well within HANDSHAKE_TIMEOUT: a connection closed by then was refused, not timed out.
PROMPTLY = HANDSHAKE_TIMEOUT / 2
SECRET = "s" * 3000  # a long secret (proved in the handshake, not sent: any length fits)


def start_node(start_broker: Any, redis_url: str, **cluster: Any) -> Any:
    return start_in_process_node(start_broker, redis_url, secret=SECRET, **cluster)


@pytest.fixture
def sockets() -> Iterator[Callable[[Any], socket.socket]]:
    """connect(node) -> a socket to its cluster listener, closed at the end of the test."""
    opened: list[socket.socket] = []

    def connect(node: Any) -> socket.socket:
        sock = socket.create_connection((HOST, cluster_of(node).address[1]), timeout=10)
        opened.append(sock)
        return sock

    yield connect
    for sock in opened:
        with contextlib.suppress(OSError):
            sock.close()


def address(sock: socket.socket) -> str:
    """How the node sees this socket: host:port."""
    return "{}:{}".format(*sock.getsockname())


def link(sock: socket.socket, node: str) -> None:
    """The handshake as `node`, to its WELCOME."""
    got, closed = handshake(sock, node, "a", SECRET)
    assert not closed and got[0][0] == WELCOME, got


def lines(caplog: pytest.LogCaptureFixture, since: int = 0) -> list[str]:
    return [r.getMessage() for r in caplog.records[since:] if r.name == CLUSTER_LOGGER]


def open_connections(node: Any) -> int:
    return node.call(lambda: len(listener_of(cluster_of(node)).open))


# --------------------------------------------------------------------------- before HELLO


@pytest.mark.parametrize(
    "length", [pytest.param(HELLO_MAX_SIZE + 1, id="4KiB+1"), pytest.param(64 * MiB, id="64MiB")]
)
def test_a_length_over_hello_max_size_before_hello_is_refused_from_its_header(
    start_broker: Any,
    redis_url: str,
    sockets: Callable[[Any], socket.socket],
    caplog: pytest.LogCaptureFixture,
    length: int,
) -> None:
    caplog.set_level(logging.INFO)
    node = start_node(start_broker, redis_url)
    sock = sockets(node)
    me = address(sock)
    # The length, then less than it of the body: a node that waited for the whole frame
    # would hold these bytes and keep the connection until the handshake timeout.
    body = min(length - 1, MiB)
    started = time.monotonic()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed mid-way
        sock.sendall(struct.pack(">I", length) + bytes(body))
    got, closed = read_frames(sock, PROMPTLY)
    assert closed, "the node kept the connection open"
    assert time.monotonic() - started < PROMPTLY
    assert got == []

    node.wait_for(lambda: not listener_of(cluster_of(node)).open)
    metrics = node.call(node.broker.metrics.snapshot)
    # Read no further than the 4 bytes' refusal: one read (asyncio's: 256 KiB at most),
    # not the MiB sent (with max_frame_size as the limit the node took it all).
    if body >= MiB:
        assert metrics["cluster_bytes_received"] < MiB
    assert metrics["cluster_frames_invalid"] == 1
    refusals = [line for line in lines(caplog) if me in line]
    assert refusals == [
        f"cluster listener: refused a link from {me}: a frame of {length} bytes "
        f"(before HELLO, at most {HELLO_MAX_SIZE})"
    ], lines(caplog)


def test_connections_that_never_say_hello_hold_no_more_than_a_hello(
    start_broker: Any,
    redis_url: str,
    sockets: Callable[[Any], socket.socket],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The probe's ten connections, each a HELLO_MAX_SIZE length and all but one byte of
    it: what the node holds for them is bounded by HELLO_MAX_SIZE; past the handshake
    timeout each is refused in a line that names it."""
    caplog.set_level(logging.INFO)
    node = start_node(start_broker, redis_url)
    listener = listener_of(cluster_of(node))
    silent = [sockets(node) for _ in range(10)]
    for sock in silent:
        sock.sendall(struct.pack(">I", HELLO_MAX_SIZE) + bytes(HELLO_MAX_SIZE - 1))
    node.wait_for(
        lambda: (
            len(listener.open) == 10
            and all(c.buffered == HELLO_MAX_SIZE + 3 for c in listener.open)
        )
    )
    assert not any(read_frames(sock, 0.1)[1] for sock in silent)  # waited for, not refused

    node.advance(HANDSHAKE_TIMEOUT)
    for sock in silent:
        assert read_frames(sock, PROMPTLY)[1], "closed at the handshake timeout"
        me = address(sock)
        assert [line for line in lines(caplog) if me in line] == [
            f"cluster listener: refused a link from {me}: no HELLO in {HANDSHAKE_TIMEOUT:g}s"
        ]
    node.wait_for(lambda: not listener.open)


def test_a_refused_hello_names_the_peer(
    start_broker: Any,
    redis_url: str,
    sockets: Callable[[Any], socket.socket],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    node = start_node(start_broker, redis_url)
    sock = sockets(node)
    got, closed = handshake(sock, "b", "a", "wrong", timeout=PROMPTLY)
    reason = "wrong cluster secret (its proof does not match)"
    assert closed and got == [[REFUSED, reason]]
    me = address(sock)
    assert [line for line in lines(caplog) if me in line] == [
        f"cluster listener: refused a link from b ({me}): {reason}"
    ]


def test_once_hello_is_accepted_frames_may_be_max_frame_size(
    start_broker: Any, redis_url: str, sockets: Callable[[Any], socket.socket]
) -> None:
    node = start_node(start_broker, redis_url)
    sock = sockets(node)
    link(sock, "b")
    big = Message("big/one", bytes(256 * 1024), 0)
    sock.sendall(
        frames.encode(PUBLISH, frames.pack_message(big, time.monotonic())) + frames.encode(PING, 7)
    )
    got, closed = read_frames(sock, 10, lambda got: [PONG, 7] in got)
    assert [PONG, 7] in got and not closed
    assert open_connections(node) == 1


# --------------------------------------------------------------------------- the cap


def test_connections_over_max_connections_are_refused_and_logged_once(
    start_broker: Any,
    redis_url: str,
    sockets: Callable[[Any], socket.socket],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    node = start_node(start_broker, redis_url, max_connections=3)
    peers = [sockets(node) for _ in range(3)]
    for n, sock in enumerate(peers):
        link(sock, f"p{n}")
    assert open_connections(node) == 3
    before = len(caplog.records)

    refused = [sockets(node) for _ in range(20)]
    for sock in refused:
        got, closed = read_frames(sock, PROMPTLY)
        assert closed and got == [[REFUSED, "max_connections 3"]], got
    assert open_connections(node) == 3
    first = address(refused[0])
    assert lines(caplog, before) == [
        f"cluster listener: refused a link from {first}: 3 connections open, "
        f"max_connections 3; refusing new ones until 2 are (the others counted, one line "
        f"per {REFUSALS_INTERVAL:g}s)"
    ]

    node.advance(REFUSALS_INTERVAL)  # the interval ends: the others, counted
    assert lines(caplog, before)[1:] == [
        f"cluster listener: 19 more links refused at max_connections in the last "
        f"{REFUSALS_INTERVAL:g} s, the last from {address(refused[-1])}"
    ]

    peers[0].close()  # 2 open: 90% of the cap, the episode is over
    node.wait_for(lambda: len(listener_of(cluster_of(node)).open) == 2)
    ended = lines(caplog, before)[2:]
    assert len(ended) == 1 and ended[0].startswith(
        "cluster listener: accepting links again, 2 open (20 links refused at max_connections in "
    ), ended
    link(sockets(node), "p3")  # taken again
    assert open_connections(node) == 3
    assert len(lines(caplog, before)) == 3  # and nothing more was logged


def test_connections_before_hello_count_toward_the_cap(
    start_broker: Any, redis_url: str, sockets: Callable[[Any], socket.socket]
) -> None:
    """Ten strangers that say nothing: max_connections of them are held (each at most
    HELLO_MAX_SIZE, for HANDSHAKE_TIMEOUT), the others are closed as they are accepted."""
    node = start_node(start_broker, redis_url, max_connections=3)
    strangers = [sockets(node) for _ in range(10)]
    outcomes = [read_frames(sock, 0.5) for sock in strangers]
    assert outcomes.count(([], False)) == 3  # held, waiting for HELLO
    assert outcomes.count(([[REFUSED, "max_connections 3"]], True)) == 7
    assert open_connections(node) == 3


# --------------------------------------------------------------------------- the key


def test_max_connections_is_validated() -> None:
    assert config_from_dict({}).cluster.max_connections == 64
    assert config_from_dict({"cluster": {"max_connections": 2}}).cluster.max_connections == 2
    for bad, why in ((0, "must be 1 or more, got 0"), (-1, "must be 1 or more, got -1")):
        with pytest.raises(ConfigError, match=rf"^cluster\.max_connections: {why}$"):
            config_from_dict({"cluster": {"max_connections": bad}})
    with pytest.raises(ConfigError, match=r"^cluster\.max_connections: expected an integer"):
        config_from_dict({"cluster": {"max_connections": "many"}})
    environ = {"NAUTILUS_CLUSTER__MAX_CONNECTIONS": "128"}
    assert load_config(None, environ).cluster.max_connections == 128
