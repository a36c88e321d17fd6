"""The ACL plugin in a real broker, with real clients (paho-mqtt and raw sockets)."""

from __future__ import annotations

import json
import logging

import pytest

from broker.config import ConfigError
from tests.broker.helpers import (
    PUBACK,
    V5,
    V311,
    VERSIONS,
    publish_packet,
    unique_id,
)

from .helpers import eventually, write_acl

NOT_AUTHORIZED = 0x87
FAILURE_V3 = 0x80
QUOTA_EXCEEDED = 0x97

RULES = """\
# everyone
topic read public/#
topic write public/+
topic read sentinel
topic write sentinel
topic read $share/+/jobs/#
user alice
topic alice/#
pattern write clients/%c/#
pattern read clients/%c/#
token read example/%(c, :, 3)
"""


@pytest.fixture
def acl_file(tmp_path):
    return write_acl(tmp_path / "nautilus.acl", RULES)


@pytest.fixture
def server(start_broker, acl_file):
    return start_broker(
        plugins={"acl": {"enabled": True, "acl_file": str(acl_file), "acl_reload_interval": 1}}
    )


def refused_code(version: int) -> int:
    return NOT_AUTHORIZED if version == V5 else FAILURE_V3


# -- allowed and refused -----------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_allowed_topics_pass(server, paho_client, version):
    sub = paho_client(server, version)
    assert sub.subscribe("public/#", 1) == [1]
    pub = paho_client(server, version)
    pub.publish("public/news", b"hello", qos=1)
    msg = sub.expect_message()
    assert (msg.topic, msg.payload) == ("public/news", b"hello")


@pytest.mark.parametrize("version", VERSIONS)
def test_subscribing_to_a_forbidden_filter_is_refused(server, paho_client, version):
    sub = paho_client(server, version)
    assert sub.subscribe("secret/#", 1) == [refused_code(version)]
    assert sub.subscribe("public/+/deeper", 0) == [0]  # `public/#` allows deeper levels


@pytest.mark.parametrize("version", VERSIONS)
def test_a_subscribe_is_decided_topic_by_topic(server, paho_client, version):
    sub = paho_client(server, version)
    codes = sub.subscribe([("secret", 1), ("public/a", 1), ("clients/other/x", 2), ("sentinel", 0)])
    assert codes == [refused_code(version), 1, refused_code(version), 0]
    pub = paho_client(server, version)
    pub.publish("public/a", b"granted", qos=1)
    assert sub.expect_message().payload == b"granted"


@pytest.mark.parametrize("version", VERSIONS)
def test_shared_subscriptions_are_checked_as_sent(server, paho_client, version):
    # As VerneMQ's vmq_acl: the rule must name the $share/<group>/ form; `public/#` alone
    # does not allow `$share/g/public/#`.
    client = paho_client(server, version)
    assert client.subscribe("$share/g/jobs/#", 1) == [1]
    assert client.subscribe("$share/g/public/#", 1) == [refused_code(version)]


def test_v5_publish_to_a_forbidden_topic_gets_puback_0x87(server, raw_client, paho_client):
    sub = paho_client(server, V5)
    assert sub.subscribe([("public/#", 1), ("sentinel", 1)]) == [1, 1]
    pub = raw_client(server, V5)
    pub.connect(unique_id())
    pub.send(publish_packet("secret/x", b"no", qos=1, packet_id=7, version=V5))
    ack = pub.expect(PUBACK)
    assert (ack.packet_id, ack.reason_code) == (7, NOT_AUTHORIZED)
    pub.send(publish_packet("public/x/y", b"no", qos=1, packet_id=8, version=V5))  # read-only
    assert pub.expect(PUBACK).reason_code == NOT_AUTHORIZED
    pub.publish("sentinel", b"end", qos=1)
    assert [m.payload for m in sub.collect_until(b"end")] == [b"end"]
    assert pub.is_open()


def test_v311_publish_to_a_forbidden_topic_disconnects(server, raw_client, paho_client):
    sub = paho_client(server, V311)
    assert sub.subscribe("public/#", 1) == [1]
    pub = raw_client(server, V311)
    pub.connect(unique_id())
    pub.publish("public/ok", b"fine", qos=1)
    pub.send(publish_packet("secret/x", b"no", qos=1, packet_id=9))
    assert pub.expect_closed() == []  # no PUBACK: MQTT 3.1.1 has no refusal code
    assert sub.expect_message().payload == b"fine"


def test_user_rules_apply_to_that_user_only(server, raw_client):
    alice = raw_client(server, V5)
    alice.connect(unique_id(), username="alice")
    assert alice.subscribe(("alice/inbox", 1), ("public/x", 0)) == [1, 0]
    alice.publish("alice/outbox", b"mine", qos=1)
    bob = raw_client(server, V5)
    bob.connect(unique_id(), username="bob")
    assert bob.subscribe(("alice/inbox", 1)) == [NOT_AUTHORIZED]


