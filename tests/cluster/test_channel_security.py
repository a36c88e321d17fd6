"""The cluster channel's security: `[cluster] secret` is proved by challenge-response and
never sent; with `tls_certfile`, `tls_keyfile` and `tls_cafile` the links run over
mutual TLS, each node's name checked against its certificate. A refusal is one line on
each side, naming the peer and why.

Real node processes (tests/cluster/nodes.py's ClusterNode, in test_failures.py's Cluster)
on the session's redis-server, linked as an operator's would be; between two of them a
TcpProxy (tests/cluster/proxy.py) reads the bytes that anyone on the network could.
Certificates are issued in the test by throwaway trustme CAs, as tests/broker/test_tls.py
does (its `issue`). One node in-process (start_in_process_node) where a test speaks the
handshake itself from a raw socket.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from broker.cluster import frames
from broker.cluster.frames import CHALLENGE, HELLO, PROOF, REFUSED, WELCOME, Hello
from broker.cluster.link import HANDSHAKE_TIMEOUT
from broker.config import ConfigError, config_from_dict
from broker.tls import certificate_names
from tests.broker.test_tls import Cert, issue
from tests.cluster.nodes import cluster_of, read_frames, start_in_process_node
from tests.cluster.test_failures import (
    HOST,
    TIMEOUT,
    Cluster,
    StartProxy,
    clusters,
    count_log,
    link_up,
    publish_all,
    wait_log,
    wait_routed,
)
from tests.test_check_config import check_config

__all__ = ["clusters"]  # a fixture, used by name

SECRET = "correct horse battery staple"
HELLO_B = Hello("b", "b-boot", frames.new_nonce())
NODE = r"127\.0\.0\.1:\d+"  # a node's address in a log line


@pytest.fixture
def cluster(clusters: Any, redis_url: str) -> Cluster:
    return clusters(redis_url)


def routes(cluster: Cluster, publisher_node: Any, subscriber_node: Any, topic: str) -> bytes:
    """A QoS 1 message published on one node reaches a subscriber on the other; its
    payload."""
    sub = cluster.subscriber(subscriber_node, f"{topic}-sub")
    sub.subscribe(f"{topic}/#", 1)
    pub = cluster.publisher(publisher_node)
    wait_routed(pub, [sub], f"{topic}/probe")
    publish_all(pub, f"{topic}/seq", [4242])
    sub.wait_seqs([4242])
    return b"4242"


def proxied(
    cluster: Cluster, start_proxy: StartProxy, a_keys: str, b_keys: str
) -> tuple[Any, Any, Any]:
    """b, then a reaching b through a proxy that records the link's bytes: (a, b, proxy)."""
    b = cluster.node("b", extra=b_keys).start()
    proxy = start_proxy((HOST, b.cluster_port))
    a = cluster.node("a", peer_addresses={"b": proxy.address}, extra=a_keys).start()
    cluster.wait_linked([a, b])
    wait_log(a, rf"cluster link to b \({HOST}:{proxy.port}\) up")
    return a, b, proxy


def no_traceback(*nodes: Any) -> None:
    for node in nodes:
        assert count_log(node, "Traceback") == 0, node.process.lines


# --------------------------------------------------------------------------- the secret


def test_the_secret_never_crosses_the_network(cluster: Cluster, start_proxy: StartProxy) -> None:
    keys = f'secret = "{SECRET}"'
    a, b, proxy = proxied(cluster, start_proxy, keys, keys)
    payload = routes(cluster, a, b, "wire")
    seen = proxy.recorded
    assert payload in seen and b"wire/seq" in seen  # the link, read in clear
    assert SECRET.encode() not in seen
    no_traceback(a, b)


def test_a_wrong_secret_is_refused_in_one_line_on_each_side(cluster: Cluster) -> None:
    a = cluster.node("a", extra='secret = "one"').start()
    b = cluster.node("b", extra='secret = "two"').start()
    wrong = r"wrong cluster secret \(its proof does not match\)$"
    # b's link to a: a refuses it, b reads why; and the same the other way round.
    for refusing, linking in ((a, b), (b, a)):
        wait_log(
            refusing, rf"cluster listener: refused a link from {linking.name} \({NODE}\): {wrong}"
        )
        wait_log(linking, rf"node {refusing.name} refused this node's link: {wrong}")
    assert count_log(a, link_up("b")) == count_log(b, link_up("a")) == 0
    no_traceback(a, b)


