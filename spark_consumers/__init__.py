"""spark_consumers: PySpark Structured Streaming over the event relay (docs/spark.md).

`source.py` is the `nautilus_events` data source (offsets are the relay's sequence
numbers, so a checkpointed query runs exactly once), reading through `relay.py`'s
blocking relay connection; `jobs.py` holds the built-in windowed analytics, `sinks.py`
where results go (console, Parquet, memory, or back into the broker as retained MQTT
messages: `mqtt_sink.py` logs in and publishes them), `session.py` a SparkSession set up
for the source, `errors.py` the failures said in one line, and `cli.py` the
`nautilus-spark` command. Imports none of the broker, only parts of `event_relay` (its
frames, event schema, client errors and TLS context, address parsing, and the relay
options of the command line).
"""

import sys


def main(argv: list[str] | None = None) -> int:
    """`nautilus-spark`: cli.main, or one line saying how to install PySpark when the
    `spark` extra is not installed (the broker's own install does not need it)."""
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        print(
            f"nautilus-spark: PySpark cannot be imported ({exc}); "
            "install it with: pip install 'nautilus-mqtt[spark]' (Spark also needs Java 17)",
            file=sys.stderr,
        )
        return 1
    from spark_consumers.cli import main as cli_main

    return cli_main(argv)
