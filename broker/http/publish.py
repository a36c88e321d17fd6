"""POST /api/v1/publish: a message published over HTTP on behalf of a client (VerneMQ's
vmq_http_pub, "on-behalf-of"). This reads the request and writes the answer; the
authentication, authorization and routing are broker/on_behalf.py's.

A request comes in one of two shapes:
- JSON (`Content-Type: application/json`): `{"topic", "payload", "qos", "retain",
  "client_id", "mountpoint", "user" (or "username"), "password", "user_properties": [{"name":
  "value"}, ...]}`;
- anything else: the same fields as query parameters, and the body as the payload, byte
  for byte (unless a `payload` parameter is given).
`encoding=base64` (a parameter, or a field of the JSON) says that a payload given as text,
the JSON field or the parameter, is base64: how binary travels in those.

Answers: 200 with the message as published (after the plugins' modifiers), 400 for a
bad request, 401 when auth_on_register refuses the credentials, 403 when auth_on_publish
refuses the message (each with the plugin's reason), 503 when it cannot be taken now.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from broker.mountpoints import problem as mountpoint_problem
from broker.on_behalf import Kind, OnBehalf, PublishGate, Refused, publish
from broker.protocol import Property

STATUS = {
    Kind.INVALID: 400,
    Kind.NOT_AUTHENTICATED: 401,
    Kind.NOT_AUTHORIZED: 403,
    Kind.UNAVAILABLE: 503,
}


def handler(gate: PublishGate) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        try:
            wanted = await read(request)
        except ValueError as exc:
            return _error(400, str(exc))
        try:
            published = await publish(gate, wanted)
        except Refused as refused:
            return _error(STATUS[refused.kind], refused.reason)
        row = {
            "topic": published.topic,
            "qos": published.qos,
            "retain": published.retain,
            "client_id": published.client_id,
            "mountpoint": published.mountpoint,
            "username": published.username,
        }
        return web.json_response({"type": "table", "table": [row]})

    return handle


async def read(request: web.Request) -> OnBehalf:
    """The request's message and credentials; ValueError saying what is wrong."""
    fields: Mapping[str, Any]
    if request.content_type == "application/json":
        try:
            fields = await request.json()
        except ValueError:
            raise ValueError("the body is not JSON") from None
        if not isinstance(fields, dict):
            raise ValueError("the body is not a JSON object")
    else:
        fields = request.query
    payload: bytes
    if "payload" in fields:
        encoding = fields.get("encoding", request.query.get("encoding", "plain"))
        payload = _payload(_text(fields, "payload") or "", encoding)
    elif fields is request.query:
        payload = await request.read()
    else:
        payload = b""  # as a PUBLISH may have (a retained message's clearing)
    password = _text(fields, "password")
    transport = request.transport
    return OnBehalf(
        topic=_required(fields, "topic"),
        payload=payload,
        qos=_qos(fields.get("qos", 0)),
        retain=_flag(fields.get("retain", False), "retain"),
        properties=_user_properties(fields.get("user_properties")),
        client_id=_text(fields, "client_id") or "",
        mountpoint=_mountpoint(_text(fields, "mountpoint") or ""),
        username=_text(fields, "user") or _text(fields, "username"),  # user: VerneMQ's
        password=None if password is None else password.encode("utf-8"),
        peer=_address(transport.get_extra_info("peername") if transport else None),
        listener=_address(transport.get_extra_info("sockname") if transport else None),
    )


def _text(fields: Mapping[str, Any], name: str) -> str | None:
    """A text field, or None when it is not there."""
    value = fields.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name}: expected text, got {json.dumps(value)}")
    return value


def _mountpoint(value: str) -> str:
    why = mountpoint_problem(value)
    if why is not None:
        raise ValueError(f"mountpoint: {why}")
    return value


def _required(fields: Mapping[str, Any], name: str) -> str:
    value = _text(fields, name)
    if not value:
        raise ValueError(f"{name} is required")
    return value


def _payload(text: str, encoding: Any) -> bytes:
    if encoding == "plain":
        return text.encode("utf-8")
    if encoding != "base64":
        raise ValueError(f"encoding: expected plain or base64, got {encoding!r}")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise ValueError("payload: not base64 (encoding=base64)") from None


def _qos(value: Any) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if type(value) is not int or not 0 <= value <= 2:
        raise ValueError(f"qos: expected 0, 1 or 2, got {json.dumps(value)}")
    return value


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise ValueError(f"{name}: expected true or false, got {json.dumps(value)}")


def _user_properties(value: Any) -> dict[int, Any]:
    """VerneMQ's `[{"name": "value"}, ...]` (JSON text in a query parameter) as the
    message's MQTT 5 User Properties, in their order."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("user_properties: not JSON") from None
    if not isinstance(value, list) or not all(map(_text_pairs, value)):
        raise ValueError('user_properties: expected [{"name": "value"}, ...]')
    pairs = [pair for item in value for pair in item.items()]
    return {Property.USER_PROPERTY: pairs} if pairs else {}


def _text_pairs(item: Any) -> bool:
    return isinstance(item, dict) and all(isinstance(t, str) for t in (*item, *item.values()))


def _address(address: Any) -> tuple[str, int]:
    """A socket's (host, port), or ("", 0) for one that has none (a Unix socket)."""
    if isinstance(address, tuple) and len(address) >= 2:
        return str(address[0]), int(address[1])
    return "", 0


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"type": "error", "error": message}, status=status)
