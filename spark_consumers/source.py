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
spark), `secret`, `types` (comma-separated event types: the relay sends only those, and
heartbeats; default all), `columns` (comma-separated: only those columns are made, and
sent to Spark; default all), `readOn` (executors, the default: a micro-batch's range is
read by executors in partitions, in parallel; driver: by the driver's source process, with
no Python task per micro-batch, for small frequent batches: DriverEventsReader).
For a relay with TLS on: `tls` (true or false, default false; true when a file below is
given): connect with TLS, the relay's certificate checked against the host of `relay`;
`cafile` (the CA it must chain to; default the system's), `certfile` and `keyfile` (a
client certificate, for a relay with `require_certificate`). The files are read where
the relay is read, the driver and every executor: the same path on each. A refused
connection (wrong secret, a certificate either side refuses) fails the query with a
RelayError naming the relay.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
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

from event_relay.client import OutOfRange, tls_context
from event_relay.schema import CODES, COMMON, TYPES
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
DRIVER_BATCH = 100_000  # readOn=driver: events a micro-batch reads at most, by default


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

    def schema(self) -> StructType:  # (called as the stream is loaded: options checked)
        read_on_option(_lowered(self.options).get("readon"))
        tls = tls_files(_lowered(self.options))
        if tls is not None:
            tls_context_of(tls)  # its files load, or the error names the option
        columns = columns_option(_lowered(self.options).get("columns"))
        return StructType([SCHEMA[name] for name in columns])

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = _lowered(self.options)
        if read_on_option(options.get("readon")) == "driver":
            return super().streamReader(schema)  # "not implemented": simpleStreamReader then
        return EventsReader(options)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return DriverEventsReader(_lowered(self.options))


def _lowered(options: Any) -> dict[str, str]:
    """Spark's options are case-insensitive: looked up in lower case."""
    return {key.lower(): value for key, value in options.items()}


class EventsReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.address = options.get("relay", "127.0.0.1:7883")
        self.consumer = options.get("name", "spark")
        self.secret = options.get("secret")
        self.tls_files = tls_files(options)
        self.starting = options.get("startingoffsets", "earliest")
        self.per_partition = int(options.get("eventsperpartition", "50000"))
        limit = options.get("maxeventspertrigger")
        self.max_events = int(limit) if limit else None
        self.until: int | None = None  # Trigger.AvailableNow: what was there when it began
        self.columns = columns_option(options.get("columns"))
        self.types = types_option(options.get("types"))
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
            self._relay = self._connect(self.consumer)
        return self._relay

    def _connect(self, name: str) -> RelayConnection:
        tls = None if self.tls_files is None else tls_context_of(self.tls_files)
        return RelayConnection(self.address, name, self.secret, tls)

    # -- an executor's side -------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return self.read_range(partition.start, partition.end)

    def read_range(self, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """The events start <= seq < end, as record batches of the query's columns (a
        connection of its own: this runs wherever Spark calls it)."""
        relay = self._connect(f"{self.consumer}-reader")
        try:
            node = relay.welcome["node"]
            try:
                events, reached = relay.read(start, end, self.types)
            except OutOfRange as exc:
                raise EventsGone(
                    f"events {start}..{end - 1} are no longer retained by the relay at "
                    f"{self.address} (it holds {exc.details.get('first_seq')}.."
                    f"{exc.details.get('next_seq', 1) - 1})"
                ) from None
        finally:
            relay.close()
        whole = reached >= end
        if self.types is None:  # every event of the range: counted
            whole = whole and len(events) == end - start
            whole = whole and (not events or events[0][0] == start)
        if not whole:
            raise EventsGone(
                f"the relay returned {len(events)} events of {start}..{end - 1} and stopped "
                f"at {reached}: some are no longer retained"
            )
        make = batch_maker(self.columns)
        for first in range(0, len(events), ARROW_ROWS):
            yield make(events[first : first + ARROW_ROWS], node)


class DriverEventsReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """`readOn=driver`: each micro-batch read by the driver's source process and handed
    to Spark as Arrow, with no Python task on an executor (about 70 ms less a
    micro-batch: small, frequent batches). Offsets, limits and errors are EventsReader's;
    a micro-batch is at most maxEventsPerTrigger events (DRIVER_BATCH by default), held
    in the driver's memory whole."""

    def __init__(self, options: dict[str, str]) -> None:
        self.events = EventsReader(options)
        self.limit = ReadMaxRows(self.events.max_events or DRIVER_BATCH)

    def initialOffset(self) -> dict[str, Any]:
        return self.events.initialOffset()

    def prepareForTriggerAvailableNow(self) -> None:
        self.events.prepareForTriggerAvailableNow()

    def read(self, start: dict[str, Any]) -> tuple[Iterator[pa.RecordBatch], dict[str, Any]]:
        end = self.events.latestOffset(start, self.limit)
        if end["seq"] == start["seq"]:
            return iter(()), start  # nothing new (Spark requires an empty read to say so)
        # Read now, into a list: Spark keeps it until the batch is planned, and pickles it.
        return iter(list(self.readBetweenOffsets(start, end))), end

    def readBetweenOffsets(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> Iterator[pa.RecordBatch]:
        """(Also how Spark replays a batch its checkpoint names: on an executor.)"""
        return self.events.read_range(start["seq"], end["seq"])

    def commit(self, end: dict[str, Any]) -> None:
        self.events.commit(end)


# What each column is made from: the event fields it reads (by position, per type), and
# how those become its Arrow array (`node` and the row count are the read's).
_Build = Callable[[dict[str, tuple[Any, ...]], str, int], pa.Array]


def _plain(name: str) -> tuple[tuple[str, ...], _Build]:
    kind = ARROW_SCHEMA.field(name).type
    return (name,), lambda f, node, count: pa.array(f[name], kind)


def _event_time(f: dict[str, tuple[Any, ...]], node: str, count: int) -> pa.Array:
    micros = pc.divide(pa.array(f["ts"], pa.int64()), 1000)  # the column's unit: µs
    return micros.cast(ARROW_SCHEMA.field("event_time").type)


def _session_seconds(f: dict[str, tuple[Any, ...]], node: str, count: int) -> pa.Array:
    since = pc.subtract(pa.array(f["ts"], pa.int64()), pa.array(f["connected_ts"], pa.int64()))
    return pc.divide(since.cast(pa.float64()), 1e9)


_TYPE_NAMES = pa.array([TYPES[c][0] if c in TYPES else None for c in range(max(TYPES) + 1)])


def _event_type(f: dict[str, tuple[Any, ...]], node: str, count: int) -> pa.Array:
    """The hook names of the type codes; null for a code this version does not know."""
    codes = pa.array(f["type"], pa.int64())
    known = pc.less(codes, len(_TYPE_NAMES))
    return pc.take(_TYPE_NAMES, pc.if_else(known, codes, 0))  # 0: no type, null


_COLUMNS_MADE: dict[str, tuple[tuple[str, ...], _Build]] = {
    "event_time": (("ts",), _event_time),
    "node": ((), lambda f, node, count: pa.array([node] * count, pa.string())),
    "event_type": (("type",), _event_type),
    "session_seconds": (("ts", "connected_ts"), _session_seconds),
}
BUILDS = {name: _COLUMNS_MADE.get(name) or _plain(name) for name in ARROW_SCHEMA.names}


class _BatchMaker:
    """Events as Arrow record batches of some of the columns (Spark takes Arrow from a
    Python source several times faster than rows): each event a tuple of the fields those
    columns read, in one C call (an itemgetter per type), the tuples turned into columns
    by zip, the computed columns by Arrow."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.schema = pa.schema([ARROW_SCHEMA.field(name) for name in columns])
        read = {field for name in columns for field in BUILDS[name][0]}
        # seq and type always: a tuple of two at least, whatever the columns read.
        self.fields = ("seq", "type", *sorted(read - {"seq", "type"}))
        self.builds = [BUILDS[name][1] for name in columns]
        self.rows = {code: self._getter((*COMMON, *own)) for code, (_, own) in TYPES.items()}
        self.common_row = self._getter(COMMON)  # a type this version does not know

    def _getter(self, has: tuple[str, ...]) -> Callable[[list[Any]], tuple[Any, ...]]:
        """Those fields of an event with fields `has`, by position; one it does not
        have is read from the None the batch appends to each event (-1)."""
        return itemgetter(*(has.index(name) if name in has else -1 for name in self.fields))

    def __call__(self, events: list[list[Any]], node: str) -> pa.RecordBatch:
        """(The events are the read's own lists: a None is appended to each.)"""
        rows, common_row = self.rows, self.common_row
        taken = []
        for values in events:
            values.append(None)
            taken.append(rows.get(values[2], common_row)(values))
        transposed = zip(*taken, strict=True) if taken else [()] * len(self.fields)
        fields = dict(zip(self.fields, transposed, strict=True))
        count = len(taken)
        arrays = [build(fields, node, count) for build in self.builds]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


@functools.cache
def batch_maker(columns: tuple[str, ...] = tuple(ARROW_SCHEMA.names)) -> _BatchMaker:
    """The batch maker of these columns (one per process: made where it is used)."""
    return _BatchMaker(columns)


def types_option(value: str | None) -> list[str] | None:
    """The `types` option: the event types to read, heartbeats always among them (they
    move the watermark); None (all) when not given."""
    if not value:
        return None
    asked = {name.strip() for name in value.split(",") if name.strip()}
    unknown = sorted(asked - set(CODES))
    if unknown:
        raise ValueError(
            f"nautilus_events: unknown event types {', '.join(unknown)} in the types option "
            f"(known: {', '.join(CODES)})"
        )
    return sorted(asked | {"heartbeat"})


def tls_files(options: dict[str, str]) -> tuple[str, str, str] | None:
    """The TLS options: None for no TLS, else (cafile, certfile, keyfile), "" for one
    not given."""
    value = options.get("tls")
    on = (value or "false").strip().lower()
    if on not in ("true", "false"):
        raise ValueError(f"nautilus_events: tls is true or false, not {value!r}")
    cafile, certfile, keyfile = (options.get(key, "") for key in ("cafile", "certfile", "keyfile"))
    if on == "false" and not (cafile or certfile or keyfile):
        return None
    return cafile, certfile, keyfile


@functools.cache
def tls_context_of(files: tuple[str, str, str]) -> ssl.SSLContext:
    """The context of the TLS options (one per process: the system's CAs load once)."""
    return tls_context(*files, option="nautilus_events: ")


def read_on_option(value: str | None) -> str:
    """The `readOn` option: executors (the default) or driver."""
    where = (value or "executors").strip().lower()
    if where not in ("executors", "driver"):
        raise ValueError(f"nautilus_events: readOn is executors or driver, not {value!r}")
    return where


def columns_option(value: str | None) -> tuple[str, ...]:
    """The `columns` option: names in SCHEMA, in SCHEMA's order; all when not given."""
    if not value:
        return tuple(SCHEMA.names)
    asked = {name.strip() for name in value.split(",") if name.strip()}
    unknown = sorted(asked - set(SCHEMA.names))
    if unknown:
        raise ValueError(
            f"nautilus_events: unknown columns {', '.join(unknown)} in the columns option "
            f"(known: {', '.join(SCHEMA.names)})"
        )
    return tuple(name for name in SCHEMA.names if name in asked)
