"""/metrics in Prometheus' text format (version 0.0.4): the broker's counters and gauges
under VerneMQ's names, then each plugin's own (`metrics()` returning hooks.Metric), every
line labelled with the node, as VerneMQ's exporter does."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from broker.metrics_help import HELP
from hooks import Metric

if TYPE_CHECKING:
    from broker.admin import FigureSource

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def collect(figures: FigureSource) -> list[Metric]:
    """Every figure: the broker's, then the plugins' (a plugin that fails to report is
    left out, and the failure is reported as a metric of its own)."""
    found = [
        Metric(name, value, help=HELP.get(name, ""))
        for name, value in figures.metrics.snapshot().items()
    ]
    found += [
        Metric(name, value, "gauge", help=HELP.get(name, ""))
        for name, value in figures.gauges().items()
    ]
    uptime = int(time.time() - figures.started_at)
    found.append(Metric("uptime_seconds", uptime, "gauge", help="seconds since the broker started"))
    found += [Metric(name, value, kind) for name, (value, kind) in figures.store.figures().items()]
    found += figures.peers.group_metrics()
    for name, report in figures.doors.metrics:
        try:
            found.extend(report())
        except Exception:  # a plugin's bug must not take /metrics down
            found.append(Metric("plugin_metrics_errors", 1, "gauge", (("plugin", name),)))
    return found


def render(metrics: Iterable[Metric], node: str, namespace: str = "") -> str:
    """The text format: samples of one name together, after its # TYPE line."""
    by_name: dict[str, list[Metric]] = {}
    for metric in metrics:
        by_name.setdefault(namespace + metric.name, []).append(metric)
    lines = []
    for name, samples in by_name.items():
        first = samples[0]
        if first.help:
            lines.append(f"# HELP {name} {_escape_help(first.help)}")
        lines.append(f"# TYPE {name} {first.kind}")
        for sample in samples:
            labels = ",".join(
                f'{key}="{_escape(value)}"' for key, value in (("node", node), *sample.labels)
            )
            lines.append(f"{name}{{{labels}}} {_number(sample.value)}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return repr(float(value))
