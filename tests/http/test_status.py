"""/status.json after traffic the test knows, and /status, the page, in real headless
Chromium: what it renders after its scripts ran, and that it refreshes live.

Live refresh, observed honestly without touching the broker: before the broker starts,
the test adds one aiohttp middleware to the broker's own app object
(`broker.http.app`, still unfrozen) that only watches /status.json requests. The first
request is answered at once and tells the test thread; the test then publishes K
messages, and only after their PUBACKs lets the second request through. Chromium runs
with a virtual time budget of 3 s: its timers fire at once but its clock reads as if the
2 s poll interval had passed (virtual time stops while a fetch is pending). So the final
DOM can only show msg_in = before + K, and a non-zero rate, if the page fetched
status.json again and re-rendered it by itself.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from aiohttp import web

from broker import __version__
from tests.broker.helpers import PUBLISH, RawClient, unique_id
from tests.conftest import WAIT, BrokerThread

from .conftest import api, base_url, get

NODE = "status-node"
K = 10  # messages published between the page's first and second poll
CHROMIUM = shutil.which("chromium")


def nodes(server: Any) -> dict[str, Any]:
    reply = get(server, "/status.json")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("application/json")
    (entry,) = reply.json  # one node until clustering
    assert list(entry) == [NODE]
    figures: dict[str, Any] = entry[NODE]
    return figures


def test_status_json_after_known_traffic(start_broker, raw_client):
    server = start_broker(broker={"node_name": NODE, "systree_enabled": False})
    offline = raw_client(server)
    offline.connect("offline-one", clean=False)  # a persistent session, left offline
    offline.subscribe(("q/#", 1))
    offline.disconnect()
    online = raw_client(server)
    online.connect("online-one")
    online.subscribe(("q/#", 1), ("r/#", 0))
    pub = raw_client(server)
    pub.connect("publisher")
    for _ in range(3):
        pub.publish("q/x", b"m", qos=1)
    pub.publish("r/kept", b"k", retain=True)
    for _ in range(4):
        online.ack(online.expect(PUBLISH))
    metrics = server.broker.metrics
    server.wait_for(lambda: metrics.mqtt_puback_received == 3)

    figures = nodes(server)
    assert 0 <= figures.pop("uptime_seconds") < 60
    listener = figures.pop("listeners")
    assert listener == [
        {
            "type": "tcp",
            "status": "running",
            "ip": "127.0.0.1",
            "port": server.port,
            "mountpoint": "",
            "max_conns": 10000,
        }
    ]
    assert figures == {
        "num_online": 2,
        "num_offline": 1,
        "connections": 2,
        "msg_in": 4,
        "msg_out": 4,
        "bytes_in": metrics.bytes_received,
        "bytes_out": metrics.bytes_sent,
        "queue_in": 3,  # the offline session's three QoS 1 messages
        "queue_out": 4,  # what was sent (the online subscriber's four)
        "queue_drop": 0,
        "queue_unhandled": 0,
        "num_subscriptions": 3,
        "num_retained": 1,
        "version": __version__,
        "ready": True,
        "mystatus": [{NODE: True}],
        "plugins": [],
    }


def test_status_json_lists_plugins_and_whether_enabled(keyed_broker, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("topic #\n")
    server, key = keyed_broker(
        broker={"node_name": NODE},
        plugins={"acl": {"enabled": True, "acl_file": str(acl)}},
    )
    assert nodes(server)["plugins"] == [{"name": "acl", "enabled": True}]
    assert api(server, "plugin/disable", key, name="acl").status == 200
    assert nodes(server)["plugins"] == [{"name": "acl", "enabled": False}]


# --------------------------------------------------------------------------- the page


class ById(HTMLParser):
    """The text of every element with an id (nested text included), from a DOM dump."""

    def __init__(self) -> None:
        super().__init__()
        self.text: dict[str, str] = {}
        self._open: list[tuple[str, str | None]] = []  # (tag, id) of the elements open
        self.rows: list[list[str]] = []  # the cells of every table row
        self._row: list[str] | None = None
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self._in_script = True
        element_id = dict(attrs).get("id")
        if element_id is not None:
            self.text[element_id] = ""
        self._open.append((tag, element_id))
        if tag == "tr":
            self._row = []
            self.rows.append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._row.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._in_script:
            return
        for _, element_id in self._open:
            if element_id is not None:
                self.text[element_id] += data
        if self._row and any(tag in ("td", "th") for tag, _ in self._open):
            self._row[-1] += data


class Polls:
    """A middleware counting the browser's /status.json requests (not the test's own,
    made with urllib), holding the second one until `go`."""

    def __init__(self) -> None:
        self.count = 0
        self.first_answered = threading.Event()
        self.go = asyncio.Event()  # set on the broker's loop by the test

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/status.json" or "Chrome" not in request.headers["User-Agent"]:
            return await handler(request)
        self.count += 1
        if self.count == 2:
            await asyncio.wait_for(self.go.wait(), WAIT)
        response = await handler(request)
        if self.count == 1:
            self.first_answered.set()
        return response


@pytest.fixture
def watched_broker(tmp_path) -> Iterator[tuple[BrokerThread, Polls]]:
    acl = tmp_path / "acl"
    acl.write_text("topic #\n")
    server = BrokerThread(
        {
            "broker": {"node_name": NODE, "systree_enabled": False},
            "http": {"address": "127.0.0.1:0"},
            "plugins": {"acl": {"enabled": True, "acl_file": str(acl)}},
        }
    )
    polls = Polls()
    assert server.broker.http is not None
    server.broker.http.app.middlewares.append(polls.middleware)  # before the app freezes
    try:
        yield server.start(), polls
    finally:
        server.stop()


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (make test installs it)")
def test_status_page_in_chromium_renders_the_figures_and_refreshes_live(watched_broker):
    server, polls = watched_broker
    sub = RawClient(server.host, server.port)
    pub = RawClient(server.host, server.port)
    try:
        sub.connect(unique_id("sub"))
        sub.subscribe(("live/#", 1))
        pub.connect(unique_id("pub"))
        pub.publish("live/x", b"before", qos=1)
        sub.ack(sub.expect(PUBLISH))
        assert CHROMIUM is not None
        chromium = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--virtual-time-budget=3000",
                "--dump-dom",
                base_url(server) + "/status",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert polls.first_answered.wait(30), "Chromium never asked for status.json"
            assert nodes(server)["msg_in"] == 1  # what the first poll got
            for i in range(K):
                pub.publish("live/x", b"%d" % i, qos=1)
                sub.ack(sub.expect(PUBLISH))
            server.loop.call_soon_threadsafe(polls.go.set)
            dom, _ = chromium.communicate(timeout=60)
        finally:
            if chromium.poll() is None:
                chromium.kill()
                chromium.wait()
        assert chromium.returncode == 0
        assert polls.count == 2  # 3 s of page time: the first poll and one more

        page = ById()
        page.feed(dom)
        figures = nodes(server)  # nothing changed since the second poll
        assert figures["msg_in"] == 1 + K
        shown = page.text
        assert shown["updated"].startswith("updated ")
        assert shown[f"node-{NODE}"].split()[0] == NODE  # the heading: the node's name
        assert (shown["ready"], figures["ready"]) == ("ready", True)
        for key in (
            "connections",
            "num_online",
            "num_offline",
            "num_subscriptions",
            "msg_in",
            "msg_out",
            "queue_in",
            "queue_drop",
            "num_retained",
        ):
            assert shown[key] == str(figures[key]), key
        assert shown["connections"] == "2"
        assert shown["msg_out"] == str(1 + K)
        # A rate needs two polls: K messages over the page's 2 s between them.
        assert float(shown["msg_in_rate"]) == pytest.approx(K / 2, rel=0.2)
        assert float(shown["msg_out_rate"]) == pytest.approx(K / 2, rel=0.2)
        assert ["tcp", f"127.0.0.1:{server.port}", "running", "10000"] in page.rows
        assert ["acl", "yes"] in page.rows
    finally:
        sub.close()
        pub.close()
