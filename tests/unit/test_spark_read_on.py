"""`nautilus-spark --read-on auto`: where the relay is read, from the trigger."""

from __future__ import annotations

import pytest

from spark_consumers.cli import read_on


@pytest.mark.parametrize(
    ("trigger", "where"),
    [
        ("0 seconds", "driver"),
        ("500 milliseconds", "driver"),
        ("1 second", "executors"),
        ("10 seconds", "executors"),
        ("available-now", "executors"),
        ("soon", "executors"),  # not an interval: Spark says what is wrong with it
    ],
)
def test_auto_reads_on_the_driver_for_triggers_under_a_second(trigger, where):
    assert read_on("auto", trigger) == where


def test_a_choice_is_kept_whatever_the_trigger():
    assert read_on("driver", "available-now") == "driver"
    assert read_on("executors", "0 seconds") == "executors"
