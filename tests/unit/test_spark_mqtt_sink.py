"""The MQTT sink's URL and options, resolved into a target (spark_consumers/mqtt_sink.py:
pure, no broker), the command's options for it, and the one line a failed query is
reported in (spark_consumers/errors.py)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme

from spark_consumers.cli import ONE_LINE, mqtt_options, parse_args
from spark_consumers.errors import SinkError, one_line
from spark_consumers.mqtt_sink import (
    PASSWORD_ENV,
    MqttOptions,
    client_id,
    mqtt_target,
    sink_address,
)

NO_ENV: dict[str, str] = {}
NOT_A_PAIR = "not a certificate and its private key in PEM (PEM lib)"


@pytest.mark.parametrize(
    ("sink", "address"),
    [
        ("mqtt://spark@127.0.0.1:1884", ("mqtt", "127.0.0.1", 1884, "spark")),
        ("mqtt://spark@broker.example", ("mqtt", "broker.example", 1883, "spark")),
        ("mqtts://spark@broker.example", ("mqtts", "broker.example", 8883, "spark")),
        ("mqtts://spark@Broker.Example:9883/", ("mqtts", "broker.example", 9883, "spark")),
        ("mqtt://127.0.0.1:1884", ("mqtt", "127.0.0.1", 1884, None)),
        ("mqtt://spark@[::1]:1884", ("mqtt", "::1", 1884, "spark")),
        ("mqtts://[::1]", ("mqtts", "::1", 8883, None)),
        ("mqtt://dev%40corp@h:1", ("mqtt", "h", 1, "dev@corp")),
        # The older form, as before: an empty host is 127.0.0.1, an empty port 1883.
        ("mqtt:broker:1884", ("mqtt", "broker", 1884, None)),
        ("mqtt::1884", ("mqtt", "127.0.0.1", 1884, None)),
        ("mqtt:broker:", ("mqtt", "broker", 1883, None)),
        ("mqtt:::1:1884", ("mqtt", "::1", 1884, None)),
        ("mqtt:[::1]:1884", ("mqtt", "::1", 1884, None)),
    ],
)
def test_sink_urls(sink, address):
    assert sink_address(sink) == address
    target = mqtt_target(sink, "topic_traffic", environ=NO_ENV)
    assert (target.host, target.port, target.username) == address[1:]
    assert (target.tls is not None) == (address[0] == "mqtts")


@pytest.mark.parametrize(
    ("sink", "url"),
    [
        ("mqtt://spark@broker.example", "mqtt://spark@broker.example:1883"),
        ("mqtts://spark@Broker.Example:9883/", "mqtts://spark@broker.example:9883"),
        ("mqtts://[::1]", "mqtts://[::1]:8883"),
        ("mqtt://dev%40corp@h:1", "mqtt://dev%40corp@h:1"),
        ("mqtt::1884", "mqtt://127.0.0.1:1884"),
        ("mqtt:::1:1884", "mqtt://[::1]:1884"),
    ],
)
def test_how_messages_name_a_sink(sink, url):
    assert mqtt_target(sink, "t", environ=NO_ENV).url == url


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        ("mqtt://h:port", "--sink mqtt://h:port: expected mqtt://[USER@]HOST[:PORT], "),
        ("mqtt://h:0", "--sink mqtt://h:0: expected"),
        ("mqtt://h:70000", "--sink mqtt://h:70000: expected"),
        ("mqtt://spark@", "--sink mqtt://spark@: expected"),
        ("mqtt://h:1883/topic", "--sink mqtt://h:1883/topic: expected"),
        ("mqtt://h:1883?x=1", "--sink mqtt://h:1883?x=1: expected"),
        ("mqtt://@h", "--sink mqtt://@h: an empty user (leave out the @ for none)"),
        ("mqtt:localhost", "--sink mqtt:localhost: expected"),
        ("mqtt:h:port", "--sink mqtt:h:port: expected"),
    ],
)
def test_a_bad_sink_is_one_line_naming_it(sink, message):
    with pytest.raises(SinkError) as caught:
        mqtt_target(sink, "topic_traffic", environ=NO_ENV)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_a_password_in_the_url_is_refused_and_not_repeated():
    with pytest.raises(SinkError) as caught:
        mqtt_target("mqtts://spark:s3cr3t@broker:8883", "topic_traffic", environ=NO_ENV)
    message = str(caught.value)
    assert message.startswith("--sink mqtts://spark:***@broker:8883: a password does not go")
    assert "--sink-password-file" in message and f"${PASSWORD_ENV}" in message
    assert "s3cr3t" not in message


def test_the_password_comes_from_the_file_then_the_environment(tmp_path):
    secret = tmp_path / "spark.jwt"
    secret.write_text("eyJ.token.sig\n")
    env = {PASSWORD_ENV: "from-env"}
    sink = "mqtt://spark@h"
    with_file = MqttOptions(password_file=str(secret))
    assert mqtt_target(sink, "t", with_file, environ=env).password == "eyJ.token.sig"
    assert mqtt_target(sink, "t", environ=env).password == "from-env"
    assert mqtt_target(sink, "t", environ=NO_ENV).password is None
    # No user, no password: the environment's is for a sink that names one.
    assert mqtt_target("mqtt://h", "t", environ=env).password is None
    target = mqtt_target(sink, "t", with_file, environ=env)
    assert "eyJ.token.sig" not in repr(target)


@pytest.mark.parametrize(
    ("content", "sink", "message"),
    [
        (None, "mqtt://spark@h", "--sink-password-file {path}: No such file or directory"),
        ("\n", "mqtt://spark@h", "--sink-password-file {path}: the file is empty"),
        (b"\xff\xfe", "mqtt://spark@h", "--sink-password-file {path}: 'utf-8' codec"),
        ("x", "mqtt://h", "--sink-password-file {path}: the sink names no user"),
    ],
)
def test_a_password_file_that_cannot_be_used(tmp_path, content, sink, message):
    path = tmp_path / "password"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(SinkError) as caught:
        mqtt_target(sink, "t", MqttOptions(password_file=str(path)), environ=NO_ENV)
    assert str(caught.value).startswith(message.format(path=path))


def test_the_client_id_is_the_same_for_a_query_and_another_for_another(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    here = client_id("topic_traffic", "checkpoint")
    assert here.startswith("nautilus-spark-topic_traffic-") and len(here) == 37
    assert client_id("topic_traffic", str(tmp_path / "checkpoint")) == here  # absolute
    assert client_id("topic_traffic", "other") != here
    assert client_id("client_activity", "checkpoint") != client_id("topic_traffic", "other")
    hdfs = client_id("t", "hdfs:///checkpoints/t")  # a URI is taken as it is
    assert hdfs == client_id("t", "hdfs:///checkpoints/t") != client_id("t", "/checkpoints/t")
    # Without a checkpoint: one of its own.
    assert client_id("t", None) != client_id("t", None)
    assert client_id("t", "c", "nautilus-spark-mine") == "nautilus-spark-mine"
    target = mqtt_target("mqtt://h", "topic_traffic", checkpoint="checkpoint", environ=NO_ENV)
    assert target.client_id == here


def test_a_client_id_must_keep_the_prefix_the_jobs_leave_out():
    with pytest.raises(SinkError) as caught:
        mqtt_target("mqtt://h", "t", MqttOptions(client_id="dashboard"), environ=NO_ENV)
    assert str(caught.value).startswith("--sink-client-id dashboard: must start with nautilus")


@pytest.fixture(scope="module")
def ca_files(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A CA's certificate, and a client certificate it issued with its key."""
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    leaf = ca.issue_cert("spark.clients.test")
    leaf.cert_chain_pems[0].write_to_path(str(directory / "spark.crt"))
    leaf.private_key_pem.write_to_path(str(directory / "spark.key"))
    return directory / "ca.pem", directory / "spark.crt", directory / "spark.key"


