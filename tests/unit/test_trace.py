"""A trace without a broker: its rate limit on a clock moved by hand, its one end, and
how its lines show packets, hook calls and verdicts (broker/trace/)."""

from __future__ import annotations

from broker.protocol import Connect, Property, Publish, SubAck
from broker.trace import text
from broker.trace.trace import TRACE, Trace, TraceLine
from broker.trace_spec import TraceSpec
from hooks import NEXT, Error, Ok, RegisterContext


class Lines:
    """A sink that keeps what it gets."""

    def __init__(self) -> None:
        self.lines: list[TraceLine] = []
        self.last: TraceLine | None = None

    def line(self, line: TraceLine) -> None:
        self.lines.append(line)

    def end(self, last: TraceLine) -> None:
        assert self.last is None, "ended twice"
        self.last = last


def tracing(**options: int) -> tuple[Trace, Lines, list[float], list[Trace]]:
    now = [100.0]
    ended: list[Trace] = []
    sink = Lines()
    trace = Trace(7, TraceSpec("c", "m", **options), sink, "n", lambda: now[0], ended.append)
    return trace, sink, now, ended


def test_more_than_rate_max_lines_in_an_interval_end_the_trace_with_a_last_line():
    trace, sink, now, ended = tracing(rate_max=3, rate_interval=100)
    for _ in range(3):
        trace.write("recv", "x")
    now[0] += 0.1  # a new interval
    for _ in range(3):
        trace.write("recv", "y")
    assert len(sink.lines) == 6 and sink.last is None
    trace.write("recv", "one too many")
    assert sink.last is not None and sink.last.kind == TRACE
    assert sink.last.text == (
        "trace rate limit triggered: more than 3 lines in 100 ms; the trace stops"
    )
    assert (sink.last.node, sink.last.mountpoint, sink.last.client_id) == ("n", "m", "c")
    assert ended == [trace] and trace.over
    trace.write("recv", "after")
    trace.end("again")  # nothing more: the sink heard the end once
    assert len(sink.lines) == 6


def test_options_are_checked():
    assert TraceSpec("").problem() == "client_id is required"
    assert TraceSpec("c", rate_max=0).problem() is not None
    assert TraceSpec("c", trunc_payload=-1).problem() is not None
    assert TraceSpec("c").problem() is None
    assert TraceSpec("c", "m").key == ("m", "c")


def test_packets_show_their_fields_with_payloads_cut_and_passwords_hidden():
    connect = Connect("dev", 5, username="u", password=b"secret", properties={0x11: 60})
    shown = text.packet(connect, 200)
    assert shown.startswith("CONNECT(client_id='dev', protocol_level=5")
    assert "password=<hidden>" in shown and "secret" not in shown
    assert "properties={session_expiry_interval=60}" in shown
    correlation = {Property.CORRELATION_DATA: b"xyz"}
    publish = Publish("t", b"abcdef", 1, packet_id=3, properties=correlation)
    shown = text.packet(publish, 2)
    assert "payload=b'ab'... (6 bytes)" in shown and "correlation_data=b'xy'... (3 bytes)" in shown
    assert "raw" not in shown
    assert text.packet(Publish("t"), 2) == (
        "PUBLISH(topic='t', payload=b'', qos=0, retain=False, dup=False)"
    )
    assert text.packet(SubAck(1, [0, 0x80]), 0) == "SUBACK(packet_id=1, reason_codes=[0, 128])"


def test_hook_calls_and_verdicts():
    context = RegisterContext(
        client_id="dev", mountpoint="m", session_id="s", username="u", password=b"pw"
    )
    call = text.hook_call("auth_on_register", context, 10)
    assert call.startswith("auth_on_register(username='u', peer=('', 0), password=<hidden>")
    assert "client_id" not in call and "session_id" not in call and "'pw'" not in call
    assert text.result(Ok(), 4) == "ok"
    assert text.result(Ok({"payload": b"0123456789"}), 4) == "ok {payload=b'0123'... (10 bytes)}"
    assert text.result(Error("not_allowed", 0x87), 4) == "error not_allowed (0x87)"
    assert text.result(NEXT, 4) == "next"