def test_a_proof_is_good_for_one_challenge_only(start_broker: Any, redis_url: str) -> None:
    """A PROOF read on the network and replayed on another connection is refused: each
    connection gets a fresh CHALLENGE."""
    node = start_in_process_node(start_broker, redis_url, secret=SECRET)
    address = cluster_of(node).address
    hello = Hello("b", "b-boot", frames.new_nonce())
    challenges = []
    for _ in range(2):
        with socket.create_connection(address, timeout=TIMEOUT) as sock:
            sock.sendall(frames.encode(HELLO, frames.PROTOCOL_VERSION, *hello))
            got, _ = read_frames(sock, TIMEOUT, bool)
            assert got[0][:2] == [CHALLENGE, "a"]
            challenges.append(got[0][2])
            if len(challenges) == 1:  # proved once, right
                proof = frames.connecting_proof(SECRET, hello, "a", got[0][2])
                sock.sendall(frames.encode(PROOF, proof))
                got, _ = read_frames(sock, TIMEOUT, bool)
                assert got[0][0] == WELCOME
            else:  # the same HELLO, the first proof replayed
                sock.sendall(frames.encode(PROOF, proof))
                got, closed = read_frames(sock, TIMEOUT)
                assert closed and got == [
                    [REFUSED, "wrong cluster secret (its proof does not match)"]
                ]
    assert challenges[0] != challenges[1]


