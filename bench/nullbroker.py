# A null broker for calibrating the load generator: `python -m bench.nullbroker --port N`.
#
# It answers CONNECT and SUBSCRIBE, then pipes every byte a publishing connection sends,
# unparsed, to every subscriber. For one QoS 0 publisher the forwarded bytes are exactly
# the PUBLISHes a real broker would deliver, at the cost of a memcpy, so running the 1 -> 1
# scenario against it measures what the generator itself can send and count. It is only
# correct with a single publisher: chunks from several would interleave mid-packet.
# A subscriber whose write buffer fills pauses reading from the publishers (back-pressure).
from __future__ import annotations

import argparse
import asyncio

CONNACK = b"\x20\x02\x00\x00"
SUBACK_HEAD = b"\x90\x03"


class _Pipes:
    def __init__(self) -> None:
        self.subscribers: set[asyncio.Transport] = set()
        self.publishers: set[asyncio.Transport] = set()


class _Connection(asyncio.Protocol):
    def __init__(self, pipes: _Pipes):
        self._pipes = pipes
        self._transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self._buf = bytearray()
        self._piping = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self._pipes.subscribers.discard(self._transport)
        self._pipes.publishers.discard(self._transport)

    def pause_writing(self) -> None:
        for publisher in self._pipes.publishers:
            publisher.pause_reading()

    def resume_writing(self) -> None:
        for publisher in self._pipes.publishers:
            publisher.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._piping:
            for subscriber in self._pipes.subscribers:
                subscriber.write(data)
            return
        self._buf += data
        self._handshake()

    def _handshake(self) -> None:
        # Handshake packets are small: a single remaining-length byte is enough here.
        buf = self._buf
        while len(buf) >= 2 and len(buf) >= 2 + buf[1]:
            kind, end = buf[0] >> 4, 2 + buf[1]
            if kind == 1:  # CONNECT
                self._transport.write(CONNACK)
            elif kind == 8:  # SUBSCRIBE: grant the requested QoS of the first filter
                self._transport.write(SUBACK_HEAD + buf[2:4] + buf[end - 1 : end])
                self._pipes.subscribers.add(self._transport)
            elif kind == 3:  # first PUBLISH: from now on this connection is a pipe
                self._piping = True
                self._pipes.publishers.add(self._transport)
                self.data_received(bytes(buf))
                buf.clear()
                return
            del buf[:end]


async def _serve(host: str, port: int) -> None:
    pipes = _Pipes()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(pipes), host, port)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="byte-pipe MQTT stand-in for calibration")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(args.host, args.port))
    else:
        uvloop.run(_serve(args.host, args.port))


if __name__ == "__main__":
    main()
