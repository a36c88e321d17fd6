# `python -m bench.bridge`: bridged throughput, Nautilus -> Mosquitto against Mosquitto's
# own bridge doing the same (Mosquitto -> Mosquitto).
#
# Strategy: a Mosquitto is the far broker. The near broker (a fresh Nautilus with one
# [[bridges]] table, or a Mosquitto with a `connection` section) bridges `bench/#` out
# to it at the scenario's QoS, both with their defaults otherwise (buffers of 1,000
# messages: Nautilus's max_outgoing_buffered_messages, Mosquitto's max_queued_messages).
# mqttgen's publishers write to the near broker, its subscribers read at the far one
# (`--sub-port`): delivered/s is what crossed the bridge. Floods (open loop: QoS 0 as
# fast as TCP takes it, QoS 1 with 100 in flight) and, at QoS 1, what was acknowledged
# to publishers but never arrived (`lost`: a bridge's drops). The near broker alone
# (its own subscribers, no bridge) is measured too: the ceiling a bridge is held to.
# Medians of `--repeats` runs.
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import cgen
from .brokers import (
    HOST,
    MODES,
    BrokerSpec,
    RunningBroker,
    _mosquitto,
    mosquitto_conf,
    mosquitto_path,
    nautilus_toml,
)
from .report import cpu_busy

FLOOD = MODES["flood"]


def nautilus_bridge(far_port: int, qos: int) -> Callable[[Path, int], list[str]]:
    def command(workdir: Path, port: int) -> list[str]:
        config = workdir / "nautilus.toml"
        text = nautilus_toml(FLOOD).format(host=HOST, port=port)
        text += (
            f'[[bridges]]\nname = "far"\naddress = "{HOST}:{far_port}"\n'
            f'[[bridges.topics]]\npattern = "bench/#"\nqos = {qos}\n'
        )
        config.write_text(text)
        return [sys.executable, "-m", "broker", "--config", str(config)]

    return command


def nautilus_alone() -> Callable[[Path, int], list[str]]:
    def command(workdir: Path, port: int) -> list[str]:
        config = workdir / "nautilus.toml"
        config.write_text(nautilus_toml(FLOOD).format(host=HOST, port=port))
        return [sys.executable, "-m", "broker", "--config", str(config)]

    return command


def mosquitto_bridge(far_port: int, qos: int) -> Callable[[Path, int], list[str]]:
    def command(workdir: Path, port: int) -> list[str]:
        config = workdir / "mosquitto.conf"
        text = mosquitto_conf(FLOOD).format(host=HOST, port=port)
        text += (
            f"connection far\naddress {HOST}:{far_port}\ntopic bench/# out {qos}\n"
            "try_private true\nbridge_protocol_version mqttv311\n"
        )
        config.write_text(text)
        return [mosquitto_path(), "-c", str(config)]

    return command


async def one(near_port: int, far_port: int | None, qos: int, duration: float) -> dict[str, Any]:
    load = cgen.Load(
        publishers=1,
        subscribers=1,
        qos=qos,
        duration=duration,
        settle=2 if qos else 0,
        sub_port=far_port,
    )
    return await cgen.run(HOST, near_port, load)


def run_near(
    near: BrokerSpec, far_port: int | None, qos: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    results = []
    for _ in range(args.repeats):
        with RunningBroker(near) as broker:
            results.append(asyncio.run(one(broker.target.port, far_port, qos, args.duration)))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bridge")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args(argv)
    print(f"CPU busy before the run: {cpu_busy():.0%}")
    floods = f"floods of {args.duration:g} s, medians of {args.repeats}"
    print(f"mqttgen, 1 publisher -> 1 subscriber, {floods}")
    print("| QoS | Near broker | Delivered/s at the far one | Runs | Lost (QoS 1) |")
    print("|---|---|---|---|---|")
    far_spec = BrokerSpec("mosquitto", "Mosquitto (far)", _mosquitto(FLOOD), lambda: "")
    for qos in (0, 1):
        with RunningBroker(far_spec) as far:
            port = far.target.port
            rows = [
                (
                    "Nautilus, bridged",
                    BrokerSpec("n", "n", nautilus_bridge(port, qos), lambda: ""),
                    port,
                ),
                (
                    "Mosquitto, bridged",
                    BrokerSpec("m", "m", mosquitto_bridge(port, qos), lambda: ""),
                    port,
                ),
                (
                    "Nautilus alone (no bridge)",
                    BrokerSpec("n0", "n0", nautilus_alone(), lambda: ""),
                    None,
                ),
            ]
            for label, spec, far_port in rows:
                results = run_near(spec, far_port, qos, args)
                rates = [r["delivered_per_s"] for r in results]
                lost = [r["lost"] for r in results] if qos else []
                runs = ", ".join(f"{r:,.0f}" for r in rates)
                shown = ", ".join(str(x) for x in lost) if lost else "-"
                print(
                    f"| {qos} | {label} | {statistics.median(rates):,.0f} | {runs} | {shown} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
