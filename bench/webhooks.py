# `python -m bench.webhooks`: auth_on_publish webhook calls per second, and their latency.
#
# Strategy: the webhook endpoint is a local aiohttp server in a child process of its own
# (`--serve`, answering {"result":"ok"}), so it does not share a core with the caller.
# Two measurements, each repeated and reported as the median:
# - plugin: the webhooks plugin driven directly, in this process on uvloop, by
#   `concurrency` coroutines each awaiting auth_on_publish in a loop: the raw call rate
#   of the plugin and its pooled keep-alive HTTP client, and the latency of one call.
# - broker: a Nautilus child process with an auth_on_publish webhook, and `concurrency`
#   MQTT 3.1.1 publishers (the bench load generator's raw clients) each keeping one QoS 1
#   PUBLISH in flight: every PUBLISH is one webhook call, so PUBACKs per second are calls
#   per second, and PUBLISH-to-PUBACK time is what a client waits for a call (the broker
#   holds a client's next packet until its webhook has answered, so one in flight per
#   client is also all a client can have). `--baseline` runs the same load without the
#   plugin, for the broker's own share.
# Both wait `--warmup` seconds before the clock starts, so pools and connections are warm.
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import packets
from .brokers import HOST, NAUTILUS_TOML, BrokerError, BrokerSpec, RunningBroker, raise_fd_limit
from .client import MqttClient, Uniform, open_client

WEBHOOK_TOML = """\
[plugins.webhooks]
enabled = true
response_timeout = 5000
pool_max_connections = {pool}

[[plugins.webhooks.endpoints]]
hook = "auth_on_publish"
url = "{url}"
"""
PATH = "/auth_on_publish"
OK = b'{"result":"ok"}'


# -- the endpoint (child process) --------------------------------------------------------


def serve(port: int) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=OK, content_type="application/json")

    app = web.Application()
    app.router.add_post(PATH, handle)
    loop = _new_loop()
    web.run_app(app, host=HOST, port=port, access_log=None, print=None, loop=loop)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


ENDPOINT = BrokerSpec(
    "endpoint",
    "webhook endpoint",
    lambda workdir, port: [sys.executable, "-m", "bench.webhooks", "--serve", str(port)],
    lambda: "-",
)


def _nautilus(url: str | None, pool: int) -> BrokerSpec:
    def command(workdir: Path, port: int) -> list[str]:
        config = NAUTILUS_TOML.format(host=HOST, port=port)
        if url is not None:
            config += WEBHOOK_TOML.format(url=url, pool=pool)
        (workdir / "nautilus.toml").write_text(config)
        return [sys.executable, "-m", "broker", "--config", str(workdir / "nautilus.toml")]

    label = "Nautilus + webhook" if url else "Nautilus, no plugin"
    return BrokerSpec("nautilus", label, command, lambda: "")


# -- measurements ------------------------------------------------------------------------


@dataclass
class Result:
    calls: float = 0.0  # per second
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    errors: int = 0
    error: str | None = None


