"""Screenshot a running broker's /status page after it has refreshed in real time (so its
rates show), through headless Chromium's DevTools protocol: docs/images/status.png.

    python scripts/status-screenshot.py http://127.0.0.1:8888/status docs/images/status.png

(`chromium --screenshot` shoots as soon as the page has loaded, before the second poll.)
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
import urllib.request

from websockets.sync.client import connect

WAIT = 5.0  # seconds the page runs before the shot: two polls at least


def main(url: str, out: str) -> None:
    chromium = subprocess.Popen(
        [
            *("chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"),
            *("--remote-debugging-port=0", "--window-size=1000,620", "about:blank"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert chromium.stderr is not None
        for line in chromium.stderr:
            found = re.search(r"DevTools listening on ws://([^/]+)/", line)
            if found:
                break
        else:
            raise SystemExit("chromium did not start its DevTools server")
        with urllib.request.urlopen(f"http://{found[1]}/json/list") as response:
            page = next(t for t in json.load(response) if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None) as devtools:
            devtools.send(json.dumps({"id": 1, "method": "Page.navigate", "params": {"url": url}}))
            time.sleep(WAIT)  # real time: the page's rates need two polls
            devtools.send(json.dumps({"id": 2, "method": "Page.captureScreenshot"}))
            while True:
                answer = json.loads(devtools.recv())
                if answer.get("id") == 2:
                    break
        with open(out, "wb") as image:
            image.write(base64.b64decode(answer["result"]["data"]))
    finally:
        chromium.terminate()
        chromium.wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
