"""The MQTT sink's side of MQTT: where it publishes and how it logs in (`MqttTarget`, made
from `--sink mqtt://USER@HOST:PORT` and the `--sink-*` options), and `deliver`, which
publishes a batch's messages there (retained, QoS 1, MQTT 5) whatever it takes short of
a refusal.

The password (a JWT for auth_jwt, or a passwd/auth_db password) comes from a file or
the environment, never from the command line, and shows in no message: the sink is
named by its URL without one. MQTT 5, so that a PUBLISH the broker refuses (an ACL:
PUBACK 0x87) is seen as refused rather than as a closed connection.

What stops a query (QueryFailed, one line: spark_consumers.errors) and what is tried
again. A refusal stops it at once: CONNACK or PUBACK 0x80 and above (except the CONNACK
codes of a broker that is busy or starting), or a TLS certificate that does not verify.
A broker that is away (connection refused, no CONNACK, a connection dropped mid-batch)
is tried again with backoff, on a new connection that republishes what was not yet
acknowledged (a retained message published twice leaves the same retained message), until
`timeout` seconds pass without an acknowledgement: then the batch fails, and Spark runs
it again from the checkpoint when the query starts again.
"""

from __future__ import annotations

import hashlib
import os
import re
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from spark_consumers.errors import QueryFailed, SinkError
from spark_consumers.jobs import SINK_CLIENTS

PASSWORD_ENV = "NAUTILUS_SINK_PASSWORD"
PORTS = {"mqtt": 1883, "mqtts": 8883}
SINK_TIMEOUT = 30.0  # seconds without an acknowledgement before a batch fails
FIRST_RETRY, LAST_RETRY = 0.2, 2.0  # seconds between attempts: doubling up to the last
POLL = 1.0  # the longest one paho loop() waits for the socket
KEEPALIVE = 60
# CONNACK codes of a broker that may well accept the next attempt: server unavailable
# (auth_jwt while its JWK set cannot be fetched), busy, quota and connection rate.
BUSY = {0x88, 0x89, 0x97, 0x9F}
_OPENSSL_DECORATIONS = re.compile(r"^\[[^\]]*\]\s*|\s*\(_ssl\.c:\d+\)$")
URL_FORMS = "mqtt://[USER@]HOST[:PORT], mqtts://[USER@]HOST[:PORT] or mqtt:HOST:PORT"


@dataclass(frozen=True)
class MqttOptions:
    """How the MQTT sink logs in: `nautilus-spark`'s `--sink-password-file`,
    `--sink-cafile`, `--sink-certfile`, `--sink-keyfile`, `--sink-client-id` and
    `--sink-timeout`. The user is the sink URL's; the password comes from
    `password_file`, or else from $NAUTILUS_SINK_PASSWORD."""

    password_file: str | None = None
    cafile: str | None = None  # the CAs the broker's certificate is checked against
    certfile: str | None = None  # a client certificate (and its key: keyfile, or in it)
    keyfile: str | None = None
    client_id: str | None = None  # None: nautilus-spark-<job>-<checkpoint's hash>
    timeout: float = SINK_TIMEOUT


@dataclass(frozen=True)
class MqttTarget:
    """A broker the sink publishes to, resolved and checked (`mqtt_target`)."""

    url: str  # how messages name the sink: mqtt[s]://[USER@]HOST:PORT, no password
    host: str
    port: int
    username: str | None
    password: str | None = field(repr=False)
    tls: ssl.SSLContext | None
    client_id: str
    timeout: float


