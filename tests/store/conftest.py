"""The subprocess harness of tests/test_cli.py, shared by the store's crash tests."""

from tests.test_cli import start_process

__all__ = ["start_process"]  # a fixture, used by name
