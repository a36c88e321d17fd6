"""TLS listeners (`type = "ssl"`): real handshakes with certificates made by trustme.

Every certificate is issued in the test by a throwaway trustme CA and written to
tmp_path; the broker loads the files as it would in production. The clients are real:
paho-mqtt (MQTT 3.1.1 and 5) with `tls_set`, and plain `ssl` sockets where the test must
see the handshake itself (the certificate the server shows, the protocol version, an
alert). Refusals are awaited as events: a failed handshake, or the server's close (or
alert) after a TLS 1.3 handshake that the client saw complete, never a sleep.

The SIGHUP test runs the real command (`python -m broker --config FILE`) and waits on
its log lines ("TLS certificates reloaded", "TLS reload failed").
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import signal
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from paho.mqtt.enums import CallbackAPIVersion

from broker.config import ConfigError, config_from_dict
from broker.server import Broker
from plugins.passwd.hashes import make_hash
from tests.broker.helpers import (
    PAHO_PROTOCOL,
    TIMEOUT,
    V5,
    V311,
    VERSIONS,
    ConnResult,
    PahoClient,
    connect_packet,
    unique_id,
)
from tests.plugins.webhooks.conftest import HookServer
from tests.test_cli import BrokerProcess, nautilus

HOST = "127.0.0.1"
CONNACK_OK = b"\x20\x02\x00\x00"  # MQTT 3.1.1 CONNACK: no session, accepted
REFUSED_SUB = {V311: 0x80, V5: 0x87}  # SUBACK: failure (3.1.1) / not authorized (5)
NOT_AUTHORIZED, BAD_CREDENTIALS = 0x87, 0x86  # paho maps MQTT 3 CONNACK codes 5 and 4 here
RELOADED = re.compile(r"listeners\[0\]: TLS certificates reloaded")
RELOAD_FAILED = re.compile(r"TLS reload failed, keeping the previous certificates: (.*)")


# --------------------------------------------------------------------------- certificates


@dataclass
class Cert:
    """A leaf certificate and its key, as files; `der` is the certificate's DER."""

    certfile: str
    keyfile: str
    der: bytes


def issue(ca: trustme.CA, directory: Path, name: str, *identities: str, cn: str | None) -> Cert:
    leaf = ca.issue_cert(*identities, common_name=cn)
    certfile, keyfile = directory / f"{name}.crt", directory / f"{name}.key"
    leaf.cert_chain_pems[0].write_to_path(str(certfile))
    leaf.private_key_pem.write_to_path(str(keyfile))
    der = ssl.PEM_cert_to_DER_cert(certfile.read_text())
    return Cert(str(certfile), str(keyfile), der)


@dataclass
class Pki:
    cafile: str  # the CA that signed `server` and `device`
    server: Cert  # for 127.0.0.1 and localhost
    device: Cert  # a client certificate, CN device-7
    stranger: Cert  # a client certificate with the same CN from another CA
    other_cafile: str  # that other CA
    ca: trustme.CA  # to issue more


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    other.cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))
    return Pki(
        cafile=str(tmp_path / "ca.pem"),
        server=issue(ca, tmp_path, "server", HOST, "localhost", cn="nautilus"),
        device=issue(ca, tmp_path, "device", "device-7.clients.test", cn="device-7"),
        stranger=issue(other, tmp_path, "stranger", "device-7.clients.test", cn="device-7"),
        other_cafile=str(tmp_path / "other-ca.pem"),
        ca=ca,
    )


def ssl_listener(pki: Pki, **keys: Any) -> dict[str, Any]:
    return {
        "type": "ssl",
        "address": f"{HOST}:0",
        "certfile": pki.server.certfile,
        "keyfile": pki.server.keyfile,
        **keys,
    }


# --------------------------------------------------------------------------- clients


