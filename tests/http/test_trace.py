"""`nautilus admin trace` against a real broker with real paho clients: the admin API's
stream (/api/v1/trace/client) of a client picked up at CONNECT (its auth_on_register
call and result, by the passwd plugin), of one connected already, several traces at
once, the rate limit, stop-all, the reader going away, and the command itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.client.handlers import HANDLERS
from plugins.passwd.hashes import make_hash
from tests.broker.helpers import V5, PahoClient, unique_id
from tests.conftest import BrokerThread
from tests.test_cli import clean_env

from .conftest import api, base_url, table
from .trace_reader import TraceReader

# The commands run this checkout's code (the interpreter's own install may be another's).
COMMAND_ENV = clean_env(PYTHONPATH=str(Path(__file__).resolve().parents[2]))


def admin(server: BrokerThread, key: str, *args: str) -> list[str]:
    """`nautilus admin --url ... --key ... ARGS`."""
    return [sys.executable, "-m", "broker", "admin", "--url", base_url(server), "--key", key, *args]


@pytest.fixture
def traced(keyed_broker, tmp_path) -> tuple[BrokerThread, str]:
    """A broker whose clients must log in (passwd: alice / alice-pw), with an API key."""
    passwd = tmp_path / "passwd"
    passwd.write_text(f"alice:{make_hash(b'alice-pw', n=2)}\n")
    return keyed_broker(
        broker={"allow_anonymous": False},
        plugins={"passwd": {"enabled": True, "password_file": str(passwd)}},
    )


@pytest.fixture
def reader(traced) -> Any:
    """reader(client_id, **options) -> a TraceReader on the traced broker, closed after."""
    server, key = traced
    made: list[TraceReader] = []

    def start(client_id: str, **options: Any) -> TraceReader:
        assert server.broker.http is not None and server.broker.http.address is not None
        stream = TraceReader(server.broker.http.address, key, client_id=client_id, **options)
        made.append(stream)
        return stream

    yield start
    for stream in made:
        stream.close()


def untraced(server: BrokerThread) -> None:
    """No trace left: the broker's own flows and chains again, no tap anywhere."""

    def clean() -> bool:
        broker = server.broker
        return (
            not broker.tracer.watched
            and broker.handlers is HANDLERS
            and all(c.engine.tap is None for c in broker.connections)
            and type(broker.chains.auth_on_register[0]).__name__ == "Chain"
        )

    server.wait_for(clean)


def test_a_trace_started_before_the_client_connects(traced, reader, paho_client):
    server, _ = traced
    client_id = unique_id("traced")
    trace = reader(client_id, rate_max=100, trunc_payload=4)
    assert (trace.status, trace.content_type) == (200, "text/event-stream")
    assert trace.expect("trace", "not connected here")["node"] == "nautilus"

    client = paho_client(server, V5, client_id, username="alice", password="alice-pw")
    connect = trace.expect("recv", "CONNECT(")
    assert f"client_id={client_id!r}" in connect["text"]
    assert "password=<hidden>" in connect["text"] and "alice-pw" not in connect["text"]
    register = trace.expect("hook", "auth_on_register_m5(")["text"]  # passwd is async:
    assert "username='alice'" in register and "alice-pw" not in register
    trace.expect("hook", "auth_on_register_m5 -> ok")  # the call, then its result
    assert "reason_code=0" in trace.expect("send", "CONNACK(")["text"]

    client.subscribe("tr/#", 1)
    assert "topic_filter='tr/#'" in trace.expect("recv", "SUBSCRIBE(")["text"]
    assert "reason_codes=[1]" in trace.expect("send", "SUBACK(")["text"]
    client.publish("tr/x", b"0123456789", qos=1)
    published = trace.expect("recv", "PUBLISH(")["text"]
    assert "topic='tr/x'" in published and "payload=b'0123'... (10 bytes)" in published
    trace.expect("send", "PUBLISH(")  # to its own subscription, then the PUBACK
    trace.expect("send", "PUBACK(")
    assert (connect["client_id"], connect["mountpoint"]) == (client_id, "")

    client.disconnect()
    trace.expect("recv", "DISCONNECT(")
    trace.expect("session", "connection closing: normal_disconnect")


def test_a_connected_client_is_traced_from_its_next_packet_and_a_takeover_shows(
    traced, reader, paho_client
):
    server, _ = traced
    client_id = unique_id("traced")
    first = paho_client(server, client_id=client_id, username="alice", password="alice-pw")
    trace = reader(client_id, rate_max=100)
    trace.expect("trace", "connected here (1 connection)")
    first.subscribe("a/b", 0)
    trace.expect("recv", "SUBSCRIBE(")
    trace.expect("send", "SUBACK(")

    paho_client(server, client_id=client_id, username="alice", password="alice-pw")
    trace.expect("recv", "CONNECT(")  # the new connection, picked up at CONNECT
    trace.expect("session", "session taken over by another connection")
    trace.expect("send", "CONNACK(")


def test_a_message_dropped_for_the_traced_client_shows_though_no_plugin_listens(
    traced, reader, paho_client
):
    server, _ = traced
    client_id = unique_id("small")
    trace = reader(client_id, rate_max=100, trunc_payload=3)
    trace.expect("trace", "not connected here")
    login = {"username": "alice", "password": "alice-pw"}
    small = paho_client(server, V5, client_id, properties={"MaximumPacketSize": 64}, **login)
    small.subscribe("big/#", 0)
    paho_client(server, **login).publish("big/x", b"x" * 200)
    dropped = trace.expect("session", "message dropped (max_packet_size_exceeded)")
    assert dropped["text"].endswith("topic='big/x' qos=0 payload=b'xxx'... (200 bytes)")


