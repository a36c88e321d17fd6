"""`nautilus_events`: a PySpark streaming data source over the event relay.

    spark.dataSource.register(NautilusEvents)
    events = (spark.readStream.format("nautilus_events")
              .option("relay", "127.0.0.1:7883").load())

Besides the broker's events, the relay's heartbeats come through (`event_type`
"heartbeat": `seq`, `event_time`, `node` and an empty `mountpoint`, nothing else):
appended while the broker is quiet, and at the start of a Trigger.AvailableNow run, so
that event time, and a watermark, move on without traffic (spark_consumers.jobs counts
none of them).

Offsets are the relay's sequence numbers, with its epoch: `{"epoch": ..., "seq": n}` is
the next event to read. A micro-batch [start, end) is split into partitions of
`eventsPerPartition` sequence numbers that executors read with the relay's READ; a
checkpointed query that restarts reads exactly the ranges its checkpoint names, so it
sees no event twice and misses none. A range the relay no longer retains, or a relay
whose epoch changed (a log that started again), fails the query with a clear error
instead of skipping. `commit` tells the relay how far the query got (its position under
the consumer name `name`).

Options (strings, as Spark passes them): `relay` (host:port, default 127.0.0.1:7883),
`startingOffsets` (earliest, latest or a sequence number; default earliest: only for a new
query), `maxEventsPerTrigger`, `eventsPerPartition` (default 50000), `name` (default
spark), `secret`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from event_relay.client import OutOfRange
from event_relay.schema import COMMON, TYPES
from spark_consumers.relay import RelayConnection

_COLUMNS = [
    ("seq", LongType()),
    ("event_time", TimestampType()),
    ("node", StringType()),
    ("event_type", StringType()),
    ("client_id", StringType()),
    ("username", StringType()),
    ("mountpoint", StringType()),
    ("session_id", StringType()),
    ("topic", StringType()),
    ("qos", IntegerType()),
    ("retain", BooleanType()),
    ("payload_size", IntegerType()),
    ("payload", BinaryType()),
    ("acl_name", StringType()),
    ("peer_addr", StringType()),
    ("reason", StringType()),
    # Connects and disconnects: the clients online just after; disconnects: how long the
    # session lasted (null if it connected before the broker started).
    ("online", IntegerType()),
    ("session_seconds", DoubleType()),
]
SCHEMA = StructType([StructField(name, kind) for name, kind in _COLUMNS])
# The Arrow schema the batches must match exactly (Spark checks it).
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
ARROW_ROWS = 10_000  # rows per record batch


class EventsGone(Exception):
    """What the query needs is no longer in the relay (or the relay started again)."""


class RangePartition(InputPartition):
    """Sequence numbers start <= seq < end (plain ints: partitions are pickled)."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__(None)
        self.start = start
        self.end = end


class NautilusEvents(DataSource):
    @classmethod
    def name(cls) -> str:
        return "nautilus_events"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        # Spark's options are case-insensitive: looked up here in lower case.
        return EventsReader({key.lower(): value for key, value in self.options.items()})


class EventsReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.address = options.get("relay", "127.0.0.1:7883")
        self.consumer = options.get("name", "spark")
        self.secret = options.get("secret")
        self.starting = options.get("startingoffsets", "earliest")
        self.per_partition = int(options.get("eventsperpartition", "50000"))
        limit = options.get("maxeventspertrigger")
        self.max_events = int(limit) if limit else None
        self.until: int | None = None  # Trigger.AvailableNow: what was there when it began
        self._relay: RelayConnection | None = None

    # -- the driver's side ------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        info = self._info()
        if self.starting == "earliest":
            seq = info["first_seq"]
        elif self.starting == "latest":
            seq = info["next_seq"]
        else:
            seq = int(self.starting)
        return {"epoch": info["epoch"], "seq": seq}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_events is None else ReadMaxRows(self.max_events)

    def prepareForTriggerAvailableNow(self) -> None:
        # Up to a heartbeat the relay appends now: the run's event time reaches the
        # relay's clock, so the windows that ended before it close in this run.
        self.until = self._connection().info(heartbeat=True)["next_seq"]

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        info = self._info()
        if start["epoch"] != info["epoch"]:
            raise EventsGone(
                f"the relay at {self.address} started a new log (epoch {info['epoch']}, "
                f"the query's is {start['epoch']}): its sequence numbers start again, so "
                "this query cannot go on; start a new one (a new checkpoint)"
            )
        end = info["next_seq"]
        if self.until is not None:
            end = min(end, self.until)
        if isinstance(limit, ReadMaxRows):
            end = min(end, start["seq"] + limit.max_rows)
        return {"epoch": start["epoch"], "seq": max(end, start["seq"])}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        step = self.per_partition
        return [
            RangePartition(a, min(a + step, end["seq"]))
            for a in range(start["seq"], end["seq"], step)
        ]

    def commit(self, end: dict[str, Any]) -> None:
        self._connection().commit(end["seq"])

    def stop(self) -> None:
        if self._relay is not None:
            self._relay.close()
            self._relay = None

    def _info(self) -> dict[str, Any]:
        return self._connection().info()

    def _connection(self) -> RelayConnection:
        if self._relay is None:
            self._relay = RelayConnection(self.address, self.consumer, self.secret)
        return self._relay

    # -- an executor's side -------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        relay = RelayConnection(self.address, f"{self.consumer}-reader", self.secret)
        try:
            node = relay.welcome["node"]
            try:
                events = relay.read(partition.start, partition.end)
            except OutOfRange as exc:
                raise EventsGone(
                    f"events {partition.start}..{partition.end - 1} are no longer retained "
                    f"by the relay at {self.address} (it holds "
                    f"{exc.details.get('first_seq')}..{exc.details.get('next_seq', 1) - 1})"
                ) from None
        finally:
            relay.close()
        expected = partition.end - partition.start
        if len(events) != expected or (events and events[0][0] != partition.start):
            raise EventsGone(
                f"the relay returned {len(events)} of the {expected} events "
                f"{partition.start}..{partition.end - 1}: some are no longer retained"
            )
        for first in range(0, len(events), ARROW_ROWS):
            yield _record_batch(events[first : first + ARROW_ROWS], node)


