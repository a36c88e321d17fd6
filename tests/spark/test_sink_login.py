"""The MQTT sink as an authenticated client, in real Spark: `nautilus-spark` publishing
into a broker with anonymous access off, auth_jwt and an ACL (user `spark` may write
`$analytics/#` only), over TLS; a wrong token and an ACL that refuses the sink each end
the command with one line and no traceback (a relay that refuses it: test_source.py); a
broker away for longer than the sink's timeout fails the batch, which a later run on the
same checkpoint publishes once the broker is back."""

from __future__ import annotations

import socket
import subprocess

import pytest
import trustme
from pyspark.errors import StreamingQueryException

from spark_consumers import jobs
from spark_consumers.cli import ONE_LINE
from spark_consumers.errors import one_line
from spark_consumers.mqtt_sink import PASSWORD_ENV, MqttOptions, client_id
from spark_consumers.sinks import writer
from tests.broker.test_tls import issue
from tests.plugins.auth_jwt.helpers import jwt_sections, recorder_of
from tests.plugins.auth_jwt.tokens import SECRET, claims, hs_sign

from . import commands
from .commands import failure_line
from .test_sinks import retained, traffic
from .test_source import relay_of

pytestmark = pytest.mark.timeout(240)

ACL = """\
user dev
topic write dash/#
user spark
topic write $analytics/#
user reader
topic read $analytics/#
"""
TOTALS = {"dash/a": (6, 12), "dash/b": (2, 6)}  # topic -> (messages, bytes) of traffic()


def login(username: str) -> dict[str, str]:
    """paho_client's arguments for `username` with a valid token."""
    return {"username": username, "password": hs_sign(claims(username))}


@pytest.fixture
def jwt_broker(start_broker, tmp_path):
    """A broker with anonymous access off, auth_jwt, the ACL above and the relay; a
    plain listener first, then a TLS one whose certificate names 127.0.0.1 only."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    certificate = issue(ca, tmp_path, "server", "127.0.0.1", cn="nautilus")
    (tmp_path / "nautilus.acl").write_text(ACL)
    acl = {"enabled": True, "acl_file": str(tmp_path / "nautilus.acl")}
    tls = {"type": "ssl", "address": "127.0.0.1:0"}
    tls |= {"certfile": certificate.certfile, "keyfile": certificate.keyfile}
    server = start_broker(
        listeners=[{"type": "tcp", "address": "127.0.0.1:0"}, tls],
        event_relay={"enabled": True, "address": "127.0.0.1:0"},
        **jwt_sections(after={"acl": acl}, secret=SECRET),
    )
    server.cafile = str(tmp_path / "ca.pem")
    server.tls_port = server.broker.listening[1][1]
    return server


def nautilus_spark(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`nautilus-spark topic-traffic ... --trigger available-now`, one day's window."""
    once = ["--trigger", "available-now", "--master", "local[2]", "--window", "1 day"]
    return commands.nautilus_spark("topic-traffic", *args, *once, env=env)