class TlsPahoClient(PahoClient):
    """The helpers' PahoClient over TLS: the server's certificate is verified against
    `cafile` (hostname included: 127.0.0.1 is in its SAN), and `cert`, if given, is the
    client's certificate."""

    def __init__(self, port: int, version: int, *, cafile: str, cert: Cert | None = None) -> None:
        super().__init__(HOST, port, version)
        self.cafile, self.cert = cafile, cert

    def connect(  # type: ignore[override]
        self,
        *,
        username: str | None = None,
        password: str | None = None,
        expect_code: int | None = 0,
    ) -> ConnResult:
        v5 = self.version == V5
        c = self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            clean_session=None if v5 else True,
            protocol=PAHO_PROTOCOL[self.version],
            reconnect_on_failure=False,
        )
        c.on_connect, c.on_message, c.on_disconnect = (
            self._on_connect,
            self._on_message,
            self._on_disconnect,
        )
        c.on_subscribe = c.on_unsubscribe = self._on_ack
        c.tls_set(
            ca_certs=self.cafile,
            certfile=self.cert.certfile if self.cert else None,
            keyfile=self.cert.keyfile if self.cert else None,
        )
        if username is not None or password is not None:
            c.username_pw_set(username, password)
        c.connect(self.host, self.port, 60)
        c.loop_start()
        result = self._connacks.get(timeout=TIMEOUT)
        if expect_code is not None:
            assert result.reason_code == expect_code, result
        return result


@pytest.fixture
def tls_paho() -> Iterator[Callable[..., TlsPahoClient]]:
    """tls_paho(port, version, cafile=..., cert=None, connect=True, **connect kwargs)."""
    made: list[TlsPahoClient] = []

    def make(
        port: int,
        version: int = V311,
        *,
        cafile: str,
        cert: Cert | None = None,
        connect: bool = True,
        **kw: Any,
    ) -> TlsPahoClient:
        client = TlsPahoClient(port, version, cafile=cafile, cert=cert)
        made.append(client)
        if connect:
            client.connect(**kw)
        return client

    yield make
    for client in made:
        client.close()


def tls_socket(
    port: int,
    *,
    cafile: str | None = None,
    cert: Cert | None = None,
    maximum: ssl.TLSVersion | None = None,
    ciphers: str | None = None,
    server_hostname: str | None = HOST,
) -> ssl.SSLSocket:
    """A TLS connection, handshake done (raises what the handshake raised). Without
    `cafile` the server's certificate is not verified (to look at it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cafile is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.load_verify_locations(cafile)
    if cert is not None:
        context.load_cert_chain(cert.certfile, cert.keyfile)
    if maximum is not None:
        context.maximum_version = maximum
    if ciphers is not None:
        context.set_ciphers(ciphers)
    sock = socket.create_connection((HOST, port), timeout=TIMEOUT)
    try:
        return context.wrap_socket(sock, server_hostname=server_hostname)
    except BaseException:
        sock.close()
        raise


def mqtt_connect(sock: ssl.SSLSocket) -> bytes:
    """Send an MQTT 3.1.1 CONNECT and return the CONNACK's bytes."""
    sock.sendall(connect_packet(unique_id("raw")))
    got = b""
    while len(got) < len(CONNACK_OK):
        chunk = sock.recv(4 - len(got))
        assert chunk, f"the broker closed the connection (after {got!r})"
        got += chunk
    return got


def refused_without_connack(port: int, **kw: Any) -> str:
    """Connect over TLS and send CONNECT; assert that the connection ends (failed
    handshake, alert or close, each awaited) before any byte of MQTT comes back.
    Returns where it ended: "handshake" or "after handshake"."""
    try:
        sock = tls_socket(port, **kw)
    except (ssl.SSLError, ConnectionError):
        return "handshake"
    with sock:
        try:
            sock.sendall(connect_packet(unique_id("refused")))
            data = sock.recv(1024)  # blocks until the alert or the close (TIMEOUT: fails)
        except (ssl.SSLError, ConnectionError):
            return "after handshake"
        assert data == b"", f"got {data!r} from a connection that should be refused"
        return "after handshake"


def peer_der(port: int, server_hostname: str | None = None) -> bytes:
    """The certificate (DER) a new TLS connection is shown, unverified."""
    with tls_socket(port, server_hostname=server_hostname) as sock:
        der = sock.getpeercert(binary_form=True)
    assert der is not None
    return der


