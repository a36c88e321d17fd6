"""/metrics' `# HELP` lines: one for every counter and gauge, in docs/operations.md's
words (broker/metrics_help.py holds them; this test holds the two together)."""

from __future__ import annotations

import re
from pathlib import Path

from broker.metrics import Metrics
from broker.metrics_help import HELP

from .conftest import get

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
ROW = re.compile(r"^\| `([a-z0-9_]+)` \| `\$SYS[^`]*` \| (.+?) \|$", re.M)


def documented() -> dict[str, str]:
    """The rows of the Counters and Gauges tables (the only ones naming a $SYS topic), as
    plain text: links and code marks dropped."""
    plain = {}
    for name, words in ROW.findall(DOCS.read_text(encoding="utf-8")):
        words = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", words)
        plain[name] = words.replace("`", "").replace("\\|", "|")
    return plain


def test_the_help_is_the_documentation():
    assert documented() == HELP


def test_every_counter_and_gauge_has_its_help_line(start_broker):
    server = start_broker(http={"address": "127.0.0.1:0"})
    text = get(server, "/metrics").text
    helped = set(re.findall(r"^# HELP (\S+) ", text, re.M))
    counters = set(Metrics().snapshot())
    gauges = set(server.call(server.broker.gauges))
    assert counters | gauges | {"uptime_seconds"} <= helped
    assert "# HELP mqtt_publish_received PUBLISH packets from clients" in text
