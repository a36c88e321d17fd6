"""The deployed configuration of bench.compare (bench/deployed.py, issue #42).

Against real brokers (a Nautilus process with auth_jwt, the acl plugin, LevelDB and the
relay read by a consumer process; a Mosquitto with a password file, an ACL file and
persistence): an anonymous client is refused, the drop counter's user is let in (and, in
Nautilus, may not subscribe to the load's topics), and mqttgen logs in and floods a
shared group with the drop counter read by its own user. Without brokers: the report
checks the deployed pair's targets and takes its generator headroom from the deployed
Mosquitto. The broker tests are skipped where Mosquitto or a C compiler (for
bench/bin/mqttgen) is missing.
"""

from __future__ import annotations

import asyncio
import shutil

import jwt
import pytest

from bench import cgen, compare, deployed, report
from bench.brokers import BROKERS, MODES, RunningBroker, for_mode
from bench.client import Login, open_client, subscribe
from bench.scenarios import BY_NAME, Measurement, Settings, in_modes

DEPLOYED = ("nautilus-deployed", "mosquitto-deployed")
FLOOD = for_mode(MODES["flood"])


def needs_brokers() -> None:
    if shutil.which("mosquitto") is None or shutil.which("mosquitto_passwd") is None:
        pytest.skip("Mosquitto (mosquitto, mosquitto_passwd) is not installed")
    if shutil.which("cc") is None and not cgen.BINARY.exists():
        pytest.skip("no C compiler (cc) to build bench/bin/mqttgen")


@pytest.mark.parametrize("name", DEPLOYED)
def test_anonymous_clients_and_other_users_are_kept_out(name):
    needs_brokers()
    spec = BROKERS[name]
    assert spec.credentials is not None

    async def check(host: str, port: int) -> None:
        with pytest.raises(ConnectionError, match="CONNACK return code 5"):
            await open_client(host, port, "anonymous")
        # The drop counter's user is let in, and may read $SYS but not the load's tree
        # (Nautilus's acl plugin refuses the SUBSCRIBE; Mosquitto grants it and checks
        # each delivery instead).
        sys_client = await open_client(host, port, "sys", login=spec.credentials.sys)
        try:
            await subscribe(sys_client, "$SYS/#", 0)
            if name == "nautilus-deployed":
                with pytest.raises(ConnectionError, match="refused"):
                    await subscribe(sys_client, "bench/0", 0)
        finally:
            sys_client.transport.abort()

    with RunningBroker(spec) as running:
        asyncio.run(check(running.target.host, running.target.port))


@pytest.mark.parametrize("name", DEPLOYED)
def test_mqttgen_logs_in_and_floods_a_shared_group(name):
    needs_brokers()
    (scenario,) = in_modes([BY_NAME["shared-qos1"]], ["flood"])
    settings = Settings(warmup=0.3, duration=1.0, settle=0.3)

    with RunningBroker(FLOOD[name]) as running:
        result = asyncio.run(cgen.measure(scenario, running.target, settings))

    assert result.error is None
    assert result.delivered and result.delivered > 0
    assert result.lost == 0  # every acknowledged message delivered
    assert result.drops is not None  # the drop counter's user read $SYS
    assert result.broker_cpu is not None


def test_nautilus_deployed_measures_the_broker_not_its_relay_consumer():
    needs_brokers()
    with RunningBroker(BROKERS["nautilus-deployed"]) as running:
        target = running.target
        assert target.pid is not None
        with open(f"/proc/{target.pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read().split(b"\0")
    assert b"broker" in argv and b"bench.relay.broker" not in argv


def test_tokens_name_their_user():
    credentials = deployed.nautilus_credentials()

    claims = jwt.decode(credentials.load.password, deployed.JWT_SECRET, algorithms=["HS256"])
    assert claims["rid"] == credentials.load.username == deployed.LOAD_USER
    assert credentials.sys == Login(deployed.SYS_USER, credentials.sys.password)


def _m(delivered: float, **fields) -> Measurement:
    return Measurement(delivered=delivered, accepted=delivered, **fields)


def test_the_report_checks_the_deployed_pair_and_its_headroom():
    scenarios = in_modes([BY_NAME["qos0-4pairs"], BY_NAME["qos1-4pairs"]], ["flood"])
    qos0, qos1 = (s.name for s in scenarios)
    complete = {"lost": 0.0, "acked": 1_000_000.0, "drops": 0.0}
    results = {
        # QoS 0: Nautilus 1.2x Mosquitto, delivering 25 % of what it read; Mosquitto 100 %.
        (qos0, "nautilus-deployed"): Measurement(delivered=60_000, accepted=240_000),
        (qos0, "mosquitto-deployed"): _m(50_000, loadgen_cpu=0.2),
        (qos1, "nautilus-deployed"): _m(80_000, **complete),
        (qos1, "mosquitto-deployed"): _m(50_000, **complete),
    }
    headroom = {(qos0, report.MOSQUITTO_2T): _m(50_500)}
    run = report.Run(
        command="python -m bench.compare",
        date="today",
        machine={},
        settings={},
        scenarios=scenarios,
        brokers=[BROKERS[name] for name in DEPLOYED],
        results=results,
        generator="c",
        headroom=headroom,
    )
    page = report.render(run)
    targets = page.split("## Targets: Nautilus against Mosquitto, both as deployed")[1]
    rows = {
        (cells[1], cells[2]): cells[-2]
        for line in targets.split("\n## ")[0].splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.split("|")])[1] != "Row"
    }

    qos0_row = "QoS 0, 4 pairs, 64 B, flood"
    assert rows[qos0_row, "delivered >= 1.5x Mosquitto"] == "NO"
    assert rows[qos0_row, "QoS 0: 100 % delivered where Mosquitto delivers 100 %"] == "NO"
    assert rows["QoS 1, 4 pairs, 100 in flight, 64 B, flood", "delivered >= 1.5x Mosquitto"] == (
        "yes"
    )
    assert "Issue 42 (both as deployed)" in targets
    # The headroom compares the deployed Mosquitto with one and two generator threads.
    assert "| 50,000 | 50,500 | 1.01x |" in page
    assert compare._headroom_mosquitto(list(run.brokers)) == "mosquitto-deployed"
