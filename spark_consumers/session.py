"""A SparkSession set up the way the relay's data source needs: on `local[*]` by default,
or on the cluster spark-submit names.

The pitfalls it handles (docs/spark.md, "Pitfalls handled"): Spark's Python workers
must be this interpreter (PYSPARK_PYTHON; another one lacks pyarrow and fails as a 10 s
"worker failed to connect back"), a local session wants few shuffle partitions (200 by
default make a windowed query take seconds per batch), binds to loopback, and starts a
smaller JVM (options that count only in the process's first session).
"""

from __future__ import annotations

import os
import shutil
import sys

from pyspark.sql import SparkSession

from spark_consumers.source import NautilusEvents

# Spark's default checkpoint writer renames through Hadoop's FileContext, which, without
# Hadoop's native library (pip's pyspark has none), runs `readlink` in a new process for
# every path it looks at: about 20 processes a micro-batch, 60 ms of each one's 220 ms
# (docs/spark.md, "Latency"). The FileSystem-based writer renames with the file system's
# own call, atomic on a local disk.
FILE_SYSTEM_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


class JavaMissing(RuntimeError):
    """Spark needs a Java runtime and there is none."""


def submitted() -> bool:
    """Launched by spark-submit: its JVM, with the master and conf its command line gave,
    is already running (pyspark then connects to it through this variable)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def submitted_session(app: str = "nautilus-spark") -> SparkSession:
    """The session of a spark-submit run: master, executors and their Python are
    spark-submit's (`--master`, `--conf spark.pyspark.python=...`); only what the source
    and the jobs need is set here."""
    session = (
        SparkSession.builder.appName(app).config("spark.sql.session.timeZone", "UTC").getOrCreate()
    )
    session.dataSource.register(NautilusEvents)
    return session


def local_session(master: str = "local[*]", app: str = "nautilus-spark") -> SparkSession:
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        raise JavaMissing("Spark needs Java 17 or newer: install openjdk-17-jre-headless")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.checkpointFileManagerClass", FILE_SYSTEM_CHECKPOINTS)
        .config("spark.driver.memory", "512m")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(NautilusEvents)
    return session
