"""TLS on the cluster channel ([cluster] tls_certfile, tls_keyfile, tls_cafile): mutual,
each node showing a certificate that the cluster's CA signed and that names the node
(its subject CN, or one of its DNS names, is the node's name); `tls_keypasswd` if the
key is encrypted.

Both ends check the other's certificate against the CA, then its name: the connecting
node against the node it meant to reach, the accepting node against the name the peer
gives in HELLO (broker/cluster/link.py). The connecting node uses asyncio's TLS; the
accepting node runs the handshake over memory BIOs (broker/tls_stream.py, as the MQTT
listeners behind a PROXY header and the event relay do), so that one that fails is one
line naming the peer and why (asyncio's own TLS server says nothing of it, and uvloop
reads a connection before asyncio's start_tls could take it over). SIGHUP loads the
files again for the links made after it (established ones keep theirs).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from broker.config import ClusterSettings
from broker.tls import (
    HandshakeWords,
    certificate_names,
    client_context,
    handshake_problem,
    server_context,
)
from broker.tls_stream import TlsStream

WHERE, PREFIX = "cluster", "tls_"  # how errors name the keys: cluster.tls_certfile


@dataclass(frozen=True, slots=True)
class ChannelKeys:
    """[cluster]'s TLS keys as broker/tls.py reads a listener's (its TlsSettings)."""

    certfile: str
    keyfile: str
    cafile: str
    keypasswd: str = ""
    require_certificate: bool = True  # mutual: every node shows its certificate
    tls_version: str = "tlsv1.2"  # the lowest accepted
    ciphers: str = ""


class ChannelTls:
    """The contexts of a node's cluster channel: `server` for the links it accepts,
    `client` for those it makes (a ConfigError naming the key if a file will not load).
    Each link takes the context of the moment: a reload is for the links made after it."""

    where = WHERE  # as SIGHUP's log line names it

    def __init__(self, settings: ClusterSettings) -> None:
        self.keys = ChannelKeys(
            settings.tls_certfile, settings.tls_keyfile, settings.tls_cafile, settings.tls_keypasswd
        )
        self.server = server_context(self.keys, WHERE, PREFIX)
        self.client = client_context(self.keys, WHERE, PREFIX)

    def reload(self) -> None:
        """Load the files again (ConfigError, and both old contexts stay, if they fail)."""
        server = server_context(self.keys, WHERE, PREFIX)
        self.client = client_context(self.keys, WHERE, PREFIX)
        self.server = server

    def accepting(
        self, make_link: Callable[[], AcceptedLink], loop: asyncio.AbstractEventLoop, timeout: float
    ) -> AcceptedTls:
        """The protocol of a connection to the cluster listener: TLS, then the link."""
        return AcceptedTls(self.server, make_link(), loop, timeout)


class AcceptedLink(Protocol):
    """The link above the TLS of an accepted connection (link.py's ClusterServerProtocol),
    which says why a handshake failed as it says its other refusals."""

    def tls_refused(self, peer: Any, reason: str) -> None: ...


class AcceptedTls(TlsStream):
    """An accepted connection: its TLS handshake, then its link (`link`, the protocol
    above). A handshake that fails or does not end in time is one line, said by the link."""

    def __init__(
        self,
        context: ssl.SSLContext,
        link: AcceptedLink,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
    ) -> None:
        super().__init__(context, lambda: link, loop, timeout)  # type: ignore[arg-type, return-value]
        self.link = link
        self.begun = False  # the peer sent some of its handshake (a port probe sends none)

    def data_received(self, data: bytes) -> None:
        self.begun = True
        super().data_received(data)

    def handshake_failed(self, peer: Any, exc: ssl.SSLError) -> None:
        self.link.tls_refused(peer, f"TLS handshake failed: {tls_problem(exc)}")

    def eof_received(self) -> bool | None:
        if self.upper is None and self.begun and self.socket is not None:
            peer = self.socket.get_extra_info("peername")
            self.link.tls_refused(peer, f"TLS handshake failed: {CLOSED_IN_HANDSHAKE}")
        return super().eof_received()

    def _give_up(self) -> None:
        if self.socket is not None and self.upper is None:
            peer = self.socket.get_extra_info("peername")
            self.link.tls_refused(peer, f"no TLS handshake in {self.timeout:g}s")
            self.socket.close()


# asyncio's TLS client closes without an alert when it refuses the certificate it is shown.
CLOSED_IN_HANDSHAKE = (
    "it closed the connection during the TLS handshake "
    "(is its TLS on? does it trust this node's certificate?)"
)
# What a failed handshake means, said of the peer ("it"), either side.
_NOT_TLS = "it does not speak TLS (are its [cluster] tls_ keys set?)"
_WORDS = HandshakeWords(
    untrusted="its certificate is not trusted",
    closed=CLOSED_IN_HANDSHAKE,
    reasons={
        "WRONG_VERSION_NUMBER": _NOT_TLS,
        "HTTP_REQUEST": _NOT_TLS,
        "PEER_DID_NOT_RETURN_A_CERTIFICATE": "it showed no certificate",
        "TLSV13_ALERT_CERTIFICATE_REQUIRED": "it requires a certificate, and this node showed none",
        "TLSV1_ALERT_UNKNOWN_CA": "it does not trust this node's certificate (unknown CA)",
        "SSLV3_ALERT_BAD_CERTIFICATE": "it refused this node's certificate",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "it refused this node's certificate",
        "SSLV3_ALERT_HANDSHAKE_FAILURE": "it refused the handshake",
    },
)


def tls_problem(exc: ssl.SSLError) -> str:
    """Why a TLS handshake with a peer failed, in a few words."""
    return handshake_problem(exc, _WORDS)


def certificate_problem(transport: asyncio.BaseTransport, node: str) -> str | None:
    """Why the certificate the peer showed does not prove it is `node`; None when its
    subject CN or one of its DNS names is `node` (compared exactly). Said to both sides
    (REFUSED carries it), whose lines name the peer."""
    names = certificate_names(transport.get_extra_info("peercert") or {})
    if node in names:
        return None
    return f"the certificate shown names {', '.join(names) or 'nothing'}, not {node}"
