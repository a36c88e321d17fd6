"""Client fixtures for the broker behaviour tests (the broker fixtures are in tests/)."""

from .helpers import paho_client, raw_client

__all__ = ["paho_client", "raw_client"]
