"""One local Spark session for the whole run (starting one takes seconds), and the
broker fixtures of tests/broker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_consumers.session import local_session
from tests.broker.helpers import paho_client, raw_client
from tests.event_relay.conftest import fleet_files

__all__ = ["fleet_files", "paho_client", "raw_client"]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_session("local[2]", "nautilus-tests")
    yield session
    session.stop()
