"""[http]'s limits against hostile clients on raw sockets: requests that never finish
(dropped after request_timeout, 2,000 at once while MQTT clients connect), idle kept-alive
connections (keepalive_timeout), bodies that never arrive, max_connections (refused, said
once), and malformed requests (one line each, not a traceback, and a flood of them a
bounded number of lines, every one counted).

A flood's two ends are both in this process (the broker serves on a thread of it), so the
test raises its own RLIMIT_NOFILE, within the hard limit. Where a test waits for a timeout
it moves the broker's clock (`server.advance`), except for the flood, which waits for the
real 2-second timeout to close every connection.
"""

from __future__ import annotations

import logging
import re
import resource
import selectors
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from broker.config import ConfigError
from broker.http.connections import HttpConnections
from tests.broker.helpers import PUBLISH, TIMEOUT, unique_id
from tests.conftest import BrokerThread

from .conftest import basic, get

PARTIAL = b"GET /health HTTP/1.1\r\nHost: x\r\n"  # the blank line that ends it never comes
PING = b"GET /health/ping HTTP/1.1\r\nHost: x\r\n\r\n"  # HTTP/1.1: kept alive
FLOOD = 2000
SUMMARY = re.compile(r": (\d+) more in the last \d+s, the last ")


def http_address(server: BrokerThread) -> tuple[str, int]:
    assert server.broker.http is not None and server.broker.http.address is not None
    return server.broker.http.address


def connect(server: BrokerThread) -> socket.socket:
    return socket.create_connection(http_address(server), timeout=TIMEOUT)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the broker sends until it closes the connection (a reset counts)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    sock.close()
    return data


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length, leaving the connection open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    found = re.search(rb"Content-Length: (\d+)", head, re.IGNORECASE)
    assert found, head
    length = int(found[1])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def settle(server: BrokerThread) -> None:
    """Until the broker's loop is idle: what aiohttp does after a response has gone out
    (its keep-alive timer, reading what is left of a body) is done, so that time moved
    on from here counts for it."""
    server.advance(0)


def is_open(sock: socket.socket) -> bool:
    """Nothing to read and not closed: the broker holds it."""
    readable, _, _ = selectors.select.select([sock], [], [], 0)
    return not readable


def wait_closed(socks: list[socket.socket], timeout: float) -> dict[socket.socket, float]:
    """When (time.monotonic()) the broker closed each socket; fails if one stays open."""
    closed: dict[socket.socket, float] = {}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while len(closed) < len(socks):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{len(socks) - len(closed)} connections still open"
            for key, _ in selector.select(remaining):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                assert data == b"", data  # a partial request gets no answer: only closed
                closed[sock] = time.monotonic()
                selector.unregister(sock)
    for sock in socks:
        sock.close()
    return closed


def lines(caplog: pytest.LogCaptureFixture, start: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(start)]


def counted(records: list[logging.LogRecord]) -> int:
    """The events a rate-limited kind of line stands for: one per line, plus the ones a
    summary line counts."""
    total = 0
    for record in records:
        summary = SUMMARY.search(record.getMessage())
        total += int(summary[1]) if summary else 1
    return total


@pytest.fixture
def descriptors() -> Iterator[Callable[[int], None]]:
    """need(n): this process may open n file descriptors (soft RLIMIT_NOFILE raised within
    the hard one, or the test skipped); put back after the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def need(n: int) -> None:
        if hard != resource.RLIM_INFINITY and hard < n:
            pytest.skip(f"needs {n} file descriptors, the hard limit is {hard}")
        if soft != resource.RLIM_INFINITY and soft < n:
            resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))

    yield need
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def connections(server: BrokerThread) -> HttpConnections:
    """The HTTP server's connections (broker/http/connections.py); read on its loop."""
    assert server.broker.http is not None and server.broker.http.connections is not None
    return server.broker.http.connections


def open_http(server: BrokerThread) -> int:
    return server.call(lambda: len(connections(server).open))


def wait_open_http(server: BrokerThread, count: int) -> None:
    server.wait_for(lambda: len(connections(server).open) == count)


# --------------------------------------------------------------------------- timeouts


