# Which packet types may arrive, by role and connection state: the decoder's one table.
#
# A server expects exactly one CONNECT first [MQTT-3.1.0-1/2], then the client-to-server
# packets of the negotiated level; a client expects the server-to-client ones. AUTH and a
# server-sent DISCONNECT exist only in MQTT 5.
from __future__ import annotations

from ._events import PacketType as T

_FROM_CLIENT = frozenset(
    {T.PUBLISH, T.PUBACK, T.PUBREC, T.PUBREL, T.PUBCOMP, T.SUBSCRIBE, T.UNSUBSCRIBE}
    | {T.PINGREQ, T.DISCONNECT}
)
_FROM_SERVER = frozenset(
    {T.CONNACK, T.PUBLISH, T.PUBACK, T.PUBREC, T.PUBREL, T.PUBCOMP, T.SUBACK, T.UNSUBACK}
    | {T.PINGRESP}
)
_MQTT5_ONLY = frozenset({T.AUTH})

EXPECTED: dict[tuple[str, int | None], frozenset[int]] = {
    ("server", None): frozenset({T.CONNECT}),
    ("server", 3): _FROM_CLIENT,
    ("server", 4): _FROM_CLIENT,
    ("server", 5): _FROM_CLIENT | _MQTT5_ONLY,
    ("client", 3): _FROM_SERVER,
    ("client", 4): _FROM_SERVER,
    ("client", 5): _FROM_SERVER | _MQTT5_ONLY | {T.DISCONNECT},
}


def allowed_types(role: str, protocol_level: int | None) -> frozenset[int]:
    return EXPECTED[(role, protocol_level)]