def mqtt_target(
    sink: str,
    job: str,
    options: MqttOptions = MqttOptions(),
    checkpoint: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> MqttTarget:
    """The target of `--sink` (`mqtt://`, `mqtts://` or `mqtt:HOST:PORT`) with its
    options; SinkError, naming the option, for anything that cannot work."""
    scheme, host, port, username = sink_address(sink)
    if options.timeout <= 0:
        raise SinkError(f"--sink-timeout {options.timeout:g}: must be more than 0 seconds")
    return MqttTarget(
        url=sink_url(scheme, host, port, username),
        host=host,
        port=port,
        username=username,
        password=sink_password(username, options, environ),
        tls=tls_context(scheme, options),
        client_id=client_id(job, checkpoint, options.client_id),
        timeout=options.timeout,
    )


def sink_address(sink: str) -> tuple[str, str, int, str | None]:
    """(scheme, host, port, user) of an MQTT sink."""
    if sink.startswith(("mqtt://", "mqtts://")):
        return _from_url(sink)
    host, colon, port = sink.removeprefix("mqtt:").rpartition(":")
    if not colon or not (port or host) or (port and not _is_port(port)):
        raise SinkError(f"--sink {sink}: expected {URL_FORMS}")
    # The older form, as before: an empty host is 127.0.0.1, an empty port 1883.
    return "mqtt", host.strip("[]") or "127.0.0.1", int(port or PORTS["mqtt"]), None


def _from_url(sink: str) -> tuple[str, str, int, str | None]:
    parts = urllib.parse.urlsplit(sink)
    if parts.password is not None:
        userinfo, _, where = parts.netloc.rpartition("@")
        shown = f"{parts.scheme}://{userinfo.partition(':')[0]}:***@{where}"
        raise SinkError(
            f"--sink {shown}: a password does not go on the command line (ps and shell "
            f"history show it): put it in a file for --sink-password-file, or in ${PASSWORD_ENV}"
        )
    try:
        port = parts.port
    except ValueError:
        port = 0
    host = parts.hostname
    if port == 0 or not host or parts.path not in ("", "/") or parts.query:
        raise SinkError(f"--sink {sink}: expected {URL_FORMS}")
    if parts.username == "":
        raise SinkError(f"--sink {sink}: an empty user (leave out the @ for none)")
    user = None if parts.username is None else urllib.parse.unquote(parts.username)
    return parts.scheme, host, port or PORTS[parts.scheme], user


def _is_port(text: str) -> bool:
    return text.isdigit() and 0 < int(text) < 65536


def sink_url(scheme: str, host: str, port: int, username: str | None) -> str:
    """The sink as messages name it (IPv6 hosts in brackets; never a password)."""
    user = "" if username is None else urllib.parse.quote(username, safe="") + "@"
    where = f"[{host}]" if ":" in host else host
    return f"{scheme}://{user}{where}:{port}"


def sink_password(
    username: str | None, options: MqttOptions, environ: Mapping[str, str]
) -> str | None:
    """The password from --sink-password-file (its trailing newline left out), or else
    from $NAUTILUS_SINK_PASSWORD; only for a sink that names a user."""
    if options.password_file is None:
        return None if username is None else environ.get(PASSWORD_ENV) or None
    where = f"--sink-password-file {options.password_file}"
    if username is None:
        raise SinkError(f"{where}: the sink names no user (mqtt://USER@HOST:PORT)")
    try:
        password = Path(options.password_file).read_text().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise SinkError(f"{where}: {_why(exc)}") from None
    if not password:
        raise SinkError(f"{where}: the file is empty")
    return password


def tls_context(scheme: str, options: MqttOptions) -> ssl.SSLContext | None:
    """For mqtts://: the broker's certificate checked against --sink-cafile (or the
    system's CAs), its host name included (SNI sent); a client certificate if given."""
    files = {
        "--sink-cafile": options.cafile,
        "--sink-certfile": options.certfile,
        "--sink-keyfile": options.keyfile,
    }
    if scheme != "mqtts":
        given = [name for name, path in files.items() if path]
        if given:
            raise SinkError(f"{given[0]}: only for an mqtts:// sink (TLS)")
        return None
    if options.keyfile and not options.certfile:
        raise SinkError("--sink-keyfile: only with --sink-certfile")
    try:
        context = ssl.create_default_context(cafile=options.cafile)
    except OSError as exc:  # ssl.SSLError included
        raise SinkError(f"--sink-cafile {options.cafile}: {_why(exc)}") from None
    if options.certfile:
        try:
            context.load_cert_chain(options.certfile, options.keyfile)
        except OSError as exc:
            named = f"--sink-certfile {options.certfile}"
            if options.keyfile:
                named += f" --sink-keyfile {options.keyfile}"
            why = _why(exc)
            if isinstance(exc, ssl.SSLError):
                why = f"not a certificate and its private key in PEM ({why})"
            raise SinkError(f"{named}: {why}") from None
    return context


def client_id(job: str, checkpoint: str | None, chosen: str | None = None) -> str:
    """The sink's MQTT client id: `chosen`, or `nautilus-spark-<job>-<8 hex digits of
    the checkpoint's absolute path>`, the same at every run of a query (ACL patterns
    with %c can name it); random without a checkpoint. It starts with nautilus-spark-
    (SINK_CLIENTS): the jobs leave that client's own events out."""
    if chosen is not None:
        if not chosen.startswith(SINK_CLIENTS):
            raise SinkError(
                f"--sink-client-id {chosen}: must start with {SINK_CLIENTS} (the jobs "
                "leave out that client's own events, or they would count what they publish)"
            )
        return chosen
    if checkpoint is None:
        return f"{SINK_CLIENTS}{job}-{uuid4().hex[:8]}"
    where = checkpoint if "://" in checkpoint else os.path.abspath(checkpoint)
    return f"{SINK_CLIENTS}{job}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


def _why(exc: BaseException) -> str:
    """An OS or TLS error's own words, without Python's decorations."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):  # "[SSL: CODE] words (_ssl.c:NNN)": the words
        return _OPENSSL_DECORATIONS.sub("", str(exc.args[-1]))
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# -- publishing -------------------------------------------------------------------------


class _Away(Exception):
    """The broker could not be reached, or went away: worth another attempt."""


def deliver(target: MqttTarget, messages: Sequence[tuple[str, bytes]]) -> None:
    """Publish each (topic, payload) retained at QoS 1, connecting as many times as it
    takes; QueryFailed when the broker refuses, or answers nothing for `target.timeout`
    seconds."""
    pending = dict(enumerate(messages))  # what is not acknowledged yet, by position
    progress = time.monotonic()  # the batch's start, then its last acknowledgement
    delay = FIRST_RETRY
    while pending:
        connection = _Connection(target)
        try:
            connection.open(progress + target.timeout)
            sent = {connection.publish(*pending[n]): n for n in pending}
            while sent:
                mid, code, properties = connection.next_ack(progress + target.timeout)
                n = sent.pop(mid)
                if code.is_failure:
                    refusal = f"publish to {pending[n][0]} refused: {_code(code, properties)}"
                    raise _failed(target, refusal)
                del pending[n]
                progress, delay = time.monotonic(), FIRST_RETRY
        except _Away as away:
            left = progress + target.timeout - time.monotonic()
            if left <= 0:
                why = f"broker unreachable for {target.timeout:g} s: {away}"
                raise _failed(target, why) from None
            time.sleep(min(delay, left))
            delay = min(delay * 2, LAST_RETRY)
        finally:
            connection.close()


def _failed(target: MqttTarget, what: str) -> QueryFailed:
    return QueryFailed(f"MQTT sink {target.url}: {what}")


def _code(code: ReasonCode, properties: Any = None) -> str:
    """`Not authorized (0x87)`, and the broker's Reason String when it adds something
    (`Bad user name or password (0x86): invalid_signature`)."""
    name, said = code.getName(), getattr(properties, "ReasonString", None)
    told = said and said.replace("_", " ").lower() != name.lower()
    return f"{name} (0x{code.value:02X})" + (f": {said}" if told else "")


@dataclass
class _Replies:
    """What the broker answered one connection (paho's callbacks write it; it holds no
    reference to the client, so a client dropped is closed at once)."""

    connack: tuple[ReasonCode, Any] | None = None  # the code and its properties
    acks: list[tuple[int, ReasonCode, Any]] = field(default_factory=list)
    lost: str | None = None


def _on_connect(_client: Any, replies: _Replies, _flags: Any, code: ReasonCode, props: Any) -> None:
    replies.connack = (code, props)


def _on_publish(_client: Any, replies: _Replies, mid: int, code: ReasonCode, props: Any) -> None:
    replies.acks.append((mid, code, props))


def _on_disconnect(
    _client: Any, replies: _Replies, flags: Any, code: ReasonCode, props: Any
) -> None:
    by_server = flags.is_disconnect_packet_from_server
    replies.lost = f"disconnected: {_code(code, props)}" if by_server else "connection lost"


class _Connection:
    """One MQTT 5 connection of the sink, run from the calling thread (paho's loop())."""

    def __init__(self, target: MqttTarget) -> None:
        self.target = target
        self.replies = _Replies()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=target.client_id,
            protocol=mqtt.MQTTv5,
            userdata=self.replies,
        )
        if target.username is not None:
            client.username_pw_set(target.username, target.password)
        if target.tls is not None:
            client.tls_set_context(target.tls)
        client.on_connect = _on_connect
        client.on_publish = _on_publish
        client.on_disconnect = _on_disconnect
        self.client = client

    def open(self, deadline: float) -> None:
        """Connect and wait for the CONNACK (_Away or QueryFailed if none, or a refusal)."""
        self.client.connect_timeout = max(deadline - time.monotonic(), 0.01)
        try:
            self.client.connect(self.target.host, self.target.port, KEEPALIVE, clean_start=True)
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError) as exc:  # closed mid-handshake
            raise _Away(_why(exc)) from None
        except ssl.SSLError as exc:  # the certificates: another attempt would not help
            raise _failed(self.target, f"TLS: {_why(exc)}") from None
        except OSError as exc:
            raise _Away(_why(exc)) from None
        self._run_until(lambda: self.replies.connack is not None, deadline, "no CONNACK")
        assert self.replies.connack is not None
        code, properties = self.replies.connack
        if code.is_failure:
            refusal = f"connect refused: {_code(code, properties)}"
            if code.value in BUSY:
                raise _Away(refusal)
            raise _failed(self.target, refusal)

    def publish(self, topic: str, payload: bytes) -> int:
        """Send (or queue, past paho's in-flight window) a retained QoS 1 PUBLISH."""
        info = self.client.publish(topic, payload, qos=1, retain=True)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise _Away(self.replies.lost or mqtt.error_string(info.rc))
        return info.mid

    def next_ack(self, deadline: float) -> tuple[int, ReasonCode, Any]:
        """The next PUBACK: (message id, reason code, properties)."""
        self._run_until(lambda: bool(self.replies.acks), deadline, "no PUBACK")
        return self.replies.acks.pop(0)

    def _run_until(self, condition: Callable[[], bool], deadline: float, missing: str) -> None:
        while not condition():
            left = deadline - time.monotonic()
            if self.replies.lost or left <= 0:
                raise _Away(self.replies.lost or missing)
            code = self.client.loop(min(left, POLL))
            if code != mqtt.MQTT_ERR_SUCCESS and not condition():
                raise _Away(self.replies.lost or mqtt.error_string(code))

    def close(self) -> None:
        self.client.disconnect()  # a DISCONNECT if connected, then the socket closed
