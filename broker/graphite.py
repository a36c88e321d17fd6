"""Graphite: every figure of /metrics sent in Graphite's plaintext protocol every
`interval` seconds (VerneMQ's vmq_graphite), over one TCP connection made again after a
failure.

    [graphite]
    enabled = true
    host = "graphite.example.com"
    port = 2003
    interval = 20
    prefix = "mqtt"          # before the node's name
    api_key = ""             # hosted Graphite's: before everything

A line is `[<api_key>.][<prefix>.]<node>.<metric>[.<label value>...] <value> <unix time>`:
`mqtt.nautilus.mqtt_publish_received 1532 1795760000`. A connection that cannot be made,
or breaks, is one WARNING line (and one INFO line when it works again); the round is
skipped, the next one tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable

from broker.config import GraphiteSettings
from hooks import Metric

log = logging.getLogger("nautilus.graphite")

CONNECT_TIMEOUT = 5.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]")  # a level of a Graphite path: no dots, no spaces


def lines(metrics: Iterable[Metric], root: str, now: int) -> bytes:
    """The plaintext protocol's lines for `metrics` under `root` (api key, prefix, node)."""
    out = []
    for metric in metrics:
        path = ".".join([root, metric.name, *(_UNSAFE.sub("_", v) for _, v in metric.labels)])
        value = float(metric.value)
        shown = str(int(value)) if value.is_integer() else repr(value)
        out.append(f"{path} {shown} {now}\n")
    return "".join(out).encode()


class GraphiteReporter:
    def __init__(
        self, settings: GraphiteSettings, node: str, collect: Callable[[], list[Metric]]
    ) -> None:
        self.settings = settings
        self.collect = collect
        self.root = ".".join(p for p in (settings.api_key, settings.prefix, node) if p)
        self.sent_rounds = 0
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._writer is not None:
            self._writer.close()

    async def _forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval)
            await self.send_round()

    async def send_round(self) -> None:
        where = f"{self.settings.host}:{self.settings.port}"
        try:
            writer = self._writer
            if writer is None or writer.is_closing():
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.settings.host, self.settings.port),
                    CONNECT_TIMEOUT,
                )
                self._writer = writer
            assert writer is not None  # (made just above when there was none)
            writer.write(lines(self.collect(), self.root, int(time.time())))
            await asyncio.wait_for(writer.drain(), CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            if not self._failing:
                why = str(exc) or type(exc).__name__
                log.warning("graphite: cannot send to %s (%s); trying each round", where, why)
            self._failing = True
            if self._writer is not None:
                self._writer.close()
            self._writer = None
            return
        if self._failing:
            log.info("graphite: sending to %s again", where)
            self._failing = False
        self.sent_rounds += 1