@pytest.mark.parametrize("version", VERSIONS)
def test_patterns_substitute_the_client_id(server, paho_client, version):
    client = paho_client(server, version, client_id="dev-1")
    assert client.subscribe([("clients/dev-1/#", 1), ("clients/dev-2/#", 1)]) == [
        1,
        refused_code(version),
    ]
    client.publish("clients/dev-1/state", b"on", qos=1)
    assert client.expect_message().payload == b"on"


@pytest.mark.parametrize("version", VERSIONS)
def test_tokens_take_a_piece_of_the_client_id(server, paho_client, version):
    client = paho_client(server, version, client_id="device:owner:profile")
    codes = client.subscribe([("example/profile", 0), ("example/owner", 0)])
    assert codes == [0, refused_code(version)]


def test_claims_from_the_token(start_broker, tmp_path, raw_client):
    path = write_acl(tmp_path / "acl", "token read tenants/%(claim, tenant)/#\n")
    server = start_broker(
        broker={"allow_anonymous": False},
        plugins={
            "claims": {"enabled": True, "module": "tests.plugins.acl.helpers:ClaimsFromPassword"},
            "acl": {"enabled": True, "acl_file": str(path)},
        },
    )
    client = raw_client(server, V5)
    client.connect(unique_id(), username="u", password=json.dumps({"tenant": "acme"}).encode())
    assert client.subscribe(("tenants/acme/#", 1), ("tenants/other/#", 1)) == [1, NOT_AUTHORIZED]
    no_claim = raw_client(server, V5)
    no_claim.connect(unique_id(), username="u", password=b"{}")
    assert no_claim.subscribe(("tenants/acme/#", 1)) == [NOT_AUTHORIZED]


# -- reloading ---------------------------------------------------------------------------


def test_an_edited_file_applies_without_a_restart(server, acl_file, paho_client):
    client = paho_client(server, V5)
    assert client.subscribe("fresh/x", 0) == [NOT_AUTHORIZED]
    write_acl(acl_file, "topic read fresh/#\n")
    eventually(lambda: client.subscribe("fresh/x", 0) == [0])
    assert client.subscribe("public/x", 0) == [NOT_AUTHORIZED]  # the old rules are gone


def test_a_bad_edit_keeps_the_old_rules(server, acl_file, paho_client, caplog):
    client = paho_client(server, V5)
    caplog.set_level(logging.ERROR, logger="nautilus.plugins.acl")
    write_acl(acl_file, "topic read fresh/#\ntopic read a/#/b\n")
    expected = f"acl file {acl_file} line 2: invalid topic filter 'a/#/b'"
    eventually(lambda: any(expected in r.getMessage() for r in caplog.records))
    assert client.subscribe([("public/x", 0), ("fresh/x", 0)]) == [0, NOT_AUTHORIZED]
    write_acl(acl_file, "topic read fresh/#\n")  # fixed: now it applies
    eventually(lambda: client.subscribe("fresh/x", 0) == [0])


def test_a_bad_file_at_start_up_is_a_config_error(start_broker, tmp_path):
    path = write_acl(tmp_path / "acl", "topic a\nuser\n")
    with pytest.raises(ConfigError, match=rf"^plugins\.acl\.acl_file: {path} line 2: "):
        start_broker(plugins={"acl": {"enabled": True, "acl_file": str(path)}})


# -- rate limits -------------------------------------------------------------------------


def test_a_labels_publish_rate_is_limited(start_broker, tmp_path, raw_client):
    path = write_acl(tmp_path / "acl", "topic metered/+ label metered\ntopic free/+\n")
    server = start_broker(
        plugins={
            "acl": {
                "enabled": True,
                "acl_file": str(path),
                "publish_rate_limits": {"metered": 5},
            }
        }
    )
    pub = raw_client(server, V5)
    pub.connect(unique_id())
    # Ten in one write: they arrive within the same second.
    burst = b"".join(
        publish_packet(f"metered/{i}", b"x", qos=1, packet_id=i, version=V5) for i in range(1, 11)
    )
    pub.send(burst)
    codes = [pub.expect(PUBACK).reason_code for _ in range(10)]
    assert codes == [0] * 5 + [QUOTA_EXCEEDED] * 5
    pub.publish("free/x", b"x", qos=1)  # other rules are not limited

    def accepted_again() -> bool:
        pub.send(publish_packet("metered/1", b"x", qos=1, packet_id=99, version=V5))
        return pub.expect(PUBACK).reason_code == 0

    eventually(accepted_again)  # the next second counts from zero
