"""The relay for consumers on other machines: TLS (`[event_relay] certfile` / `keyfile`,
client certificates with `cafile`), the secret sent only once the handshake is done, and
every refusal (a wrong secret, a certificate either side refuses, a consumer without TLS
on the TLS port) one line on each side.

The broker is the real command (`python -m broker`, on uvloop, its log on stderr) and
the consumers the real `nautilus events tail` and RelayClient; certificates are issued by
throwaway trustme CAs (tests/broker/test_tls.py's `pki`). The relay's lines about one
refusal are the lines it logs between two consumers attaching (`attach`): each awaited
as a line, never a sleep.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme

from broker.config import ConfigError
from event_relay.client import RelayClient, RelayError, tls_context
from tests.broker.helpers import RawClient, unique_id
from tests.broker.test_tls import Pki, issue, pki
from tests.test_cli import BrokerProcess, clean_env, nautilus

from .conftest import RELAY, flood, unique
from .test_config_cli import load, relay_broker_process

__all__ = ["pki"]  # a fixture, used by name

HOST = "127.0.0.1"
SECRET = "s3cret"
TAIL = "nautilus-events-tail"  # the consumer name `events tail` gives
REFUSED_SECRET = re.compile(r"WARNING .*event relay: 127\.0\.0\.1:\d+: consumer '(.*)' refused")


# --------------------------------------------------------------------------- helpers


def tls_relay(tmp_path: Path, start_process, pki: Pki, extra: str = "") -> tuple[Any, str]:
    """A broker process whose relay has TLS (the pki's server certificate, for
    127.0.0.1) and the secret SECRET; one message published, so a consumer reads one
    on_publish event. Returns the process and the relay's host:port."""
    keys = (
        f'certfile = "{pki.server.certfile}"\nkeyfile = "{pki.server.keyfile}"\n'
        f'secret = "{SECRET}"\n{extra}'
    )
    proc, relay = relay_broker_process(tmp_path, start_process, keys)
    pub = RawClient(HOST, proc.port)
    try:
        pub.connect(unique_id("tls"))
        pub.publish("relay/tls", b"over tls", qos=1)
    finally:
        pub.close()
    return proc, relay


def secret_file(tmp_path: Path, text: str = f"{SECRET}\n") -> str:
    path = tmp_path / unique("secret")
    path.write_text(text, encoding="utf-8")
    return str(path)


def tail(tmp_path: Path, relay: str, *args: str, env: dict[str, str] | None = None):
    """`nautilus events tail` for the first on_publish event, with `args`."""
    return nautilus(
        "events", "tail", "--relay", relay, "--from", "earliest", "--type", "on_publish",
        "--count", "1", *args, cwd=tmp_path, env=env,
    )  # fmt: skip


def attach(proc: BrokerProcess, relay: str, context: ssl.SSLContext) -> None:
    """A consumer attaches (and leaves); returns once the relay has logged it, so the
    relay's log has been read up to that point."""
    name = unique("sentinel")
    host, port = relay.rsplit(":", 1)

    async def visit() -> None:
        client = await RelayClient.connect(
            host, int(port), name=name, start=None, secret=SECRET, tls=context
        )
        await client.close()

    asyncio.run(visit())
    proc.wait_for(re.compile(rf"event relay: consumer '{name}' attached"))


def refused(proc: BrokerProcess, relay: str, context: ssl.SSLContext, run) -> tuple[str, Any]:
    """What the relay logs about `run()` (a refused consumer: exactly one line) and
    what `run()` returned."""
    attach(proc, relay, context)
    mark = len(proc.lines)
    result = run()
    attach(proc, relay, context)
    lines = proc.lines[mark:-1]  # up to the second sentinel's line
    assert len(lines) == 1, lines
    return lines[0], result


def one_line(result) -> str:
    """The only line a refused `events tail` printed (exit status 1, nothing on stdout)."""
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# --------------------------------------------------------------------------- reading


