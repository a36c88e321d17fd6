"""The source's Arrow batches, built by position (spark_consumers/source.py, _record_batch),
against the plain reading of each event by name (event_relay.schema.decode_event): the
same columns for events of every type, and of a type this version does not know."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from event_relay.schema import TYPES, decode_event
from spark_consumers.jobs import SOURCE_OPTIONS
from spark_consumers.source import ARROW_SCHEMA, batch_maker, columns_option, types_option

TS = 1_795_000_000_123_456_789


def by_name(events: list[list[Any]], node: str) -> pa.RecordBatch:
    """The reference: each event decoded by name, then its columns looked up."""
    columns: dict[str, list[Any]] = {name: [] for name in ARROW_SCHEMA.names}
    for values in events:
        event = decode_event(values)
        event["event_time"] = event["ts"] // 1000
        event["event_type"] = event["type"] if isinstance(event["type"], str) else None
        event["node"] = node
        connected = event.get("connected_ts")
        if connected is not None:
            event["session_seconds"] = (event["ts"] - connected) / 1e9
        for name, column in columns.items():
            column.append(event.get(name))
    return pa.RecordBatch.from_pydict(columns, schema=ARROW_SCHEMA)


def field_value(name: str, draw: Any) -> Any:
    if name in ("qos", "protocol_level", "peer_port", "online", "payload_size"):
        return draw(st.none() | st.integers(0, 1000))
    if name in ("retain", "clean_start", "persisted"):
        return draw(st.booleans())
    if name == "payload":
        return draw(st.none() | st.binary(max_size=20))
    if name == "connected_ts":
        return draw(st.none() | st.integers(TS - 10**12, TS))
    if name in ("topics", "user_properties"):
        return []
    return draw(st.none() | st.text(max_size=8))


@st.composite
def an_event(draw: Any, seq: int) -> list[Any]:
    code = draw(st.sampled_from([*TYPES, 99]))  # 99: a type from a newer relay
    own = TYPES[code][1] if code in TYPES else ("something", "else")
    common = [seq, draw(st.integers(TS, TS + 10**12)), code]
    common += [draw(st.none() | st.text(max_size=8)), "", draw(st.none() | st.text(max_size=5))]
    common.append(draw(st.none() | st.text(max_size=8)))
    return common + [field_value(name, draw) for name in own]


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_the_batch_by_position_is_the_batch_by_name(data):
    count = data.draw(st.integers(0, 30))
    events = [data.draw(an_event(seq)) for seq in range(1, count + 1)]
    expected = by_name([list(e) for e in events], "node-a")
    got = batch_maker()([list(e) for e in events], "node-a")
    assert got.schema == ARROW_SCHEMA
    assert got.to_pylist() == expected.to_pylist()
    # Some columns only (the `columns` option): those of the whole batch.
    names = data.draw(st.lists(st.sampled_from(ARROW_SCHEMA.names), min_size=1, unique=True))
    columns = columns_option(",".join(names))
    some = batch_maker(columns)([list(e) for e in events], "node-a")
    assert some.schema.names == list(columns)  # in the schema's order
    assert some.to_pylist() == expected.select(list(columns)).to_pylist()


def test_the_columns_option_names_what_it_does_not_know():
    assert columns_option(None) == tuple(ARROW_SCHEMA.names)
    assert columns_option(" topic, seq ") == ("seq", "topic")
    for options in SOURCE_OPTIONS.values():
        assert columns_option(options["columns"])  # every job's are known
    with pytest.raises(ValueError, match=r"unknown columns payload_bytes, topc in the columns"):
        columns_option("topc,seq,payload_bytes")


def test_the_types_option_always_reads_heartbeats_and_names_what_it_does_not_know():
    assert types_option(None) is None  # all
    assert types_option("on_publish, on_deliver") == ["heartbeat", "on_deliver", "on_publish"]
    for options in SOURCE_OPTIONS.values():
        assert types_option(options["types"])  # every job's are known
    with pytest.raises(ValueError, match=r"unknown event types on_pubish in the types option"):
        types_option("on_pubish,on_deliver")