def round_trip(client: PahoClient, topic: str, payload: bytes) -> None:
    """Publish at QoS 1 to a topic the client is subscribed to and get it back."""
    client.publish(topic, payload, qos=1)
    msg = client.expect_message()
    assert (msg.topic, msg.payload, msg.qos) == (topic, payload, 1)


# --------------------------------------------------------------------------- 1. basics


@pytest.mark.parametrize("version", VERSIONS)
def test_round_trip_over_tls_with_verified_server_certificate(start_broker, tls_paho, pki, version):
    server = start_broker(listeners=[ssl_listener(pki)])
    client = tls_paho(server.port, version, cafile=pki.cafile)
    assert client.subscribe("tls/#", 1) == [1]
    round_trip(client, "tls/hello", b"over TLS")
    # No client certificate asked for (no cafile): none reaches the broker.
    assert server.call(lambda: [c.client.certificate for c in server.broker.connections]) == [None]


def test_the_server_shows_its_configured_certificate(start_broker, pki):
    server = start_broker(listeners=[ssl_listener(pki)])
    assert peer_der(server.port) == pki.server.der
    assert peer_der(server.port, "localhost") == pki.server.der  # with SNI as well
    # A client that trusts another CA refuses the broker's certificate.
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_socket(server.port, cafile=pki.other_cafile).close()


def test_plain_mqtt_on_a_tls_listener_gets_no_connack(start_broker, pki):
    server = start_broker(listeners=[ssl_listener(pki)])
    with socket.create_connection((HOST, server.port), timeout=TIMEOUT) as sock:
        sock.sendall(connect_packet(unique_id("plain")))
        data = b""
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(1024):
                data += chunk
    assert not data.startswith(b"\x20"), data  # the close came, and never a CONNACK


# --------------------------------------------------------------------------- 2. client certs


CLIENT_TLS = [
    pytest.param(ssl.TLSVersion.TLSv1_2, id="tls1.2"),
    pytest.param(ssl.TLSVersion.TLSv1_3, id="tls1.3"),
]


@pytest.mark.parametrize("maximum", CLIENT_TLS)
def test_require_certificate_refuses_a_client_without_one(start_broker, pki, maximum):
    listener = ssl_listener(pki, cafile=pki.cafile, require_certificate=True)
    server = start_broker(listeners=[listener])
    ended = refused_without_connack(server.port, cafile=pki.cafile, maximum=maximum)
    if maximum == ssl.TLSVersion.TLSv1_2:
        assert ended == "handshake"  # TLS 1.2: the server's verdict is part of it
    assert server.call(lambda: len(server.broker.connections)) == 0


@pytest.mark.parametrize("maximum", CLIENT_TLS)
def test_require_certificate_refuses_a_certificate_from_another_ca(start_broker, pki, maximum):
    listener = ssl_listener(pki, cafile=pki.cafile, require_certificate=True)
    server = start_broker(listeners=[listener])
    refused_without_connack(server.port, cafile=pki.cafile, cert=pki.stranger, maximum=maximum)
    assert server.call(lambda: len(server.broker.connections)) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_require_certificate_admits_a_certificate_from_its_ca(start_broker, tls_paho, pki, version):
    listener = ssl_listener(pki, cafile=pki.cafile, require_certificate=True)
    server = start_broker(listeners=[listener])
    client = tls_paho(server.port, version, cafile=pki.cafile, cert=pki.device)
    assert client.subscribe("certs/#", 1) == [1]
    round_trip(client, "certs/ok", b"with a certificate")
    certs = server.call(lambda: [c.client.certificate for c in server.broker.connections])
    assert certs == [pki.device.der]


def test_optional_certificate_when_a_cafile_is_set(start_broker, pki):
    """cafile without require_certificate: a certificate is optional, but checked."""
    server = start_broker(listeners=[ssl_listener(pki, cafile=pki.cafile)])
    for cert in (None, pki.device):
        with tls_socket(server.port, cafile=pki.cafile, cert=cert) as sock:
            assert mqtt_connect(sock) == CONNACK_OK
    refused_without_connack(server.port, cafile=pki.cafile, cert=pki.stranger)


