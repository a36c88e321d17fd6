"""`nautilus-spark` run by spark-submit on a real Spark standalone cluster (a master and a
worker on loopback, executors in their own JVM and Python): the relay is read by the
executors, and a query stopped and submitted again on its checkpoint writes every event
to its Parquet sink exactly once, partitioned by day."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pyspark
import pytest

from .test_source import publish, relay_of

pytestmark = pytest.mark.timeout(300)

SPARK_HOME = Path(pyspark.__file__).parent
CLI = Path(__file__).parents[2] / "spark_consumers" / "cli.py"


def spark_env(tmp_path: Path) -> dict[str, str]:
    conf = tmp_path / "spark-defaults.conf"
    conf.write_text("spark.master.rest.enabled false\n")
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",  # every Spark service binds to loopback only
        "SPARK_CONF_DIR": str(tmp_path),
        "SPARK_LOG_DIR": str(tmp_path),
        "PYSPARK_PYTHON": sys.executable,
    }


def start(command: list[str], env: dict[str, str], ready: str, log: Path) -> tuple:
    """A Spark daemon, once its output has a line matching `ready` (and that match);
    the rest of its output goes on to `log`."""
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    sink = log.open("w")
    for line in process.stdout:
        sink.write(line)
        found = re.search(ready, line)
        if found:
            threading.Thread(target=sink.writelines, args=(process.stdout,), daemon=True).start()
            return process, found
    process.wait()
    sink.close()
    raise RuntimeError(f"{command[1]} exited: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """A standalone master and one worker of 1 core: the master's spark:// URL, and the
    worker's directory (its executors' logs)."""
    tmp = tmp_path_factory.mktemp("spark-cluster")
    env = spark_env(tmp)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    work = tmp / "work"
    started = []
    try:
        master, found = start(
            [
                *(spark_class, "org.apache.spark.deploy.master.Master"),
                *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
            ],
            env,
            r"Starting Spark master at (spark://\S+)",
            tmp / "master.log",
        )
        started.append(master)
        url = found.group(1)
        worker, _ = start(
            [
                *(spark_class, "org.apache.spark.deploy.worker.Worker", url),
                *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", "0"),
                *("--work-dir", str(work)),
            ],
            env,
            r"Successfully registered with master",
            tmp / "worker.log",
        )
        started.append(worker)
        yield url, work
    finally:
        for process in started:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


def submit(master: str, tmp_path: Path, *args: str) -> None:
    done = subprocess.run(
        [
            *(str(SPARK_HOME / "bin" / "spark-submit"), "--master", master),
            *("--conf", f"spark.pyspark.python={sys.executable}"),
            *("--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false"),
            *(str(CLI), *args),
        ],
        env=spark_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_spark_submit_on_a_cluster_writes_every_event_once_across_a_restart(
    cluster, start_broker, paho_client, tmp_path
):
    master, work = cluster
    # Only the heartbeat each available-now run asks for as it starts (none while quiet).
    relay_config = {"enabled": True, "address": "127.0.0.1:0", "heartbeat_interval": 0}
    server = start_broker(event_relay=relay_config)
    relay, address = relay_of(server)
    out = tmp_path / "out"
    query = "SELECT seq, event_time, event_type, topic FROM events"
    args = ["sql", query, "--relay", address, "--sink", f"parquet:{out}"]
    args += ["--checkpoint", str(tmp_path / "checkpoint"), "--trigger", "available-now"]

    def seqs() -> list[int]:
        return sorted(pq.read_table(out, columns=["seq"]).column("seq").to_pylist())

    first_end = publish(server, paho_client, relay, 20)
    submit(master, tmp_path, *args)
    assert seqs() == list(range(1, first_end + 1))  # and the run's heartbeat
    end = publish(server, paho_client, relay, 15)  # while no query runs
    submit(master, tmp_path, *args)  # the same checkpoint: only what is new
    assert seqs() == list(range(1, end + 1))  # no duplicate, no gap
    # Partitioned by the events' day (a run just after midnight UTC may span two).
    days = {path.name for path in out.glob("date=*")}
    assert 1 <= len(days) <= 2 and all(re.fullmatch(r"date=\d{4}-\d\d-\d\d", d) for d in days)
    # The events were read by executors, in the worker's processes: not by the driver.
    executor_logs = "".join(path.read_text() for path in work.rglob("stderr"))
    assert "Running task" in executor_logs
