"""A reader of the admin API's trace stream (/api/v1/trace/client, server-sent events) for
the trace tests: a thread reads the events into a queue, and the test waits for the line
it expects (`expect`), never for a fixed time.

It speaks HTTP/1.0 over its own socket (the answer is then the stream as it is, until the
broker closes it), so that `close` really closes the connection, as a reader going away
does; urllib's response cannot be closed from another thread while it is read."""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import urllib.parse
from typing import Any

from tests.broker.helpers import TIMEOUT

END = "end"


class TraceReader:
    def __init__(self, address: tuple[str, int], key: str, **query: Any) -> None:
        self.sock = socket.create_connection(address, timeout=TIMEOUT)
        path = "/api/v1/trace/client?" + urllib.parse.urlencode(query)
        self.sock.sendall(f"GET {path} HTTP/1.0\r\nx-api-key: {key}\r\n\r\n".encode())
        self.stream = self.sock.makefile("rb")
        status = self.stream.readline().decode()
        headers = {}
        while (header := self.stream.readline().decode().strip()) != "":
            name, _, value = header.partition(":")
            headers[name.lower()] = value.strip()
        self.status = int(status.split()[1])
        self.content_type = headers.get("content-type", "")
        self.sock.settimeout(None)  # the thread waits as long as the stream lasts
        self.events: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []  # every line taken so far, the last one too
        self.ended: dict[str, Any] | None = None
        if self.status == 200:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        name = ""
        with contextlib.suppress(OSError, ValueError):  # closed by the test
            for raw in self.stream:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    self.events.put((name, json.loads(line[6:])))
                    name = ""
        self.events.put(None)  # the stream is over

    def next(self) -> dict[str, Any]:
        """The next line (AssertionError if none comes, or the stream ended)."""
        try:
            event = self.events.get(timeout=TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"no trace line in time; seen: {self.texts()}") from None
        assert event is not None, f"the stream closed; seen: {self.texts()}"
        name, line = event
        self.seen.append(line)
        if name == END:
            self.ended = line
        return line

    def expect(self, kind: str, starts: str) -> dict[str, Any]:
        """The next line of `kind` whose text starts with `starts` (others are kept in
        `seen`)."""
        while True:
            line = self.next()
            if line["kind"] == kind and line["text"].startswith(starts):
                return line
            assert self.ended is None, f"the trace ended before {starts!r}: {self.texts()}"

    def expect_end(self) -> dict[str, Any]:
        """The trace's last line."""
        while self.ended is None:
            self.next()
        return self.ended

    def texts(self) -> list[str]:
        return [f"{line['kind']} {line['text']}" for line in self.seen]

    def body(self) -> dict[str, Any]:
        """A refusal's JSON (when status is not 200)."""
        return json.loads(self.stream.read())

    def close(self) -> None:
        """The reader goes away."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
