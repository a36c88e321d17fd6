# `python -m bench.acl`: Nautilus throughput with the ACL plugin off and on.
#
# Strategy: the machinery of bench.compare (a fresh broker process per measurement, the
# one-process load generator, medians of repeats) with Nautilus configurations that differ
# only by their [plugins] tables. The ACL file has ~100 rules of every kind (all, user,
# pattern, token, labels); the benchmark's own topics are allowed by a pattern near its
# end, so a decision goes through the "all" table and the patterns. A third configuration
# has a plugin that allows everything and does nothing else: the difference between it and
# no plugin is what calling an auth chain costs the broker, the rest is the ACL's own work.
# A fourth has a plugin with hooks off the publish path only, which must cost nothing.
# Runs alternate between the configurations so that drift of the machine touches all
# alike. The cost of one uncached decision (a new client or topic) is measured in-process.
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from . import report
from .brokers import HOST, NAUTILUS_TOML, BrokerError, BrokerSpec, RunningBroker, raise_fd_limit
from .brokers import _nautilus_version as nautilus_version
from .scenarios import BY_NAME, Measurement, Scenario, Settings, measure

ACL_TOML = """\
[plugins.acl]
enabled = true
acl_file = "{acl_file}"
acl_reload_interval = 10
"""
# The same place in the chain, doing nothing: what the hook call itself costs the broker.
ALLOW_ALL_TOML = """\
[plugins.allow_all]
enabled = true
module = "bench.acl:AllowAll"
"""


EVENTS_ONLY_TOML = """\
[plugins.events_only]
enabled = true
module = "bench.acl:EventsOnly"
"""


class EventsOnly:
    """Implements hooks off the publish path only: the publish path must not notice."""

    def on_register(self, ctx) -> None:
        pass

    def on_client_gone(self, ctx) -> None:
        pass


class AllowAll:
    """An authorization plugin that allows everything, as cheaply as possible."""

    def __init__(self) -> None:
        from hooks import Ok

        self._ok = Ok()

    def auth_on_publish(self, ctx):
        return self._ok

    def auth_on_subscribe(self, ctx):
        return self._ok