def test_events_tail_reads_over_tls_with_the_ca_and_a_secret_file(tmp_path, start_process, pki):
    _, relay = tls_relay(tmp_path, start_process, pki)
    secret = secret_file(tmp_path)
    result = tail(tmp_path, relay, "--relay-cafile", pki.cafile, "--relay-secret-file", secret)
    assert result.returncode == 0, result.stderr
    assert '"payload": "over tls"' in result.stdout
    # --relay-tls alone checks against the system's CAs (OpenSSL reads SSL_CERT_FILE),
    # and the secret may come from the environment.
    env = clean_env(SSL_CERT_FILE=pki.cafile, NAUTILUS_RELAY_SECRET=SECRET)
    assert tail(tmp_path, relay, "--relay-tls", env=env).stdout == result.stdout
    # Without the CA in the system's store the relay is not trusted.
    env = clean_env(SSL_CERT_FILE=pki.other_cafile, NAUTILUS_RELAY_SECRET=SECRET)
    assert "not trusted" in one_line(tail(tmp_path, relay, "--relay-tls", env=env))


def test_a_consumer_that_does_not_trust_the_relay(tmp_path, start_process, pki):
    proc, relay = tls_relay(tmp_path, start_process, pki)
    good = tls_context(pki.cafile)
    args = ("--relay-cafile", pki.other_cafile, "--relay-secret-file", secret_file(tmp_path))
    logged, result = refused(proc, relay, good, lambda: tail(tmp_path, relay, *args))
    # (OpenSSL's words for why vary with the CAs trustme made)
    prefix = f"nautilus events: relay {relay}: tls: the relay's certificate is not trusted ("
    assert one_line(result).startswith(prefix), result.stderr
    # (asyncio's client closes without an alert: the relay can only say it left)
    assert re.search(
        r"WARNING .*event relay: 127\.0\.0\.1:\d+: TLS handshake failed: the consumer closed "
        r"the connection \(does it trust the relay's certificate\?\)$",
        logged,
    ), logged


def test_a_consumer_without_tls_gets_nothing_and_sends_nothing_in_clear(
    tmp_path, start_process, pki
):
    proc, relay = tls_relay(tmp_path, start_process, pki)
    env = clean_env(NAUTILUS_RELAY_SECRET=SECRET)
    logged, result = refused(
        proc, relay, tls_context(pki.cafile), lambda: tail(tmp_path, relay, env=env)
    )
    # Its HELLO, secret included, went to the TLS handshake, which failed: no answer.
    assert one_line(result) == (
        f"nautilus events: relay {relay}: closed: the relay closed the connection during "
        "the handshake (if its TLS is on, connect with TLS)"
    )
    assert re.search(
        r"WARNING .*event relay: 127\.0\.0\.1:\d+: TLS handshake failed: not TLS "
        r"\(a consumer without TLS on the TLS port\?\)$",
        logged,
    ), logged


def test_a_wrong_secret_over_tls(tmp_path, start_process, pki):
    proc, relay = tls_relay(tmp_path, start_process, pki)
    args = ("--relay-cafile", pki.cafile, "--relay-secret-file", secret_file(tmp_path, "nope\n"))
    logged, result = refused(
        proc, relay, tls_context(pki.cafile), lambda: tail(tmp_path, relay, *args)
    )
    assert one_line(result) == (
        f"nautilus events: relay {relay}: unauthorized: a valid secret is required"
    )
    match = REFUSED_SECRET.search(logged)
    assert match and match[1] == TAIL and logged.endswith("wrong or missing secret"), logged


def test_client_certificates_required(tmp_path, start_process, pki):
    extra = f'cafile = "{pki.cafile}"\nrequire_certificate = true\n'
    proc, relay = tls_relay(tmp_path, start_process, pki, extra)
    device = tls_context(pki.cafile, pki.device.certfile, pki.device.keyfile)
    secret = secret_file(tmp_path)
    without = ("--relay-cafile", pki.cafile, "--relay-secret-file", secret)
    logged, result = refused(proc, relay, device, lambda: tail(tmp_path, relay, *without))
    # TLS 1.3: the consumer's handshake is done before the relay checks its certificate,
    # so the refusal comes in the relay's first reply (HELLO went to the relay, encrypted).
    assert one_line(result) == (
        f"nautilus events: relay {relay}: tls: the relay requires a client certificate"
    )
    assert re.search(
        r"WARNING .*event relay: 127\.0\.0\.1:\d+: TLS handshake failed: the consumer showed "
        r"no certificate \(require_certificate = true\)$",
        logged,
    ), logged

    stranger = (*without, "--relay-certfile", pki.stranger.certfile,
                "--relay-keyfile", pki.stranger.keyfile)  # fmt: skip
    logged, result = refused(proc, relay, device, lambda: tail(tmp_path, relay, *stranger))
    assert one_line(result) == (
        f"nautilus events: relay {relay}: tls: the relay refused this consumer's certificate "
        "(unknown CA)"
    )
    assert re.search(
        r"TLS handshake failed: the consumer's certificate is not trusted \(unable to get "
        r"local issuer certificate\)$",
        logged,
    ), logged

    admitted = (*without, "--relay-certfile", pki.device.certfile,
                "--relay-keyfile", pki.device.keyfile)  # fmt: skip
    result = tail(tmp_path, relay, *admitted)
    assert result.returncode == 0, result.stderr
    assert '"payload": "over tls"' in result.stdout