def test_the_sink_logs_in_with_a_token_over_tls(jwt_broker, paho_client, tmp_path):
    server = jwt_broker
    _, relay = relay_of(server)
    traffic(server, paho_client, **login("dev"))
    token = tmp_path / "spark.jwt"
    token.write_text(hs_sign(claims("spark")) + "\n")
    checkpoint = str(tmp_path / "checkpoint")
    sink = f"mqtts://spark@127.0.0.1:{server.tls_port}"
    done = nautilus_spark(
        *("--relay", relay, "--checkpoint", checkpoint, "--sink", sink),
        *("--sink-cafile", server.cafile, "--sink-password-file", str(token)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"; wrote 2 rows to {sink};" in done.stderr.splitlines()[-1]
    got = retained(server, paho_client, "$analytics/topic_traffic/#", 2, **login("reader"))
    assert {topic: (row["messages"], row["bytes"]) for topic, row in got.items()} == {
        f"$analytics/topic_traffic/{topic}": counts for topic, counts in TOTALS.items()
    }
    # Its client id, the same at every run on this checkpoint (for ACL patterns: %c).
    registered = recorder_of(server).expect(client_id("topic_traffic", checkpoint))
    assert (registered.hook, registered.username) == ("on_register", "spark")


def test_a_wrong_token_stops_the_job_in_one_line(jwt_broker, paho_client, tmp_path):
    server = jwt_broker
    _, relay = relay_of(server)
    traffic(server, paho_client, **login("dev"))
    forged = hs_sign(claims("spark"), secret="not-the-brokers-secret-" * 3)
    sink = f"mqtt://spark@127.0.0.1:{server.port}"
    done = nautilus_spark(
        *("--relay", relay, "--checkpoint", str(tmp_path / "c"), "--sink", sink),
        env={PASSWORD_ENV: forged},
    )
    assert failure_line(done) == (
        f"nautilus-spark: MQTT sink {sink}: connect refused: "
        "Bad user name or password (0x86): invalid_signature"
    )
    assert forged not in done.stderr


def test_an_acl_that_refuses_the_sink_stops_the_job_in_one_line(jwt_broker, paho_client, tmp_path):
    server = jwt_broker
    _, relay = relay_of(server)
    traffic(server, paho_client, **login("dev"))
    token = tmp_path / "spark.jwt"
    token.write_text(hs_sign(claims("spark")))
    sink = f"mqtt://spark@127.0.0.1:{server.port}"
    done = nautilus_spark(
        *("--relay", relay, "--checkpoint", str(tmp_path / "c"), "--sink", sink),
        *("--sink-password-file", str(token), "--prefix", "dashboards"),  # not $analytics/
    )
    refused = [  # the first row's; the broker adds why: no plugin allowed it
        f"nautilus-spark: MQTT sink {sink}: publish to dashboards/topic_traffic/{topic} "
        "refused: Not authorized (0x87): plugin_chain_exhausted"
        for topic in TOTALS
    ]
    assert failure_line(done) in refused


def test_a_broker_away_past_the_timeout_fails_the_batch_and_the_next_run_publishes_it(
    spark, start_broker, paho_client, tmp_path
):
    events = start_broker(event_relay={"enabled": True, "address": "127.0.0.1:0"})
    _, relay = relay_of(events)
    traffic(events, paho_client)
    port = free_port()  # where the results' broker will be
    checkpoint = str(tmp_path / "checkpoint")

    def run(timeout: float):
        source = spark.readStream.format("nautilus_events").option("relay", relay).load()
        sink, options = f"mqtt://127.0.0.1:{port}", MqttOptions(timeout=timeout)
        stream = writer(
            jobs.topic_traffic(source, window="1 day"),
            sink,
            "t",
            mqtt=options,
            checkpoint=checkpoint,
        )
        return stream.trigger(availableNow=True).start()

    with pytest.raises(StreamingQueryException) as caught:
        run(timeout=1).awaitTermination()
    assert one_line(str(caught.value), ONE_LINE) == (
        f"MQTT sink mqtt://127.0.0.1:{port}: broker unreachable for 1 s: Connection refused"
    )
    # Again on the same checkpoint: the batch that failed, published once the broker is
    # back, after it dropped the sink's first attempt.
    with socket.create_server(("127.0.0.1", port)) as away:
        away.settimeout(120)
        query = run(timeout=60)
        away.accept()[0].close()
    results = start_broker(listeners=[{"type": "tcp", "address": f"127.0.0.1:{port}"}])
    query.awaitTermination()
    got = retained(results, paho_client, "$analytics/t/#", 2)
    assert {topic: (row["messages"], row["bytes"]) for topic, row in got.items()} == {
        f"$analytics/t/{topic}": counts for topic, counts in TOTALS.items()
    }


def free_port() -> int:
    """A port nothing listens on (as far as anything can tell)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