def acl_rules(count: int = 100) -> str:
    """An ACL file of about `count` rules that lets the benchmark's clients through."""
    lines = ["# bench/acl.py: rules of every kind, the benchmark's topics last"]
    group = max(1, count * 12 // 100)  # six groups of lines of this size
    lines += [f"topic read fleet/{i}/+/status" for i in range(group)]
    lines += [f"topic write fleet/{i}/+/command label fleet" for i in range(group)]
    lines += [f"pattern read clients/%c/inbox/{i}/#" for i in range(group)]
    lines += [f"pattern write %u/devices/%c/{i}" for i in range(group)]
    lines += [f"token read tenants/%(c, -, 1)/{i}/#" for i in range(group)]
    lines += [f"token write rooms/%(u, :, 2)/{i}/+ label rooms" for i in range(group)]
    lines += ["pattern bench/+ label bench"]  # the benchmark's topics bench/0 .. bench/3
    for user in range(max(0, count - 6 * group - 1) // 3):
        lines += [f"user operator{user}", f"topic ops/{user}/#", f"topic read audit/{user}/+"]
    return "\n".join(lines) + "\n"


def _nautilus(plugin: str | None, rules: int):
    def command(workdir: Path, port: int) -> list[str]:
        config = NAUTILUS_TOML.format(host=HOST, port=port)
        if plugin == "allow_all":
            config += ALLOW_ALL_TOML
        elif plugin == "events_only":
            config += EVENTS_ONLY_TOML
        elif plugin == "acl":
            acl_file = workdir / "nautilus.acl"
            acl_file.write_text(acl_rules(rules))
            config += ACL_TOML.format(acl_file=acl_file)
        (workdir / "nautilus.toml").write_text(config)
        return [sys.executable, "-m", "broker", "--config", str(workdir / "nautilus.toml")]

    return command


def _run(coro) -> Measurement:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _measure(spec: BrokerSpec, scenario: Scenario, settings: Settings) -> Measurement:
    try:
        with RunningBroker(spec) as running:
            result = _run(measure(scenario, running.target, settings))
            if (code := running.exit_code()) is not None:
                result.error = f"broker exited with code {code}: {running.log_tail(5)}"
    except (BrokerError, OSError) as exc:
        result = Measurement(error=f"{type(exc).__name__}: {exc}")
    figure = f"{result.delivered:,.0f} msg/s" if result.delivered is not None else "-"
    error = f"  ERROR {result.error}" if result.error else ""
    print(f"  {spec.label:<16} {figure}{error}", file=sys.stderr, flush=True)
    return result


def uncached_decisions_us(rules: int, rounds: int = 20_000) -> tuple[float, float]:
    """Microseconds for a decision the cache does not hold: a new client's first one
    (its substitutions are resolved first), and a known client's new topic."""
    from plugins.acl.rules import RuleSet

    ruleset = RuleSet.from_text(acl_rules(rules))
    started = time.perf_counter()
    for i in range(rounds):
        view = ruleset.view(f"qos0-4pairs-pub{i}", None)
        assert view.check("write", "bench/0") is not None
    new_client = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(rounds):
        assert view.check("write", f"bench/{i}") is not None
    new_topic = time.perf_counter() - started
    return new_client / rounds * 1e6, new_topic / rounds * 1e6


def main(argv: list[str] | None = None) -> int:
    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog="python -m bench.acl",
        description="Nautilus throughput without and with the ACL plugin.",
    )
    parser.add_argument("--scenario", default="qos0-4pairs", choices=sorted(BY_NAME))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=defaults.duration, help="seconds")
    parser.add_argument("--warmup", type=float, default=defaults.warmup, help="seconds")
    parser.add_argument("--rules", type=int, default=100, help="about this many ACL rules")
    args = parser.parse_args(argv)
    raise_fd_limit()
    scenario = BY_NAME[args.scenario]
    settings = Settings(warmup=args.warmup, duration=args.duration)
    specs = [
        BrokerSpec("nautilus", "no plugin", _nautilus(None, args.rules), nautilus_version),
        BrokerSpec(
            "events-only",
            "events-only plugin",
            _nautilus("events_only", args.rules),
            nautilus_version,
        ),
        BrokerSpec(
            "allow-all", "allow-all plugin", _nautilus("allow_all", args.rules), nautilus_version
        ),
        BrokerSpec("acl", "acl plugin", _nautilus("acl", args.rules), nautilus_version),
    ]
    rule_count = len(acl_rules(args.rules).splitlines()) - 1
    busy = report.cpu_busy()
    if busy > 0.1:
        print(f"warning: CPUs already {busy:.0%} busy, figures will be low", file=sys.stderr)
    results: dict[str, list[Measurement]] = {spec.name: [] for spec in specs}
    for repeat in range(args.repeats):
        print(f"{scenario.name}, run {repeat + 1} of {args.repeats}", file=sys.stderr)
        for spec in specs:
            results[spec.name].append(_measure(spec, scenario, settings))
    base = None
    print(
        f"{scenario.title} ({scenario.name}), median of {args.repeats} x {args.duration:g} s, "
        f"ACL file of {rule_count} lines:"
    )
    for spec in specs:
        runs = [m.delivered for m in results[spec.name] if m.delivered is not None]
        if not runs:
            print(f"  {spec.label:<16} failed: {report.median(results[spec.name]).error}")
            continue
        median = statistics.median(runs)
        change = "" if base is None else f"  ({(median - base) / base:+.1%})"
        base = median if base is None else base
        each = ", ".join(f"{r:,.0f}" for r in runs)
        print(f"  {spec.label:<16} {median:>12,.0f} msg/s{change}   runs: {each}")
    client, topic = uncached_decisions_us(args.rules)
    print(
        f"  not cached: a new client's first decision {client:.1f} us, a new topic {topic:.1f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