def test_2000_partial_requests_are_dropped_after_request_timeout_while_mqtt_connects(
    start_broker, raw_client, descriptors, caplog
):
    # Both ends of every connection are in this process; HTTP may hold half the limit.
    descriptors(4 * FLOOD + 1000)
    caplog.set_level(logging.INFO, logger="nautilus")
    server = start_broker(
        http={"address": "127.0.0.1:0", "request_timeout": 2, "max_connections": FLOOD + 100}
    )
    started = time.monotonic()
    # When each was opened: read before connect(), as the broker may accept it (and start
    # its clock) before this thread runs again.
    held: dict[socket.socket, float] = {}
    try:
        for i in range(1, FLOOD + 1):
            opening = time.monotonic()
            sock = connect(server)
            sock.sendall(PARTIAL)
            held[sock] = opening
            if i % 500 == 0:  # amid the flood: MQTT clients connect, /health answers
                raw_client(server).connect(unique_id("during"))  # CONNACK 0, or it fails
                assert get(server, "/health").status == 200
        peak = open_http(server)
        closed = wait_closed(list(held), timeout=30)
    finally:
        for sock in held:
            sock.close()
    assert peak > FLOOD // 2, peak  # held at once (unless opening them took seconds)
    too_soon = [s for s in held if closed[s] - held[s] < 2.0 - 0.01]
    assert not too_soon, f"{len(too_soon)} dropped before request_timeout"
    wait_open_http(server, 0)
    assert get(server, "/health").status == 200
    raw_client(server).connect(unique_id("after"))

    timeouts = connections(server).timeouts
    server.wait_for(lambda: not timeouts.active)  # the last summary is out
    dropped = lines(caplog, "http: dropped")
    assert counted(dropped) == FLOOD  # every one counted ...
    assert len(dropped) <= 2 + (time.monotonic() - started)  # ... in about a line a second
    assert all("no complete request within 2s" in r.getMessage() for r in dropped)
    assert not [r for r in caplog.records if r.exc_info]


def test_a_kept_alive_connection_idles_for_keepalive_timeout_not_request_timeout(start_broker):
    server = start_broker(
        http={"address": "127.0.0.1:0", "request_timeout": 5, "keepalive_timeout": 30}
    )
    sock = connect(server)
    for _ in range(2):  # a second request on the same connection
        sock.sendall(PING)
        assert read_response(sock).endswith(b"\r\n\r\npong")
    settle(server)
    server.advance(10)  # past request_timeout: idle is not a slow request
    assert is_open(sock) and open_http(server) == 1
    server.advance(25)  # 35s idle: past keepalive_timeout
    wait_closed([sock], TIMEOUT)


def test_the_next_request_on_a_kept_alive_connection_has_request_timeout(start_broker):
    server = start_broker(
        http={"address": "127.0.0.1:0", "request_timeout": 5, "keepalive_timeout": 60}
    )
    sock = connect(server)
    sock.sendall(PING)
    read_response(sock)
    settle(server)
    sock.sendall(PARTIAL)
    server.wait_for(lambda: all(c.request_due for c in connections(server).open))  # 1st byte
    server.advance(3)
    assert is_open(sock)
    server.advance(3)  # 6s since its first byte
    wait_closed([sock], TIMEOUT)


def test_a_connection_that_sends_nothing_is_dropped_after_request_timeout(start_broker):
    server = start_broker(http={"address": "127.0.0.1:0", "request_timeout": 5})
    sock = connect(server)
    wait_open_http(server, 1)
    server.advance(4)
    assert is_open(sock)
    server.advance(2)
    wait_closed([sock], TIMEOUT)


def test_a_body_that_never_arrives_is_not_waited_for_past_request_timeout(start_broker):
    server = start_broker(
        http={"address": "127.0.0.1:0", "request_timeout": 5, "keepalive_timeout": 60}
    )
    sock = connect(server)
    # 10 bytes of a 1000-byte body: the API answers (401, no key) without reading it.
    sock.sendall(
        b"POST /api/v1/plugins HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10
    )
    assert read_response(sock).startswith(b"HTTP/1.1 401 ")
    settle(server)
    server.advance(6)
    wait_closed([sock], TIMEOUT)


def slow_publish(server: BrokerThread, key: str) -> socket.socket:
    """A POST to /api/v1/publish that says its body is 100 bytes and sends none of it."""
    sock = connect(server)
    auth = basic(key)["Authorization"]
    sock.sendall(
        "POST /api/v1/publish?topic=slow/body HTTP/1.1\r\nHost: x\r\nAuthorization: "
        f"{auth}\r\nContent-Length: 100\r\n\r\n".encode()
    )
    return sock


def body_bytes(server: BrokerThread) -> list[int]:
    """The bytes of body each open connection's handler has been given so far (None:
    no handler is reading one)."""
    return [c.body.total_bytes for c in connections(server).open if c.body is not None]