# --------------------------------------------------------------------------- 3. identity


ACL = """\
user device-7
topic devices/device-7/#
user alice
topic alice/#
"""


@pytest.fixture
def identity_broker(start_broker, pki, tmp_path):
    """Listener 0: use_identity_as_username; listener 1: require_certificate only. No
    anonymous access; passwd (alice only) and ACL plugins."""
    passwd = tmp_path / "passwd"
    passwd.write_text(f"alice:{make_hash(b'alice-pw')}\n")
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    certs = {"cafile": pki.cafile, "require_certificate": True}
    return start_broker(
        broker={"allow_anonymous": False},
        listeners=[
            ssl_listener(pki, use_identity_as_username=True, **certs),
            ssl_listener(pki, **certs),
        ],
        plugins={
            "passwd": {"enabled": True, "password_file": str(passwd)},
            "acl": {"enabled": True, "acl_file": str(acl)},
        },
    )


CREDENTIALS = [
    pytest.param({}, id="no-username"),
    pytest.param({"username": "mallory", "password": "wrong"}, id="other-username"),
]


@pytest.mark.parametrize("credentials", CREDENTIALS)
@pytest.mark.parametrize("version", VERSIONS)
def test_identity_as_username_needs_no_password(
    identity_broker, tls_paho, pki, version, credentials
):
    server = identity_broker
    client = tls_paho(server.port, version, cafile=pki.cafile, cert=pki.device, **credentials)
    codes = client.subscribe([("devices/device-7/#", 1), ("devices/other/#", 1)])
    assert codes == [1, REFUSED_SUB[version]]
    round_trip(client, "devices/device-7/status", b"up")  # the ACL allows writing it too
    usernames = server.call(lambda: [c.client.username for c in server.broker.connections])
    assert usernames == ["device-7"]