def test_sighup_reloads_the_relays_certificate(tmp_path, start_process, pki):
    live = tmp_path / "live"
    live.mkdir()
    certfile, keyfile = live / "relay.crt", live / "relay.key"
    certfile.write_bytes(Path(pki.server.certfile).read_bytes())
    keyfile.write_bytes(Path(pki.server.keyfile).read_bytes())
    keys = f'certfile = "{certfile}"\nkeyfile = "{keyfile}"\n'
    proc, relay = relay_broker_process(tmp_path, start_process, keys)
    host, port = relay.rsplit(":", 1)

    async def attaches(cafile: str) -> None:
        client = await RelayClient.connect(host, int(port), name="r", tls=tls_context(cafile))
        await client.close()

    asyncio.run(attaches(pki.cafile))
    new_ca = trustme.CA()
    new_cafile = str(tmp_path / "new-ca.pem")
    new_ca.cert_pem.write_to_path(new_cafile)
    renewed = issue(new_ca, tmp_path, "renewed", HOST, cn="relay")
    certfile.write_bytes(Path(renewed.certfile).read_bytes())
    keyfile.write_bytes(Path(renewed.keyfile).read_bytes())
    proc.proc.send_signal(signal.SIGHUP)
    proc.wait_for(re.compile(r"event_relay: TLS certificates reloaded"))
    asyncio.run(attaches(new_cafile))
    with pytest.raises(RelayError, match="the relay's certificate is not trusted"):
        asyncio.run(attaches(pki.cafile))


# --------------------------------------------------------------------------- in process


def test_a_flood_over_tls_arrives_whole(relay_broker, pki):
    # Many frames through the TLS layer, the consumer's socket buffer filling and draining.
    broker = relay_broker(relay={"certfile": pki.server.certfile, "keyfile": pki.server.keyfile})
    end = flood(broker, 20_000, payload=b"p" * 100)

    async def scenario() -> list[int]:
        seqs: list[int] = []
        client = await broker.connect(start="earliest", tls=tls_context(pki.cafile))
        async with client:
            async for batch in client.batches():
                seqs += [record[0] for record in batch]
                if seqs[-1] >= end - 1:
                    return seqs
        return seqs

    seqs = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert seqs == list(range(1, end)), (seqs[:5], seqs[-5:])


def test_a_tls_consumer_on_a_relay_without_tls(relay_broker, pki):
    broker = relay_broker()

    async def scenario() -> None:
        with pytest.raises(RelayError) as caught:
            await broker.connect(start="latest", tls=tls_context(pki.cafile))
        host, port = broker.address
        assert str(caught.value) == (
            f"relay {host}:{port}: tls: the relay does not speak TLS on this port "
            "(is its certfile set?)"
        )

    asyncio.run(scenario())


# --------------------------------------------------------------------------- configuration


def tls_keys(pki: Pki, **keys: Any) -> dict[str, Any]:
    return {"certfile": pki.server.certfile, "keyfile": pki.server.keyfile, **keys}