def test_tls_checks_the_brokers_certificate_and_name(ca_files):
    cafile, certfile, keyfile = (str(path) for path in ca_files)
    options = MqttOptions(cafile=cafile, certfile=certfile, keyfile=keyfile)
    context = mqtt_target("mqtts://spark@h", "t", options, environ=NO_ENV).tls
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert mqtt_target("mqtts://h", "t", environ=NO_ENV).tls is not None  # the system's CAs


@pytest.mark.parametrize(
    ("sink", "files", "message"),
    [
        ("mqtt://h", {"cafile": "{ca}"}, "--sink-cafile: only for an mqtts:// sink (TLS)"),
        ("mqtt://h", {"certfile": "{crt}"}, "--sink-certfile: only for an mqtts:// sink (TLS)"),
        ("mqtts://h", {"keyfile": "{key}"}, "--sink-keyfile: only with --sink-certfile"),
        ("mqtts://h", {"cafile": "nowhere"}, "--sink-cafile nowhere: No such file or directory"),
        ("mqtts://h", {"cafile": "{key}"}, "--sink-cafile {key}: no certificate or crl found"),
        ("mqtts://h", {"certfile": "{ca}"}, "--sink-certfile {ca}: " + NOT_A_PAIR),
        (
            "mqtts://h",
            {"certfile": "{crt}", "keyfile": "{ca}"},
            "--sink-certfile {crt} --sink-keyfile {ca}: " + NOT_A_PAIR,
        ),
    ],
)
def test_tls_files_that_cannot_be_used(ca_files, sink, files, message):
    paths = dict(zip(("ca", "crt", "key"), ca_files, strict=True))
    options = MqttOptions(**{option: name.format(**paths) for option, name in files.items()})
    with pytest.raises(SinkError) as caught:
        mqtt_target(sink, "t", options, environ=NO_ENV)
    assert str(caught.value) == message.format(**paths)