def test_several_traces_at_once_each_with_its_own_lines(traced, reader, paho_client):
    server, _ = traced
    one, other = unique_id("one"), unique_id("other")
    traces = [reader(one, rate_max=100), reader(one, trunc_payload=2), reader(other)]
    for trace in traces:
        trace.expect("trace", "not connected here")
    paho_client(server, client_id=one, username="alice", password="alice-pw")
    paho_client(server, client_id=other, username="alice", password="alice-pw")
    for trace, client_id in zip(traces, (one, one, other), strict=True):
        line = trace.expect("recv", "CONNECT(")
        assert line["client_id"] == client_id
        trace.expect("send", "CONNACK(")
    assert all(line["client_id"] == one for line in traces[0].seen + traces[1].seen)
    assert all(line["client_id"] == other for line in traces[2].seen)


def test_a_flood_stops_the_trace_by_its_rate_limit(traced, reader, paho_client):
    server, _ = traced
    client_id = unique_id("flood")
    trace = reader(client_id, rate_max=8, rate_interval=60_000)
    trace.expect("trace", "not connected here")
    client = paho_client(server, client_id=client_id, username="alice", password="alice-pw")
    for n in range(10):
        client.publish("flood", b"%d" % n, qos=1)
    last = trace.expect_end()
    assert last["kind"] == "trace"
    assert last["text"].startswith("trace rate limit triggered: more than 8 lines in 60000 ms")
    assert len(trace.seen) == 9  # eight lines, then the last one
    untraced(server)
    client.publish("flood", b"after", qos=1)  # untraced now, and as before


def test_a_trace_over_at_the_connect_leaves_the_connection_untraced(traced, reader, paho_client):
    server, _ = traced
    client_id = unique_id("short")
    trace = reader(client_id, rate_max=1, rate_interval=60_000)
    trace.expect("trace", "not connected here")
    paho_client(server, client_id=client_id, username="alice", password="alice-pw")
    assert trace.expect_end()["text"].startswith("trace rate limit triggered")
    untraced(server)


def test_stop_all_ends_every_trace(traced, reader):
    server, key = traced
    traces = [reader(unique_id("a")), reader(unique_id("b"))]
    for trace in traces:
        trace.expect("trace", "not connected here")
    assert table(api(server, "trace/stop-all", key, method="POST")) == [{"stopped": 2}]
    for trace in traces:
        assert trace.expect_end()["text"] == "stopped (trace stop-all)"
    untraced(server)


def test_the_trace_stops_when_the_reader_goes_away(traced, reader):
    server, _ = traced
    trace = reader(unique_id("gone"))
    trace.expect("trace", "not connected here")
    trace.close()
    untraced(server)


def test_bad_options_are_refused_before_any_stream(traced, reader):
    refused = reader("", rate_max=5)
    assert refused.status == 400 and "client_id is required" in refused.body()["error"]
    refused = reader("c", rate_max=0)
    assert refused.status == 400 and "rate_max" in refused.body()["error"]


def test_the_command_streams_the_lines_until_the_trace_ends(traced, paho_client, tmp_path):
    server, key = traced
    client_id = unique_id("cli")
    command = subprocess.Popen(
        admin(
            server, key, "trace", "client", client_id, "--rate-max", "100", "--trunc-payload", "3"
        ),
        cwd=tmp_path,
        env=COMMAND_ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert command.stdout is not None
        first = command.stdout.readline()
        assert first.endswith(
            f" nautilus {client_id} TRACE not connected here: traced from its next CONNECT here\n"
        ), first
        client = paho_client(server, client_id=client_id, username="alice", password="alice-pw")
        assert f" RECV CONNECT(client_id={client_id!r}" in command.stdout.readline()
        client.publish("cli", b"abcdef")
        stopped = subprocess.run(
            admin(server, key, "trace", "stop-all"),
            cwd=tmp_path,
            env=COMMAND_ENV,
            capture_output=True,
            text=True,
            timeout=15,
        )
        assert stopped.returncode == 0 and "stopped" in stopped.stdout
        rest = command.stdout.read()
        assert command.wait(5) == 0
    finally:
        command.kill()
    assert "RECV PUBLISH(topic='cli', payload=b'abc'... (6 bytes)" in rest
    assert rest.endswith("TRACE stopped (trace stop-all)\n")


def test_a_trace_follows_one_mountpoints_client(keyed_broker, paho_client):
    """--mountpoint picks the session: the same client id on the default tree is not it;
    topics show as its tree's clients know them."""
    listeners = [{"address": "127.0.0.1:0"}, {"address": "127.0.0.1:0", "mountpoint": "t-a"}]
    server, key = keyed_broker(listeners=listeners)
    assert server.broker.http is not None and server.broker.http.address is not None
    trace = TraceReader(server.broker.http.address, key, client_id="dev", mountpoint="t-a")
    try:
        trace.expect("trace", "not connected here")
        other = paho_client(server, V5, "dev")  # the default tree's "dev"
        other.subscribe("d/#", 0)
        tenant = PahoClient(*server.broker.listening[1], V5, "dev")
        try:
            tenant.connect()
            connect = trace.expect("recv", "CONNECT(")
            assert (connect["mountpoint"], connect["client_id"]) == ("t-a", "dev")
            tenant.subscribe("t/#", 1)
            assert "topic_filter='t/#'" in trace.expect("recv", "SUBSCRIBE(")["text"]
            trace.expect("send", "SUBACK(")
            tenant.publish("t/x", b"hi", qos=1)
            assert "topic='t/x'" in trace.expect("recv", "PUBLISH(")["text"]
            assert "topic='t/x'" in trace.expect("send", "PUBLISH(")["text"]
            assert not any("d/#" in text for text in trace.texts())
        finally:
            tenant.close()
    finally:
        trace.close()
