"""spark_consumers: PySpark Structured Streaming over the event relay (docs/spark.md).

`source.py` is the `nautilus_events` data source (offsets are the relay's sequence
numbers, so a checkpointed query runs exactly once), reading through `relay.py`'s
blocking relay connection; `jobs.py` holds the built-in windowed analytics, `sinks.py`
where results go (console, Parquet, memory, or back into the broker as retained MQTT
messages), `session.py` a SparkSession set up for the source, and `cli.py` the
`nautilus-spark` command. Imports none of the broker, only parts of `event_relay` (its
frames, event schema, client errors and address parsing).
"""
