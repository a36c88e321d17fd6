"""The cluster-test harness itself: TcpProxy's modes against an echo server, and
RedisServer's life cycle. Every wait is on an event with a deadline; the one bounded wait
that is itself the assertion is "nothing arrives within 0.3 s" for a blackholed link."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from testing.lifecycle import free_port
from testing.redis_server import RedisServer
from tests.cluster.proxy import TcpProxy

HOST = "127.0.0.1"
TIMEOUT = 5.0  # the longest any expected event may take
SILENCE = 0.3  # how long a blackholed link must stay silent (and open)

StartProxy = Callable[[tuple[str, int]], TcpProxy]


def eventually(check: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    """Poll `check` until it returns something true; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)
    return result


class EchoServer:
    """Echoes every byte back on 127.0.0.1:<ephemeral>, and keeps what it received."""

    def __init__(self) -> None:
        self.listener = socket.create_server((HOST, 0))
        self.address: tuple[str, int] = self.listener.getsockname()[:2]
        self.received = bytearray()
        self.accepted = 0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # shut down by close()
                return
            with self._lock:
                self.accepted += 1
                self._conns.append(conn)
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                with self._lock:
                    self.received += data
                conn.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept() (Linux)
        self.listener.close()
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)  # wakes recv()
        for thread in self._threads:
            thread.join(TIMEOUT)
        for conn in self._conns:
            conn.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def connect() -> Iterator[Callable[[tuple[str, int]], socket.socket]]:
    """connect(address) -> a client socket (timeout TIMEOUT), closed after the test."""
    sockets: list[socket.socket] = []

    def open_(address: tuple[str, int]) -> socket.socket:
        sock = socket.create_connection(address, timeout=TIMEOUT)
        sockets.append(sock)
        return sock

    yield open_
    for sock in sockets:
        sock.close()


def echoes(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {got!r}"
        got += chunk
    assert got == data


def assert_cut(sock: socket.socket) -> None:
    """The peer sees the connection reset or closed (within TIMEOUT)."""
    with contextlib.suppress(ConnectionResetError):
        assert sock.recv(65536) == b""


# --------------------------------------------------------------------------- the proxy


def test_passes_bytes_both_ways(echo: EchoServer, start_proxy: StartProxy, connect) -> None:
    proxy = start_proxy(echo.address)
    assert proxy.address == (HOST, proxy.port) and proxy.port != 0
    client = connect(proxy.address)
    echoes(client, b"hello")
    echoes(client, b"x" * 200_000)
    assert proxy.connections == 1
    assert proxy.bytes_forwarded == 2 * (5 + 200_000)
    client.close()
    eventually(lambda: proxy.connections == 0)


def test_reset_cuts_live_and_new_connections(
    echo: EchoServer, start_proxy: StartProxy, connect
) -> None:
    proxy = start_proxy(echo.address)
    live = connect(proxy.address)
    echoes(live, b"before")
    proxy.reset()
    assert proxy.connections == 0
    with pytest.raises(ConnectionResetError):  # the RST is out when reset() returns
        live.recv(1)
    # Accepted (by the kernel), then reset. The RST may come before connect() has seen
    # the handshake done (its thread not scheduled in between, on a busy machine): then
    # connect() itself fails with it.
    try:
        new = connect(proxy.address)
    except ConnectionResetError:
        pass
    else:
        assert_cut(new)
    assert echo.accepted == 1

    proxy.pass_through()
    echoes(connect(proxy.address), b"after")


def test_blackhole_keeps_connections_open_and_silent(
    echo: EchoServer, start_proxy: StartProxy, connect
) -> None:
    proxy = start_proxy(echo.address)
    live = connect(proxy.address)
    echoes(live, b"before")
    proxy.blackhole()
    new = connect(proxy.address)
    live.sendall(b"lost")
    new.sendall(b"lost too")
    eventually(lambda: proxy.connections == 2)
    readable, _, _ = select.select([live, new], [], [], SILENCE)  # no data, no EOF, no RST
    assert readable == []
    assert bytes(echo.received) == b"before"
    assert echo.accepted == 1  # a new connection is connected to nothing

    proxy.pass_through()  # blackholed links are reset, new ones work again
    assert_cut(live)
    assert_cut(new)
    echoes(connect(proxy.address), b"after")
    assert bytes(echo.received) == b"beforeafter"


def test_target_down_closes_the_client(start_proxy: StartProxy, connect) -> None:
    proxy = start_proxy((HOST, free_port()))  # nothing listens there
    assert_cut(connect(proxy.address))
    eventually(lambda: proxy.connections == 0)


def test_close_stops_the_thread_and_the_sockets(echo: EchoServer, connect) -> None:
    with TcpProxy(echo.address) as proxy:
        client = connect(proxy.address)
        echoes(client, b"hi")
        thread = proxy._thread
    assert not thread.is_alive()
    assert_cut(client)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=TIMEOUT).close()


# --------------------------------------------------------------------------- redis


def test_own_redis_answers_and_restarts_empty_on_its_port(own_redis: RedisServer) -> None:
    with own_redis.client() as client:
        assert client.ping()
        client.set("k", "v")
        port = own_redis.port
        own_redis.restart()
        assert own_redis.port == port
        assert own_redis.url == f"redis://{HOST}:{port}/0"
        assert client.get("k") is None  # the client reconnects; nothing was persisted


def test_paused_redis_times_out_then_answers(own_redis: RedisServer) -> None:
    no_retry = Retry(NoBackoff(), 0)
    with own_redis.client(socket_timeout=0.2, retry=no_retry) as client:
        assert client.ping()
        own_redis.pause()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        own_redis.resume()
        assert client.ping()


def test_flush_empties_keys_and_functions(own_redis: RedisServer) -> None:
    with own_redis.client() as client:
        client.set("k", "v")
        client.function_load("#!lua name=lib\nredis.register_function('f', function() end)")
        own_redis.flush()
        assert client.dbsize() == 0
        assert client.function_list() == []


def test_redis_url_is_the_shared_server(redis_url: str, redis_server: RedisServer) -> None:
    with redis.Redis.from_url(redis_url) as client:
        assert client.dbsize() == 0
        assert redis_server.proc is not None
        assert client.info("server")["process_id"] == redis_server.proc.pid