@pytest.mark.parametrize("version", VERSIONS)
def test_certificate_without_identity_still_needs_a_password(
    identity_broker, tls_paho, pki, version
):
    port = identity_broker.broker.listening[1][1]

    def code(**credentials: Any) -> int:
        client = tls_paho(port, version, cafile=pki.cafile, cert=pki.device, connect=False)
        result = client.connect(expect_code=None, **credentials)
        client.close()
        return result.reason_code

    assert code() == NOT_AUTHORIZED  # nobody vouches for an anonymous client
    assert code(username="device-7") == NOT_AUTHORIZED  # the CN is not a credential here
    assert code(username="alice", password="wrong") == BAD_CREDENTIALS
    alice = tls_paho(
        port, version, cafile=pki.cafile, cert=pki.device, username="alice", password="alice-pw"
    )
    # The username is alice's, not the certificate's CN.
    assert alice.subscribe([("alice/#", 1), ("devices/device-7/#", 1)]) == [
        1,
        REFUSED_SUB[version],
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_certificate_without_a_cn_is_refused_on_an_identity_listener(
    identity_broker, tls_paho, pki, tmp_path, version
):
    """As Mosquitto: no name to use, no login (a password does not replace it)."""
    nameless = issue(pki.ca, tmp_path, "nameless", "nameless.clients.test", cn=None)
    client = tls_paho(
        identity_broker.port, version, cafile=pki.cafile, cert=nameless, connect=False
    )
    result = client.connect(expect_code=None, username="alice", password="alice-pw")
    client.close()
    assert result.reason_code == NOT_AUTHORIZED


def test_a_client_that_never_starts_the_handshake_is_dropped_after_connect_timeout(
    start_broker, pki
):
    server = start_broker(broker={"connect_timeout": 1}, listeners=[ssl_listener(pki)])
    with socket.create_connection((HOST, server.port), timeout=TIMEOUT) as silent:
        assert silent.recv(1) == b""  # closed by the broker, long before asyncio's 60 s


# --------------------------------------------------------------------------- 4. webhooks


@pytest.fixture
def hook_server() -> Iterator[HookServer]:
    endpoint = HookServer()
    yield endpoint
    endpoint.close()


HOOKS = [
    pytest.param(V311, "auth_on_register", id="v311"),
    pytest.param(V5, "auth_on_register_m5", id="v5"),
]


@pytest.mark.parametrize(("version", "hook"), HOOKS)
def test_webhook_register_body_carries_listener_and_certificate(
    start_broker, hook_server, tls_paho, pki, version, hook
):
    url = hook_server.answer(f"/{hook}", {"result": "ok"})
    server = start_broker(
        broker={"allow_anonymous": False},
        listeners=[
            ssl_listener(pki, cafile=pki.cafile),  # a certificate is optional here
            {"type": "tcp", "address": f"{HOST}:0"},
        ],
        plugins={"webhooks": {"enabled": True, "endpoints": [{"hook": hook, "url": url}]}},
    )
    tcp_port = server.broker.listening[1][1]

    tls_paho(server.port, version, cafile=pki.cafile, cert=pki.device, username="dev")
    body = hook_server.expect(f"/{hook}").json
    assert body["client_cert"] == base64.b64encode(pki.device.der).decode()
    assert body["listener_type"] == "mqtts"
    assert body["listener_port"] == server.port
    assert body["listener_addr"] == HOST
    assert body["username"] == "dev"

    tls_paho(server.port, version, cafile=pki.cafile, username="dev")  # no certificate
    body = hook_server.expect(f"/{hook}").json
    assert (body["listener_type"], body["listener_port"]) == ("mqtts", server.port)
    assert "client_cert" not in body

    plain = PahoClient(HOST, tcp_port, version)
    try:
        plain.connect(username="dev")
        body = hook_server.expect(f"/{hook}").json
    finally:
        plain.close()
    assert body["listener_type"] == "mqtt"
    assert body["listener_port"] == tcp_port
    assert body["listener_addr"] == HOST
    assert "client_cert" not in body


# --------------------------------------------------------------------------- 5. SIGHUP


@pytest.fixture
def broker_process() -> Iterator[Callable[[Path, Path], BrokerProcess]]:
    started: list[BrokerProcess] = []

    def start(config: Path, cwd: Path) -> BrokerProcess:
        proc = BrokerProcess(config, cwd=cwd)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


def test_sighup_reloads_certificates_for_new_connections_only(
    broker_process, tls_paho, pki, tmp_path
):
    live = tmp_path / "live"
    live.mkdir()
    certfile, keyfile = live / "server.crt", live / "server.key"
    certfile.write_bytes(Path(pki.server.certfile).read_bytes())
    keyfile.write_bytes(Path(pki.server.keyfile).read_bytes())
    config = tmp_path / "nautilus.toml"
    config.write_text(
        f'[[listeners]]\ntype = "ssl"\naddress = "{HOST}:0"\n'
        f'certfile = "{certfile}"\nkeyfile = "{keyfile}"\n\n'
        '[store]\nbackend = "memory"\n',
        encoding="utf-8",
    )
    proc = broker_process(config, tmp_path)
    assert peer_der(proc.port) == pki.server.der

    old = tls_paho(proc.port, V5, cafile=pki.cafile)  # stays connected throughout
    assert old.subscribe("reload/#", 1) == [1]

    new_ca = trustme.CA()
    new_ca.cert_pem.write_to_path(str(tmp_path / "new-ca.pem"))
    renewed = issue(new_ca, tmp_path, "renewed", HOST, "localhost", cn="nautilus")
    certfile.write_bytes(Path(renewed.certfile).read_bytes())
    keyfile.write_bytes(Path(renewed.keyfile).read_bytes())
    proc.proc.send_signal(signal.SIGHUP)
    proc.wait_for(RELOADED)

    assert peer_der(proc.port) == renewed.der  # no SNI (an IP address)
    assert peer_der(proc.port, "localhost") == renewed.der  # with SNI
    fresh = tls_paho(proc.port, V311, cafile=str(tmp_path / "new-ca.pem"))
    assert fresh.subscribe("reload/#", 1) == [1]
    round_trip(old, "reload/old", b"still here")  # the old connection kept its session
    assert fresh.expect_message().payload == b"still here"
    with pytest.raises(ssl.SSLCertVerificationError):  # the old CA no longer fits
        tls_socket(proc.port, cafile=pki.cafile).close()

    certfile.write_text("not a certificate\n")
    proc.proc.send_signal(signal.SIGHUP)
    reason = proc.wait_for(RELOAD_FAILED)[1]
    assert reason.startswith(f"listeners[0].certfile: cannot load {certfile}"), reason
    assert peer_der(proc.port) == renewed.der  # the previous certificates stay
    round_trip(old, "reload/older", b"still connected")
    assert fresh.expect_message().payload == b"still connected"
    assert proc.proc.poll() is None
    assert proc.stop() == 0


# --------------------------------------------------------------------------- 6. config errors


def settings_error(*listeners: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as raised:
        config_from_dict({"listeners": list(listeners), "store": {"backend": "memory"}})
    return str(raised.value)


def test_validation_errors_name_the_key(pki):
    ssl_only: dict[str, Any] = {"type": "ssl", "address": f"{HOST}:0"}
    cert = {"certfile": pki.server.certfile}
    files = {**cert, "keyfile": pki.server.keyfile}
    assert settings_error(ssl_only) == 'listeners[0].certfile: a listener of type "ssl" needs one'
    assert settings_error({**ssl_only, **cert}) == (
        'listeners[0].keyfile: a listener of type "ssl" needs one'
    )
    assert settings_error({**ssl_only, **files, "require_certificate": True}).startswith(
        "listeners[0].cafile: require_certificate needs the CA"
    )
    assert settings_error(
        {**ssl_only, **files, "cafile": pki.cafile, "use_identity_as_username": True}
    ).startswith("listeners[0].use_identity_as_username: needs require_certificate = true")
    tcp = {"type": "tcp", "address": f"{HOST}:0"}
    need = 'TLS settings need type = "ssl" or "wss"'
    assert settings_error({**tcp, **files}) == f"listeners[0].certfile: {need}"
    # Every TLS key, not only the certificate's, is refused on a plain listener.
    for key, value in [
        ("require_certificate", True),
        ("keyfile", files["keyfile"]),
        ("cafile", pki.cafile),
        ("keypasswd", "secret"),
        ("use_identity_as_username", True),
        ("tls_version", "tlsv1.3"),
        ("ciphers", "ECDHE+AESGCM"),
    ]:
        assert settings_error({**tcp, key: value}) == f"listeners[0].{key}: {need}"
    # The index is the listener's own.
    assert settings_error(tcp, ssl_only) == (
        'listeners[1].certfile: a listener of type "ssl" needs one'
    )
    assert settings_error({**ssl_only, **files, "tls_version": "tlsv1.1"}).startswith(
        "listeners[0].tls_version: 'tlsv1.1' is not one of"
    )


def broker_error(*listeners: dict[str, Any]) -> str:
    """The ConfigError that constructing a Broker raises (the files are loaded then)."""
    config = config_from_dict({"listeners": list(listeners), "store": {"backend": "memory"}})
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ConfigError) as raised:
            Broker(config, loop=loop)
    finally:
        loop.close()
    return str(raised.value)


def encrypted_key(pki: Pki, path: Path, password: bytes) -> str:
    key = serialization.load_pem_private_key(Path(pki.server.keyfile).read_bytes(), None)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password),
        )
    )
    return str(path)


