"""One local Spark session for the whole run (starting one takes seconds), and the
broker fixtures of tests/broker."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_consumers.session import local_session
from tests.broker.helpers import paho_client, raw_client
from tests.event_relay.conftest import fleet_files

__all__ = ["fleet_files", "paho_client", "raw_client"]


@pytest.fixture(scope="session", autouse=True)
def java() -> None:
    """Every test here runs Spark, which needs Java (`make test` installs it; `make
    test-no-system` does not, and these tests are then skipped, saying why)."""
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        pytest.skip("needs Java 17 for Spark (apt-get install openjdk-17-jre-headless)")


@pytest.fixture(scope="session")
def spark(java) -> Iterator[SparkSession]:
    session = local_session("local[2]", "nautilus-tests")
    yield session
    session.stop()
