"""`[http] cors_origins` from a real browser: headless Chromium opens a page served by a
tiny aiohttp server on another port (so another origin), whose script fetches the
broker's /status.json and an admin API call with a key (an x-api-key header: the browser
sends a preflight first). The page writes what it could read into its DOM, which Chromium
dumps: read when the page's origin is listed, blocked by the browser when it is not.

Both pages are opened at once, each by its own Chromium, to keep the test short; virtual
time does not run while a fetch is pending, so the dump comes after both fetches ended.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from .conftest import base_url
from .test_status import ById

CHROMIUM = shutil.which("chromium")
PAGE = """<!doctype html>
<pre id="status">pending</pre><pre id="api">pending</pre>
<script>
async function probe(id, url, init) {
  const shown = document.getElementById(id);
  try {
    const answer = await fetch(url, init);
    shown.textContent = "read " + answer.status + " " + (await answer.text());
  } catch (error) {
    shown.textContent = "blocked " + error.name;
  }
}
probe("status", "BROKER/status.json");
probe("api", "BROKER/api/v1/sessions", {headers: {"x-api-key": "KEY"}});
</script>
"""


class Pages:
    """An aiohttp server of one page, on two ports of 127.0.0.1 (two origins), in a
    thread of its own."""

    def __init__(self, page: str) -> None:
        self.page = page
        self.ports: list[int] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> Pages:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/", self._index)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        for _ in range(2):
            await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.ports = [address[1] for address in self._runner.addresses]

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(text=self.page, content_type="text/html")

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def pages() -> Iterator[list[Pages]]:
    made: list[Pages] = []
    yield made
    for server in made:
        server.stop()


def open_in_chromium(urls: list[str]) -> list[dict[str, str]]:
    """Each page's elements' text after its scripts ran (one Chromium per page, at once)."""
    assert CHROMIUM is not None
    browsers = [
        subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--virtual-time-budget=2000",
                "--dump-dom",
                url,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for url in urls
    ]
    shown = []
    try:
        for browser in browsers:
            dom, _ = browser.communicate(timeout=60)
            assert browser.returncode == 0
            page = ById()
            page.feed(dom)
            shown.append(page.text)
    finally:
        for browser in browsers:
            if browser.poll() is None:
                browser.kill()
                browser.wait()
    return shown


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (make test installs it)")
def test_a_page_of_a_listed_origin_reads_and_another_is_blocked(keyed_broker, pages):
    # The ports (so the origins) are known only once the page server runs, and the
    # broker's list only at its start: the page learns the broker's address afterwards.
    page = Pages(PAGE).start()
    pages.append(page)
    listed, unlisted = (f"http://127.0.0.1:{port}" for port in page.ports)
    server, key = keyed_broker(http={"cors_origins": [listed]})
    page.page = PAGE.replace("BROKER", base_url(server)).replace("KEY", key)

    allowed, blocked = open_in_chromium([listed + "/", unlisted + "/"])
    assert allowed["status"].startswith('read 200 [{"nautilus": {')
    assert allowed["api"].startswith('read 200 {"type": "table", "table": []')
    assert blocked == {"status": "blocked TypeError", "api": "blocked TypeError"}