def test_a_publish_whose_body_never_arrives_is_dropped_after_request_timeout(keyed_broker, caplog):
    server, key = keyed_broker(http={"request_timeout": 5, "keepalive_timeout": 60})
    sock = slow_publish(server, key)
    server.wait_for(lambda: body_bytes(server) == [0])  # the handler waits for the body
    server.advance(4)
    assert is_open(sock)
    with caplog.at_level(logging.INFO, "nautilus.http"):
        server.advance(2)  # 6s since the request began
        wait_closed([sock], TIMEOUT)
        wait_open_http(server, 0)
    (dropped,) = lines(caplog, "http: dropped")
    assert dropped.getMessage().endswith(": no complete request within 5s")
    assert not lines(caplog, "http: error")  # the handler's read cut short: not a bug


def test_a_body_dribbled_in_is_dropped_request_timeout_after_the_request_began(keyed_broker):
    """Bytes that keep coming do not earn a request more time: the whole of it is due."""
    server, key = keyed_broker(http={"request_timeout": 5, "keepalive_timeout": 60})
    sock = slow_publish(server, key)
    for sent in (10, 20, 30):
        sock.sendall(b"x" * 10)
        server.wait_for(lambda sent=sent: body_bytes(server) == [sent])
        server.advance(1.5)
    assert is_open(sock)  # 4.5s
    sock.sendall(b"x" * 10)
    server.wait_for(lambda: body_bytes(server) == [40])
    server.advance(1)  # 5.5s since the request began
    wait_closed([sock], TIMEOUT)


def test_a_body_that_arrives_in_time_is_published(keyed_broker, raw_client):
    """The deadline ends with the body: the publish goes through, and the connection
    is kept alive past request_timeout."""
    server, key = keyed_broker(http={"request_timeout": 5, "keepalive_timeout": 60})
    subscriber = raw_client(server)
    subscriber.connect(unique_id("sub"))
    subscriber.subscribe(("slow/#", 0))
    sock = slow_publish(server, key)
    server.wait_for(lambda: body_bytes(server) == [0])
    server.advance(4)
    sock.sendall(b"y" * 100)
    assert read_response(sock).startswith(b"HTTP/1.1 200 ")
    assert subscriber.expect(PUBLISH).payload == b"y" * 100
    settle(server)
    server.advance(10)  # past request_timeout: idle now, not a slow request
    assert is_open(sock)
    sock.close()


def test_a_stalled_body_does_not_hold_the_shutdown(keyed_broker):
    """Its handler waits for the body; the broker stops at once, not request_timeout
    later (nor aiohttp's 60 s for a handler to finish)."""
    server, key = keyed_broker(http={"request_timeout": 30})
    sock = slow_publish(server, key)
    server.wait_for(lambda: body_bytes(server) == [0])
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < TIMEOUT
    wait_closed([sock], TIMEOUT)


def test_stalled_bodies_do_not_keep_http_full(keyed_broker):
    """max_connections of them: /health is refused (503) while they hold every place,
    and answers again once request_timeout cut them (they were held for ever)."""
    server, key = keyed_broker(http={"request_timeout": 5, "max_connections": 4})
    stalled = [slow_publish(server, key) for _ in range(4)]
    server.wait_for(lambda: body_bytes(server) == [0] * 4)
    assert get(server, "/health").status == 503  # http.max_connections is reached
    server.advance(6)
    wait_closed(stalled, TIMEOUT)
    wait_open_http(server, 0)
    assert get(server, "/health").status == 200


def test_a_response_the_client_does_not_read_is_not_waited_for_past_request_timeout(
    keyed_broker, raw_client
):
    server, key = keyed_broker(http={"request_timeout": 5})
    publisher = raw_client(server)
    publisher.connect(unique_id("pub"))
    for i in range(100):  # retain/show answers with 10 MB of them
        publisher.publish(f"big/{i}", b"x" * 100_000, qos=1, retain=True)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and takes little of it
    sock.connect(http_address(server))
    auth = basic(key)["Authorization"]
    sock.sendall(
        f"GET /api/v1/retain/show?topic=big/%23 HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}"
        "\r\n\r\n".encode()
    )
    server.wait_for(  # the broker holds what the client does not take
        lambda: any(c.transport.get_write_buffer_size() for c in connections(server).open)
    )
    settle(server)
    server.advance(4)
    assert open_http(server) == 1
    server.advance(2)
    wait_open_http(server, 0)
    sock.close()


# --------------------------------------------------------------------------- max_connections