def test_files_that_do_not_load_fail_at_broker_construction(pki, tmp_path):
    missing = str(tmp_path / "missing.pem")
    server = ssl_listener(pki)
    assert broker_error({**server, "certfile": missing}) == (
        f"listeners[0].certfile: cannot load {missing} with the key {pki.server.keyfile}: "
        "No such file or directory"
    )
    # A key that is not the certificate's.
    message = broker_error({**server, "keyfile": pki.device.keyfile})
    assert message.startswith(
        f"listeners[0].certfile: cannot load {pki.server.certfile} with the key "
        f"{pki.device.keyfile}: "
    ), message
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    assert broker_error({**server, "certfile": str(garbage)}).startswith(
        f"listeners[0].certfile: cannot load {garbage} with the key"
    )
    assert broker_error({**server, "cafile": missing}) == (
        f"listeners[0].cafile: cannot load {missing}: No such file or directory"
    )
    assert broker_error({**server, "cafile": str(garbage)}).startswith(
        f"listeners[0].cafile: cannot load {garbage}: "
    )
    assert broker_error({**server, "ciphers": "NO-SUCH-CIPHER"}) == (
        "listeners[0].ciphers: no cipher matches 'NO-SUCH-CIPHER'"
    )
    # The second listener's error names it.
    tcp = {"type": "tcp", "address": f"{HOST}:0"}
    assert broker_error(tcp, {**server, "certfile": missing}).startswith(
        f"listeners[1].certfile: cannot load {missing}"
    )
    # An encrypted key loads with its keypasswd, and not with a wrong one.
    locked = encrypted_key(pki, tmp_path / "locked.key", b"open sesame")
    assert broker_error({**server, "keyfile": locked, "keypasswd": "wrong"}).startswith(
        f"listeners[0].certfile: cannot load {pki.server.certfile} with the key {locked}: "
    )
    config = config_from_dict(
        {
            "listeners": [{**server, "keyfile": locked, "keypasswd": "open sesame"}],
            "store": {"backend": "memory"},
        }
    )
    loop = asyncio.new_event_loop()
    try:
        assert 0 in Broker(config, loop=loop).tls
    finally:
        loop.close()


