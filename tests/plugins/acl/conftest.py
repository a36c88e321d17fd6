"""Client fixtures (the broker fixtures are in tests/conftest.py)."""

from tests.broker.helpers import paho_client, raw_client

__all__ = ["paho_client", "raw_client"]
