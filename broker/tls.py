"""TLS listeners: the server's SSLContext from a listener's settings (or the event
relay's, which has the same keys), and reloading its certificates without dropping a
connection.

The listener is created with a context whose SNI callback hands each new handshake the
`current` context; a reload (SIGHUP) builds a new one from the files and swaps it in, so
established connections keep theirs and new ones get the new certificates. A reload that
fails keeps the old context (and says why).
"""

from __future__ import annotations

import ssl
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


def server_context(listener: TlsSettings, where: str) -> ssl.SSLContext:
    """A context from the listener's files; a file that will not load is a ConfigError
    naming its key (`where` is the section: "listeners[0]", "event_relay")."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _VERSIONS[listener.tls_version]
    try:
        # The password as a function: OpenSSL never asks on a terminal (an encrypted key
        # without keypasswd would otherwise block the broker on a prompt).
        context.load_cert_chain(
            listener.certfile, listener.keyfile, password=lambda: listener.keypasswd
        )
    except (OSError, ssl.SSLError) as exc:
        encrypted = isinstance(exc, ssl.SSLError) and not listener.keypasswd
        hint = " (if the key is encrypted, set keypasswd)" if encrypted else ""
        raise ConfigError(
            f"{where}.certfile: cannot load {listener.certfile} with the key "
            f"{listener.keyfile}: {why(exc)}{hint}"
        ) from None
    if listener.cafile:
        try:
            context.load_verify_locations(cafile=listener.cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"{where}.cafile: cannot load {listener.cafile}: {why(exc)}"
            ) from None
        # With a CA, clients may show a certificate (then it must chain to the CA).
        context.verify_mode = (
            ssl.CERT_REQUIRED if listener.require_certificate else ssl.CERT_OPTIONAL
        )
    if listener.ciphers:
        try:
            context.set_ciphers(listener.ciphers)
        except ssl.SSLError:
            raise ConfigError(f"{where}.ciphers: no cipher matches {listener.ciphers!r}") from None
    return context


def why(exc: OSError) -> str:
    """Why a file did not load, in a few words."""
    if isinstance(exc, ssl.SSLError):  # e.g. KEY_VALUES_MISMATCH, PEM_LIB
        return exc.reason or str(exc)
    return exc.strerror or str(exc)  # e.g. No such file or directory


class TlsListener:
    """The contexts of one TLS listener: `server` to create it with, `current` for new
    handshakes."""

    def __init__(self, listener: TlsSettings, where: str) -> None:
        self.listener = listener
        self.where = where
        self.current = server_context(listener, where)
        self.server = server_context(listener, where)
        self.server.sni_callback = self._choose

    def _choose(self, ssl_object: ssl.SSLObject, _name: str | None, _ctx: Any) -> None:
        ssl_object.context = self.current

    def reload(self) -> None:
        """Load the files again (ConfigError, and the old context stays, if they fail)."""
        self.current = server_context(self.listener, self.where)


def common_name(certificate: dict[str, Any]) -> str | None:
    """The subject's CN of a verified peer certificate (ssl's getpeercert() form)."""
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