def test_the_timeout_must_be_positive():
    with pytest.raises(SinkError, match=r"^--sink-timeout 0: must be more than 0 seconds$"):
        mqtt_target("mqtt://h", "t", MqttOptions(timeout=0), environ=NO_ENV)


def test_the_commands_sink_options():
    args = parse_args(
        [
            *("topic-traffic", "--checkpoint", "ck", "--sink", "mqtts://spark@h"),
            *("--sink-password-file", "pw", "--sink-cafile", "ca.pem"),
            *("--sink-certfile", "c.crt", "--sink-keyfile", "c.key"),
            *("--sink-client-id", "nautilus-spark-x", "--sink-timeout", "7.5"),
        ]
    )
    expected = MqttOptions("pw", "ca.pem", "c.crt", "c.key", "nautilus-spark-x", 7.5)
    assert mqtt_options(args) == expected
    defaults = mqtt_options(parse_args(["topic-traffic", "--checkpoint", "ck"]))
    assert defaults == MqttOptions()


# What a StreamingQueryException's text holds when the sink's foreachBatch failed (cut).
FAILED_QUERY = """\
[STREAM_FAILED] Query [id = 7165a286, runId = fe8f053e] terminated with exception: \
[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in \
foreach batch sink. Reason: An exception was raised by the Python Proxy. Return Message: \
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/pyspark/sql/utils.py", line 163, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
  File "/src/spark_consumers/mqtt_sink.py", line 231, in deliver
    raise _failed(target, refusal)
spark_consumers.errors.QueryFailed: MQTT sink mqtt://spark@127.0.0.1:1883: publish to \
$analytics/x refused: Not authorized (0x87)
 SQLSTATE: 39000 SQLSTATE: XXKST
=== Streaming Query ===
"""


def test_a_failed_querys_one_line():
    assert one_line(FAILED_QUERY, ONE_LINE) == (
        "MQTT sink mqtt://spark@127.0.0.1:1883: publish to $analytics/x refused: "
        "Not authorized (0x87)"
    )
    relay = "event_relay.client.RelayError: relay h:1: unreachable: refused"
    assert one_line(f"Traceback:\n{relay}\n", ONE_LINE) == "relay h:1: unreachable: refused"
    other = FAILED_QUERY.replace("spark_consumers.errors.QueryFailed", "ValueError")
    assert one_line(other, ONE_LINE) is None
