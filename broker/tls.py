"""TLS listeners: the server's SSLContext from a listener's settings (or the event
relay's, or the cluster channel's, which have the same keys), the client's context of
the cluster channel's mutual TLS, and reloading a listener's certificates without
dropping a connection.

The listener is created with a context whose SNI callback hands each new handshake the
`current` context; a reload (SIGHUP) builds a new one from the files and swaps it in, so
established connections keep theirs and new ones get the new certificates. A reload that
fails keeps the old context (and says why).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from broker.config import ConfigError

_VERSIONS = {"tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}


class TlsSettings(Protocol):
    """The keys a TLS server is made of: a listener's (ListenerSettings), or
    [event_relay]'s (VerneMQ's names, docs/configuration.md)."""

    @property
    def certfile(self) -> str: ...
    @property
    def keyfile(self) -> str: ...
    @property
    def keypasswd(self) -> str: ...
    @property
    def cafile(self) -> str: ...
    @property
    def require_certificate(self) -> bool: ...
    @property
    def tls_version(self) -> str: ...  # "tlsv1.2" or "tlsv1.3": the lowest accepted
    @property
    def ciphers(self) -> str: ...


def server_context(listener: TlsSettings, where: str, prefix: str = "") -> ssl.SSLContext:
    """A context from the listener's files; a file that will not load is a ConfigError
    naming its key (`where` is the section: "listeners[0]", "event_relay"; `prefix` the
    keys' own, "tls_" for [cluster]'s tls_certfile...)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _VERSIONS[listener.tls_version]
    _load_chain(context, listener, where, prefix)
    if listener.cafile:
        _load_ca(context, listener, f"{where}.{prefix}")
        # With a CA, clients may show a certificate (then it must chain to the CA).
        context.verify_mode = (
            ssl.CERT_REQUIRED if listener.require_certificate else ssl.CERT_OPTIONAL
        )
    if listener.ciphers:
        try:
            context.set_ciphers(listener.ciphers)
        except ssl.SSLError:
            raise ConfigError(
                f"{where}.{prefix}ciphers: no cipher matches {listener.ciphers!r}"
            ) from None
    return context


def client_context(settings: TlsSettings, where: str, prefix: str = "") -> ssl.SSLContext:
    """A client's context from the same keys: it shows its certificate, and trusts only
    the CA of `cafile`. The server's name is not checked here (the caller knows what it
    should be: a cluster node's name, not the address it is reached at)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = _VERSIONS[settings.tls_version]
    context.check_hostname = False
    _load_chain(context, settings, where, prefix)
    _load_ca(context, settings, f"{where}.{prefix}")  # verify_mode is CERT_REQUIRED
    return context


def _load_chain(context: ssl.SSLContext, settings: TlsSettings, where: str, prefix: str) -> None:
    try:
        # The password as a function: OpenSSL never asks on a terminal (an encrypted key
        # without keypasswd would otherwise block the broker on a prompt).
        context.load_cert_chain(
            settings.certfile, settings.keyfile, password=lambda: settings.keypasswd
        )
    except (OSError, ssl.SSLError) as exc:
        encrypted = isinstance(exc, ssl.SSLError) and not settings.keypasswd
        hint = f" (if the key is encrypted, set {prefix}keypasswd)" if encrypted else ""
        raise ConfigError(
            f"{where}.{prefix}certfile: cannot load {settings.certfile} with the key "
            f"{settings.keyfile}: {why(exc)}{hint}"
        ) from None


def _load_ca(context: ssl.SSLContext, settings: TlsSettings, keys: str) -> None:
    try:
        context.load_verify_locations(cafile=settings.cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{keys}cafile: cannot load {settings.cafile}: {why(exc)}") from None


def why(exc: OSError) -> str:
    """Why a file did not load, in a few words."""
    if isinstance(exc, ssl.SSLError):  # e.g. KEY_VALUES_MISMATCH, PEM_LIB
        return exc.reason or str(exc)
    return exc.strerror or str(exc)  # e.g. No such file or directory


@dataclass(frozen=True)
class HandshakeWords:
    """How one side names the failures of a TLS handshake with its peer: the cluster
    channel speaks of "it", the relay's consumer of "the relay"."""

    untrusted: str  # before the verifier's message, for a certificate not trusted
    closed: str  # the peer closed the connection during the handshake
    reasons: Mapping[str, str]  # OpenSSL's reason -> what it means here


def handshake_problem(exc: ssl.SSLError, words: HandshakeWords) -> str:
    """Why a TLS handshake failed, in a few words, from OpenSSL's error."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"{words.untrusted} ({exc.verify_message})"
    if isinstance(exc, ssl.SSLEOFError):
        return words.closed
    return words.reasons.get(exc.reason or "", f"TLS failed: {exc.reason or exc}")


class TlsListener:
    """The contexts of one TLS listener: `server` to create it with, `current` for new
    handshakes."""

    def __init__(self, listener: TlsSettings, where: str, prefix: str = "") -> None:
        self.listener = listener
        self.where = where
        self.prefix = prefix
        self.current = server_context(listener, where, prefix)
        self.server = server_context(listener, where, prefix)
        self.server.sni_callback = self._choose

    def _choose(self, ssl_object: ssl.SSLObject, _name: str | None, _ctx: Any) -> None:
        ssl_object.context = self.current

    def reload(self) -> None:
        """Load the files again (ConfigError, and the old context stays, if they fail)."""
        self.current = server_context(self.listener, self.where, self.prefix)


def common_name(certificate: dict[str, Any]) -> str | None:
    """The subject's CN of a verified peer certificate (ssl's getpeercert() form)."""
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def certificate_names(certificate: dict[str, Any]) -> list[str]:
    """The names a verified peer certificate is for: its subject's CN and its DNS names
    (subjectAltName), as getpeercert() gives them."""
    names = [value for kind, value in certificate.get("subjectAltName", ()) if kind == "DNS"]
    cn = common_name(certificate)
    return [cn, *names] if cn is not None else names