def test_a_peer_that_never_proves_is_cut_at_the_handshake_timeout(
    start_broker: Any, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    node = start_in_process_node(start_broker, redis_url, secret=SECRET)
    with socket.create_connection(cluster_of(node).address, timeout=TIMEOUT) as sock:
        hello = Hello("b", "b-boot", frames.new_nonce())
        sock.sendall(frames.encode(HELLO, frames.PROTOCOL_VERSION, *hello))
        got, _ = read_frames(sock, TIMEOUT, bool)
        assert got[0][0] == CHALLENGE
        node.advance(HANDSHAKE_TIMEOUT)
        _, closed = read_frames(sock, TIMEOUT)
        me = "{}:{}".format(*sock.getsockname())
    assert closed
    refusal = f"refused a link from b ({me}): no PROOF in {HANDSHAKE_TIMEOUT:g}s"
    assert f"cluster listener: {refusal}" in caplog.messages


def test_the_accepting_node_proves_the_secret_too(start_broker: Any, redis_url: str) -> None:
    """WELCOME carries the node's own proof, over both nonces and its boot id: the
    connecting node checks it (link.py), so a stranger that answers for a node cannot
    pose as it without the secret."""
    node = start_in_process_node(start_broker, redis_url, secret=SECRET)
    cluster = cluster_of(node)
    with socket.create_connection(cluster.address, timeout=TIMEOUT) as sock:
        hello = Hello("b", "b-boot", frames.new_nonce())
        sock.sendall(frames.encode(HELLO, frames.PROTOCOL_VERSION, *hello))
        (challenge,), _ = read_frames(sock, TIMEOUT, bool)
        sock.sendall(
            frames.encode(PROOF, frames.connecting_proof(SECRET, hello, "a", challenge[2]))
        )
        got, _ = read_frames(sock, TIMEOUT, bool)
    _, name, boot_id, proof = got[0]
    assert (name, boot_id) == ("a", cluster.boot_id)
    assert proof == frames.accepting_proof(SECRET, hello, "a", boot_id, challenge[2])


# --------------------------------------------------------------------------- TLS


@dataclass
class Certificates:
    """The cluster's CA, and another one that signed nothing of the cluster's."""

    directory: Path
    ca: trustme.CA
    cafile: str
    other: trustme.CA

    def issue(self, node: str, cn: str | None = None, ca: trustme.CA | None = None) -> Cert:
        """A certificate for `node` (its CN, and the DNS name <node>.cluster.test)."""
        name = cn or node
        return issue(ca or self.ca, self.directory, node, f"{name}.cluster.test", cn=name)

    def keys(self, cert: Cert) -> str:
        """The [cluster] lines of a node with TLS on."""
        return (
            f'secret = "{SECRET}"\ntls_certfile = "{cert.certfile}"\n'
            f'tls_keyfile = "{cert.keyfile}"\ntls_cafile = "{self.cafile}"'
        )


@pytest.fixture
def certificates(tmp_path: Path) -> Certificates:
    ca = trustme.CA()
    cafile = tmp_path / "cluster-ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    return Certificates(tmp_path, ca, str(cafile), trustme.CA())


def test_a_tls_cluster_routes_messages_and_shows_nothing_in_clear(
    cluster: Cluster, start_proxy: StartProxy, certificates: Certificates
) -> None:
    a_keys = certificates.keys(certificates.issue("a"))
    b_keys = certificates.keys(certificates.issue("b"))
    a, b, proxy = proxied(cluster, start_proxy, a_keys, b_keys)
    payload = routes(cluster, a, b, "sealed")
    routes(cluster, b, a, "back")  # b's link to a (not proxied) works too
    seen = proxy.recorded
    assert len(seen) > 1000  # the link's handshake and traffic passed here
    for clear in (payload, b"sealed/seq", SECRET.encode(), b"b-boot"):
        assert clear not in seen, clear

    # SIGHUP loads the files again (as the MQTT listeners'); a file that fails keeps the
    # old ones, and the links go on.
    assert a.process is not None
    a.process.proc.send_signal(signal.SIGHUP)
    wait_log(a, r"cluster: TLS certificates reloaded")
    Path(certificates.directory / "a.crt").write_text("not a certificate")
    a.process.proc.send_signal(signal.SIGHUP)
    wait_log(
        a,
        r"TLS reload failed, keeping the previous certificates: cluster\.tls_certfile: "
        r"cannot load .*a\.crt",
    )
    routes(cluster, a, b, "after")
    no_traceback(a, b)


def test_a_tls_cluster_with_the_leaderless_metadata_joins_through_its_seed(
    cluster: Cluster, certificates: Certificates
) -> None:
    """b joins through a's address (its seed contact, over TLS too, learns a's name from
    the handshake and checks a's certificate for it), then routes as any cluster."""
    a = cluster.node("a", metadata="swc", extra=certificates.keys(certificates.issue("a"))).start()
    seed = (HOST, a.cluster_port)
    b = cluster.node(
        "b", metadata="swc", seeds=[seed], extra=certificates.keys(certificates.issue("b"))
    ).start()
    wait_log(b, rf"cluster: joining through seed {HOST}:{a.cluster_port} \(node a\)")
    cluster.wait_linked([a, b])
    routes(cluster, a, b, "joined")
    no_traceback(a, b)


TLS_FAILED = "TLS handshake failed"
UNTRUSTED = r"its certificate is not trusted \(unable to get local issuer certificate\)$"
NOT_TRUSTED_BY = r"it does not trust this node's certificate \(unknown CA\)$"
SHOWN_NAMES = r"the certificate shown names c, c\.cluster\.test, not b"
# b's certificate -> the lines each side logs about each link, (node, pattern) in turn.
REFUSED_CERTIFICATES = [
    pytest.param(
        # another CA's (b itself trusts the cluster's CA)
        lambda certificates: certificates.issue("b", ca=certificates.other),
        [
            # b's link to a: a finds b's certificate signed by a CA it does not know...
            ("a", rf"cluster listener: refused a link from {NODE}: {TLS_FAILED}: {UNTRUSTED}"),
            ("b", rf"cluster link to a \({NODE}\): {TLS_FAILED}: {NOT_TRUSTED_BY}"),
            # ... and so does a's link to b.
            ("a", rf"cluster link to b \({NODE}\): {TLS_FAILED}: {UNTRUSTED}"),
            ("b", rf"cluster listener: refused a link from {NODE}: {TLS_FAILED}: "),
        ],
        id="another-ca",
    ),
    pytest.param(
        # the cluster's CA's, for node c
        lambda certificates: certificates.issue("b", cn="c"),
        [
            # b says HELLO as b: a refuses it, b reads why.
            ("a", rf"cluster listener: refused a link from b \({NODE}\): {SHOWN_NAMES}$"),
            ("b", rf"node a refused this node's link: {SHOWN_NAMES}$"),
            # a's link to b: a finds the certificate is not b's, and tells b.
            ("a", rf"cluster link to b \({NODE}\): refused: {SHOWN_NAMES}; closing it$"),
            ("b", rf"cluster listener: the link from {NODE} refused this node: {SHOWN_NAMES}$"),
        ],
        id="another-node",
    ),
]


@pytest.mark.parametrize(("b_certificate", "refusals"), REFUSED_CERTIFICATES)
def test_a_certificate_from_another_ca_or_for_another_node_is_refused(
    cluster: Cluster,
    certificates: Certificates,
    b_certificate: Callable[[Certificates], Cert],
    refusals: list[tuple[str, str]],
) -> None:
    a = cluster.node("a", extra=certificates.keys(certificates.issue("a"))).start()
    b = cluster.node("b", extra=certificates.keys(b_certificate(certificates))).start()
    for name, pattern in refusals:
        wait_log(cluster.nodes[name], pattern)
    assert count_log(a, link_up("b")) == count_log(b, link_up("a")) == 0
    no_traceback(a, b)


@pytest.mark.parametrize(
    ("client", "why"),
    [
        pytest.param("no certificate", "it showed no certificate", id="no-certificate"),
        pytest.param(
            "plain", "it does not speak TLS (are its [cluster] tls_ keys set?)", id="no-tls"
        ),
    ],
)
def test_a_peer_without_a_certificate_is_refused(
    start_broker: Any,
    redis_url: str,
    certificates: Certificates,
    caplog: pytest.LogCaptureFixture,
    client: str,
    why: str,
) -> None:
    """A TLS client that shows no certificate, or a node without TLS (its HELLO in
    clear): refused in one line naming it, before any frame is read."""
    cert = certificates.issue("a")
    node = start_in_process_node(
        start_broker,
        redis_url,
        tls_certfile=cert.certfile,
        tls_keyfile=cert.keyfile,
        tls_cafile=certificates.cafile,
    )
    with socket.create_connection(cluster_of(node).address, timeout=TIMEOUT) as sock:
        me = "{}:{}".format(*sock.getsockname())
        if client == "plain":
            sock.sendall(frames.encode(HELLO, frames.PROTOCOL_VERSION, *HELLO_B))
        else:
            context = ssl.create_default_context(cafile=certificates.cafile)
            context.check_hostname = False
            with context.wrap_socket(sock) as tls:  # TLS 1.3: refused after its end
                tls.sendall(frames.encode(HELLO, frames.PROTOCOL_VERSION, *HELLO_B))
                with contextlib.suppress(ssl.SSLError, OSError):
                    assert tls.recv(100) == b""
        line = f"cluster listener: refused a link from {me}: TLS handshake failed: {why}"
        node.wait_for(lambda: line in caplog.messages)
    assert [m for m in caplog.messages if me in m] == [line]


def test_a_dns_name_of_the_certificate_may_name_the_node(
    cluster: Cluster, certificates: Certificates
) -> None:
    """The name checked is the CN or one of the DNS names: b's certificate has the CN
    node-b.example and the DNS name b."""
    a = cluster.node("a", extra=certificates.keys(certificates.issue("a")))
    by_dns = issue(certificates.ca, certificates.directory, "b", "b", cn="node-b.example")
    b = cluster.node("b", extra=certificates.keys(by_dns))
    a.start()
    b.start()
    cluster.wait_linked([a, b])
    routes(cluster, a, b, "dns")


def test_the_names_of_a_certificate_are_its_cn_and_dns_names() -> None:
    certificate = {
        "subject": ((("organizationName", "o"),), (("commonName", "a"),)),
        "subjectAltName": (("DNS", "a.cluster.test"), ("IP Address", "10.0.0.1"), ("DNS", "b")),
    }
    assert certificate_names(certificate) == ["a", "a.cluster.test", "b"]
    assert certificate_names({"subjectAltName": (("DNS", "c"),)}) == ["c"]
    assert certificate_names({}) == []


# --------------------------------------------------------------------------- the keys


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"tls_certfile": "n.crt"}, "cluster.tls_keyfile: needed with tls_certfile"),
        (
            {"tls_certfile": "n.crt", "tls_keyfile": "n.key"},
            "cluster.tls_cafile: needed with tls_certfile and tls_keyfile",
        ),
        ({"tls_cafile": "ca.pem"}, "cluster.tls_certfile: needed with tls_cafile"),
        (
            {"tls_keypasswd": "pw"},
            "cluster.tls_keypasswd: a TLS setting, and TLS is off (set tls_certfile)",
        ),
    ],
)
def test_tls_keys_go_together(keys: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}( |$)"):
        config_from_dict({"cluster": {"address": "127.0.0.1:0", **keys}})


def test_check_config_loads_the_cluster_tls_files(
    tmp_path: Path, certificates: Certificates
) -> None:
    cert = certificates.issue("a")
    config = tmp_path / "a.toml"

    def write(certfile: str, cafile: str) -> None:
        config.write_text(
            '[cluster]\naddress = "127.0.0.1:0"\nmetadata = "swc"\n'
            f'tls_certfile = "{certfile}"\ntls_keyfile = "{cert.keyfile}"\n'
            f'tls_cafile = "{cafile}"\n'
        )

    write(cert.certfile, certificates.cafile)
    assert check_config(config).returncode == 0
    write(str(tmp_path / "missing.crt"), certificates.cafile)
    done = check_config(config)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"nautilus check-config: cluster.tls_certfile: cannot load {tmp_path}/missing.crt "
        f"with the key {cert.keyfile}: No such file or directory"
    )
    write(cert.certfile, cert.keyfile)  # a key where the CA should be
    done = check_config(config)
    assert done.returncode == 2
    assert done.stderr.startswith(
        f"nautilus check-config: cluster.tls_cafile: cannot load {cert.keyfile}: "
    ), done.stderr
    assert len(done.stderr.splitlines()) == 1