@dataclass
class Window:
    """Latencies recorded between start and stop (ns), and how many calls completed."""

    recording: bool = False
    latencies: list[int] = field(default_factory=list)

    def result(self, seconds: float, errors: int = 0) -> Result:
        lat = sorted(self.latencies)
        if not lat:
            return Result(errors=errors, error="no call completed")
        return Result(
            calls=len(lat) / seconds,
            p50_ms=lat[len(lat) // 2] / 1e6,
            p99_ms=lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e6,
            errors=errors,
        )


async def measure_plugin(url: str, concurrency: int, warmup: float, duration: float) -> Result:
    from broker.config import build_section
    from hooks import Ok, PublishContext
    from plugins.webhooks import PLUGIN

    section: dict[str, object] = {"pool_max_connections": max(concurrency, 1)}
    section["endpoints"] = [{"hook": "auth_on_publish", "url": url}]
    plugin = PLUGIN(build_section(PLUGIN.Config, section, "plugins.webhooks"))
    await plugin.start()
    window = Window()
    errors = 0
    running = True

    async def caller(i: int) -> None:
        nonlocal errors
        context = PublishContext(
            client_id=f"bench-{i}", username="bench", topic=f"bench/{i}", payload=b"x" * 64, qos=1
        )
        call = plugin.auth_on_publish  # type: ignore[attr-defined]  # made at start()
        while running:
            started = time.perf_counter_ns()
            result = await call(context)
            if window.recording:
                window.latencies.append(time.perf_counter_ns() - started)
                if type(result) is not Ok:
                    errors += 1

    tasks = [asyncio.create_task(caller(i)) for i in range(concurrency)]
    try:
        await asyncio.sleep(warmup)
        window.recording = True
        started = time.perf_counter()
        await asyncio.sleep(duration)
        window.recording = False
        elapsed = time.perf_counter() - started
        running = False
        await asyncio.gather(*tasks)
    finally:
        await plugin.stop()
    return window.result(elapsed, errors)


async def measure_broker(
    host: str, port: int, concurrency: int, warmup: float, duration: float
) -> Result:
    window = Window()
    clients: list[MqttClient] = []
    for i in range(concurrency):
        clients.append(await open_client(host, port, f"bench-pub-{i}", uniform=Uniform.puback()))
    wire = packets.publish("bench/t", b"x" * 64, qos=1, packet_id=1)
    sent_at = [0] * concurrency

    def publisher(i: int, client: MqttClient):
        def send() -> None:
            sent_at[i] = time.perf_counter_ns()
            client.transport.write(wire)

        def acked() -> None:
            if window.recording:
                window.latencies.append(time.perf_counter_ns() - sent_at[i])
            send()

        client.on_ack = acked
        return send

    for send in [publisher(i, c) for i, c in enumerate(clients)]:
        send()
    await asyncio.sleep(warmup)
    window.recording = True
    started = time.perf_counter()
    await asyncio.sleep(duration)
    window.recording = False
    elapsed = time.perf_counter() - started
    for client in clients:
        client.on_ack = None
        client.transport.abort()
    return window.result(elapsed)


# -- the command -------------------------------------------------------------------------


def _run(coro) -> Result:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _once(args: argparse.Namespace, mode: str, concurrency: int) -> Result:
    try:
        with RunningBroker(ENDPOINT) as endpoint:
            url = f"http://{HOST}:{endpoint.target.port}{PATH}"
            if mode == "plugin":
                return _run(measure_plugin(url, concurrency, args.warmup, args.duration))
            spec = _nautilus(None if mode == "baseline" else url, args.pool)
            with RunningBroker(spec) as broker:
                target = broker.target
                result = _run(
                    measure_broker(
                        target.host, target.port, concurrency, args.warmup, args.duration
                    )
                )
                if (code := broker.exit_code()) is not None:
                    result.error = f"broker exited with code {code}: {broker.log_tail(5)}"
                return result
    except (BrokerError, OSError, TimeoutError, ConnectionError) as exc:
        return Result(error=f"{type(exc).__name__}: {exc}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.webhooks",
        description="auth_on_publish webhook calls per second and latency (medians).",
    )
    parser.add_argument("--mode", default="plugin,broker", help="plugin, broker (comma list)")
    parser.add_argument("--concurrency", default="8,16,32", help="callers / publishers, comma list")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pool", type=int, default=100, help="pool_max_connections (broker)")
    parser.add_argument("--baseline", action="store_true", help="also run without the plugin")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.serve is not None:
        serve(args.serve)
        return 0
    raise_fd_limit()
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if args.baseline and "broker" in modes:
        modes.append("baseline")
    levels = [int(c) for c in args.concurrency.split(",")]
    rows = []
    for mode in modes:
        for concurrency in levels:
            runs = []
            for repeat in range(args.repeats):
                result = _once(args, mode, concurrency)
                runs.append(result)
                error = f"  ERROR {result.error}" if result.error else ""
                print(
                    f"  {mode:<8} x{concurrency:<4} run {repeat + 1}: {result.calls:8,.0f} calls/s"
                    f"  p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms{error}",
                    file=sys.stderr,
                    flush=True,
                )
            good = [r for r in runs if r.error is None] or runs
            rows.append(
                (
                    mode,
                    concurrency,
                    statistics.median(r.calls for r in good),
                    statistics.median(r.p50_ms for r in good),
                    statistics.median(r.p99_ms for r in good),
                    sum(r.errors for r in runs),
                    len(good),
                )
            )
    print(f"\nMedians of {args.repeats} runs of {args.duration:g} s (after {args.warmup:g} s):\n")
    print("| measurement | concurrency | calls/s | p50 ms | p99 ms | denied | runs ok |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    names = {
        "plugin": "plugin, direct",
        "broker": "broker, QoS 1 publishers",
        "baseline": "broker, no plugin",
    }
    for mode, concurrency, calls, p50, p99, errors, ok in rows:
        print(
            f"| {names.get(mode, mode)} | {concurrency} | {calls:,.0f} | {p50:.2f} | {p99:.2f} "
            f"| {errors} | {ok}/{args.repeats} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