TLS_BAD = [
    pytest.param(
        {"certfile": "SERVER"},
        "event_relay.keyfile: needed with certfile (TLS needs both)",
        id="no-key",
    ),
    pytest.param(
        {"keyfile": "KEY"},
        "event_relay.certfile: needed with keyfile (TLS needs both)",
        id="no-cert",
    ),
    pytest.param(
        {"cafile": "CA"}, "event_relay.cafile: a TLS setting, and TLS is off", id="ca-alone"
    ),
    pytest.param(
        {"require_certificate": True},
        "event_relay.require_certificate: a TLS setting",
        id="require-alone",
    ),
    pytest.param(
        {"certfile": "SERVER", "keyfile": "KEY", "require_certificate": True},
        "event_relay.cafile: require_certificate needs the CA to check against",
        id="require-no-ca",
    ),
    pytest.param(
        {"certfile": "SERVER", "keyfile": "CA"},
        "event_relay.certfile: cannot load ",
        id="not-a-key",
    ),
    pytest.param(
        {"certfile": "SERVER", "keyfile": "KEY", "cafile": "KEY"},
        "event_relay.cafile: ",
        id="not-a-ca",
    ),
    pytest.param(
        {"certfile": "SERVER", "keyfile": "KEY", "cafile": "missing.pem"},
        "event_relay.cafile: cannot load missing.pem: No such file or directory",
        id="missing-ca",
    ),
    pytest.param(
        {"tls_version": "tlsv1.1"},
        "event_relay.tls_version: 'tlsv1.1' is not one of",
        id="version",
    ),
]


@pytest.mark.parametrize(("keys", "message"), TLS_BAD)
def test_tls_config_errors_name_the_key(pki, keys, message):
    files = {"SERVER": pki.server.certfile, "KEY": pki.server.keyfile, "CA": pki.cafile}
    keys = {key: files.get(value, value) for key, value in keys.items()}
    with pytest.raises(ConfigError) as caught:
        load({"enabled": True, "address": "127.0.0.1:0", **keys})
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_certfile_that_will_not_load_is_one_line_exit_2(tmp_path, pki):
    config = tmp_path / "bad.toml"
    config.write_text(
        '[[listeners]]\naddress = "127.0.0.1:0"\n[store]\nbackend = "memory"\n'
        f'[event_relay]\nenabled = true\naddress = "127.0.0.1:0"\n'
        f'certfile = "{pki.server.certfile}"\nkeyfile = "{pki.device.keyfile}"\n',
        encoding="utf-8",
    )
    result = nautilus("--config", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"nautilus: event_relay.certfile: cannot load {pki.server.certfile} with the key "
        f"{pki.device.keyfile}: KEY_VALUES_MISMATCH (if the key is encrypted, set keypasswd)"
    ]


IN_CLEAR = (
    "event relay: secret is set but TLS is off: the secret and the events cross the network "
    "in clear to consumers of {address} (set event_relay.certfile and event_relay.keyfile to "
    "turn TLS on)"
)


@pytest.mark.parametrize(
    ("keys", "warned"),
    [
        ({"address": "0.0.0.0:7883", "secret": "x"}, True),
        ({"address": "192.0.2.7:7883", "secret": "x"}, True),
        ({"address": "relay.example:7883", "secret": "x"}, True),
        ({"address": "127.0.0.1:7883", "secret": "x"}, False),
        ({"address": "[::1]:7883", "secret": "x"}, False),
        ({"address": "localhost:7883", "secret": "x"}, False),
        ({"address": "0.0.0.0:7883"}, False),
        ({"address": "0.0.0.0:7883", "secret": "x", "certfile": "SERVER", "keyfile": "KEY"}, False),
    ],
)
def test_a_secret_in_clear_on_the_network_is_one_warning(pki, caplog, keys, warned):
    files = {"SERVER": pki.server.certfile, "KEY": pki.server.keyfile}
    keys = {key: files.get(value, value) for key, value in keys.items()}
    caplog.set_level(logging.INFO, logger="nautilus.event_relay")
    load({**RELAY, **keys})  # constructed, not started: nothing is bound
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ([IN_CLEAR.format(address=keys["address"])] if warned else [])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--relay-cafile", "missing.pem"], "--relay-cafile: cannot load missing.pem: No such"),
        (["--relay-certfile", "missing.crt"], "--relay-certfile: cannot load missing.crt"),
        (["--relay-keyfile", "x.key"], "--relay-keyfile: given without the certificate"),
        (["--relay-secret-file", "missing"], "--relay-secret-file: cannot read missing: No such"),
        (["--relay-secret-file", "EMPTY"], "--relay-secret-file: EMPTY holds no secret"),
        (["--relay-secret-file", "EMPTY", "--secret", "s"], "--secret: give the secret once"),
    ],
)
def test_events_tail_tls_and_secret_options_exit_2(tmp_path, args, message):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    args = [str(empty) if arg == "EMPTY" else arg for arg in args]
    result = nautilus("events", "tail", "--relay", f"{HOST}:9", *args, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"nautilus events: {message.replace('EMPTY', str(empty))}")