def test_command_line_exits_2_on_a_certfile_that_will_not_load(pki, tmp_path):
    missing = tmp_path / "missing.pem"
    config = tmp_path / "nautilus.toml"
    config.write_text(
        f'[[listeners]]\ntype = "ssl"\naddress = "{HOST}:0"\n'
        f'certfile = "{missing}"\nkeyfile = "{pki.server.keyfile}"\n\n'
        '[store]\nbackend = "memory"\n',
        encoding="utf-8",
    )
    done = nautilus("--config", str(config), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"nautilus: listeners[0].certfile: cannot load {missing}"), lines
    assert done.stdout == ""


# --------------------------------------------------------------------------- 7. versions


def test_tls_version_13_refuses_a_tls_12_client(start_broker, pki):
    server = start_broker(listeners=[ssl_listener(pki, tls_version="tlsv1.3")])
    with pytest.raises((ssl.SSLError, ConnectionError)):
        tls_socket(server.port, cafile=pki.cafile, maximum=ssl.TLSVersion.TLSv1_2).close()
    with tls_socket(server.port, cafile=pki.cafile) as sock:
        assert sock.version() == "TLSv1.3"
        assert mqtt_connect(sock) == CONNACK_OK


def test_default_tls_version_accepts_tls_12(start_broker, pki):
    server = start_broker(listeners=[ssl_listener(pki)])
    with tls_socket(server.port, cafile=pki.cafile, maximum=ssl.TLSVersion.TLSv1_2) as sock:
        assert sock.version() == "TLSv1.2"
        assert mqtt_connect(sock) == CONNACK_OK


def test_ciphers_limit_tls_12(start_broker, pki):
    # trustme's keys are ECDSA: the listener allows one ECDSA suite only (TLS 1.2).
    wanted, other = "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256"
    server = start_broker(listeners=[ssl_listener(pki, ciphers=wanted)])
    tls12 = ssl.TLSVersion.TLSv1_2
    with pytest.raises((ssl.SSLError, ConnectionError)):
        tls_socket(server.port, cafile=pki.cafile, maximum=tls12, ciphers=other).close()
    with tls_socket(server.port, cafile=pki.cafile, maximum=tls12) as sock:
        cipher = sock.cipher()
        assert cipher is not None and cipher[0] == wanted
        assert mqtt_connect(sock) == CONNACK_OK