# The row's columns that are event fields, in ARROW_SCHEMA's order, with the two that
# computed columns need (`ts`: event_time, session_seconds; `type`: event_type;
# `connected_ts`: session_seconds). Each type's rows take them by position (_ROWS).
_TAKEN = (
    *("seq", "ts", "type", "client_id", "username", "mountpoint", "session_id", "topic"),
    *("qos", "retain", "payload_size", "payload", "acl_name", "peer_addr", "reason"),
    *("online", "connected_ts"),
)
_TYPE_NAMES = pa.array([TYPES[c][0] if c in TYPES else None for c in range(max(TYPES) + 1)])


def _type_names(codes: pa.Array) -> pa.Array:
    """The hook names of type codes; null for a code this version does not know."""
    known = pc.less(codes, len(_TYPE_NAMES))
    return pc.take(_TYPE_NAMES, pc.if_else(known, codes, 0))  # 0: no type, null


def _row_getter(fields: tuple[str, ...]) -> Callable[[list[Any]], tuple[Any, ...]]:
    """The _TAKEN values of an event with these fields, by position: one C call a row;
    a field the type does not have is read from the None the reader appends (-1)."""
    return itemgetter(*(fields.index(name) if name in fields else -1 for name in _TAKEN))


_ROWS = {code: _row_getter((*COMMON, *own)) for code, (_, own) in TYPES.items()}
_COMMON_ROW = _row_getter(COMMON)  # a type this version does not know: its common fields


def _record_batch(events: list[list[Any]], node: str) -> pa.RecordBatch:
    """Events as one Arrow record batch (Spark takes Arrow from a Python source several
    times faster than rows): each event a tuple of its fields in one C call, the tuples
    turned into columns by zip, the computed columns by Arrow. (The events are this
    read's own lists: a None is appended to each.)"""
    rows = []
    for values in events:
        values.append(None)
        rows.append(_ROWS.get(values[2], _COMMON_ROW)(values))
    count = len(rows)
    (
        seq, ts, code, client_id, username, mountpoint, session_id, topic, qos, retain,
        size, payload, acl_name, peer_addr, reason, online, connected,
    ) = zip(*rows, strict=True) if rows else [()] * len(_TAKEN)  # fmt: skip
    nanoseconds = pa.array(ts, pa.int64())
    since = pc.subtract(nanoseconds, pa.array(connected, pa.int64()))
    arrays = [
        pa.array(seq, pa.int64()),
        pc.divide(nanoseconds, 1000).cast(ARROW_SCHEMA.field("event_time").type),
        pa.array([node] * count, pa.string()),
        _type_names(pa.array(code, pa.int64())),
        pa.array(client_id, pa.string()),
        pa.array(username, pa.string()),
        pa.array(mountpoint, pa.string()),
        pa.array(session_id, pa.string()),
        pa.array(topic, pa.string()),
        pa.array(qos, pa.int32()),
        pa.array(retain, pa.bool_()),
        pa.array(size, pa.int32()),
        pa.array(payload, pa.binary()),
        pa.array(acl_name, pa.string()),
        pa.array(peer_addr, pa.string()),
        pa.array(reason, pa.string()),
        pa.array(online, pa.int32()),
        pc.divide(since.cast(pa.float64()), 1e9),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