def test_over_max_connections_new_ones_are_refused_and_that_is_said_once(
    start_broker, raw_client, caplog
):
    caplog.set_level(logging.INFO, logger="nautilus")
    server = start_broker(http={"address": "127.0.0.1:0", "max_connections": 5})
    caplog.clear()  # from here on
    held = [connect(server) for _ in range(5)]
    for sock in held:
        sock.sendall(PARTIAL)
    wait_open_http(server, 5)
    for _ in range(20):
        answer = read_until_closed(connect(server))
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
    assert get(server, "/health/ping").status == 503  # an ordinary client learns why
    raw_client(server).connect(unique_id("mqtt"))  # MQTT is not HTTP's to refuse

    refusing = lines(caplog, "http: ")
    assert [(r.levelno, r.getMessage()) for r in refusing] == [
        (logging.WARNING, "http: 5 connections open, max_connections 5: refusing new ones")
    ]
    for sock in held:
        sock.close()
    wait_open_http(server, 0)
    assert get(server, "/health/ping").text == "pong"
    (again,) = lines(caplog, "http: accepting again")
    assert again.levelno == logging.INFO
    assert re.fullmatch(
        r"http: accepting again, 4 open \(21 connections refused in \d+ s\)", again.getMessage()
    ), again.getMessage()


# --------------------------------------------------------------------------- malformed


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GARBAGE\r\n\r\n", id="no-target"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", id="bad-header"),
        pytest.param(b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\n\r\n", id="line-too-long"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 32, id="tls"),
    ],
)
def test_a_malformed_request_is_one_line_not_a_traceback(start_broker, caplog, request_bytes):
    caplog.set_level(logging.DEBUG)  # aiohttp's own lines too, at any level
    server = start_broker()
    caplog.clear()  # from here on
    sock = connect(server)
    port = sock.getsockname()[1]
    sock.sendall(request_bytes)
    answer = read_until_closed(sock)
    assert answer.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 ")), answer[:100]
    http = [r for r in caplog.records if r.name.startswith(("nautilus.http", "aiohttp"))]
    assert len(http) == 1, [r.getMessage() for r in http]
    (line,) = http
    assert line.getMessage().startswith(f"http: bad request from 127.0.0.1:{port}: 400 ")
    assert "\n" not in line.getMessage()
    assert (line.levelno, line.exc_info) == (logging.INFO, None)


def test_a_flood_of_malformed_requests_logs_a_line_a_second_and_counts_them_all(
    start_broker, caplog
):
    caplog.set_level(logging.INFO, logger="nautilus")
    server = start_broker()
    started = time.monotonic()
    sent = 300
    for _ in range(sent):
        sock = connect(server)
        sock.sendall(b"GARBAGE\r\n\r\n")
        read_until_closed(sock)
    bad_requests = connections(server).bad_requests
    server.wait_for(lambda: not bad_requests.active)
    logged = lines(caplog, "http: bad request")
    assert counted(logged) == sent
    assert len(logged) <= 2 + (time.monotonic() - started)
    assert SUMMARY.search(logged[-1].getMessage())  # the last says how many it stands for
    assert not [r for r in caplog.records if r.exc_info or r.name.startswith("aiohttp")]


# --------------------------------------------------------------------------- the reserve


def test_http_may_not_take_more_than_half_of_the_descriptors(start_broker):
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no RLIMIT_NOFILE")
    with pytest.raises(ConfigError, match=r"^http\.max_connections: .* at most \d+, half"):
        start_broker(http={"address": "127.0.0.1:0", "max_connections": soft // 2 + 1})
    server = start_broker(http={"address": "127.0.0.1:0", "max_connections": soft // 2})
    assert get(server, "/health/ping").text == "pong"


def test_the_start_up_line_says_what_http_leaves_mqtt(start_broker, caplog):
    caplog.set_level(logging.INFO, logger="nautilus")
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft < 1000:
        pytest.skip(f"RLIMIT_NOFILE {soft}")
    start_broker(
        listeners=[{"address": "127.0.0.1:0", "max_connections": 100}],
        http={"address": "127.0.0.1:0", "max_connections": 50},
    )
    (fits,) = lines(caplog, "http: at most")
    assert (fits.levelno, fits.getMessage()) == (
        logging.INFO,
        f"http: at most 50 connections, of the process's {soft} file descriptors "
        f"(RLIMIT_NOFILE): MQTT listeners keep {soft - 50} (max_connections: 100 in all)",
    )
    caplog.clear()
    start_broker(listeners=[{"address": "127.0.0.1:0", "max_connections": 0}])
    (unlimited,) = lines(caplog, "http: at most")
    assert unlimited.levelno == logging.WARNING
    assert unlimited.getMessage().startswith(
        f"http: at most 256 connections, of the process's {soft} file descriptors "
        f"(RLIMIT_NOFILE): MQTT listeners keep {soft - 256} (max_connections: no limit); "
        "past that, new MQTT connections are refused for want of descriptors"
    )
