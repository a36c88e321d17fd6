"""Sans-I/O MQTT 3.1, 3.1.1 and 5.0 codec: bytes in, packets out; packets in, bytes out.

    decoder = Decoder(role="server")
    decoder.receive_data(chunk)
    while (packet := decoder.next_packet()) is not None:
        ...
    wire = encode(ConnAck(session_present=False), decoder.protocol_level)

No asyncio, no sockets: `broker.connection` and `broker.writer` are the only places that
touch a transport.
"""

from ._compiled import hot, use_compiled
from ._decoder import MAX_PACKET_SIZE, Decoder
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ._events import (
    MQTT5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from ._properties import Property
from ._readers import UnsupportedProtocolVersion
from ._reasons import V3_CONNACK_CODE, ConnectReturnCode, ReasonCode
from ._writers import PublishTemplate, encode, encode_puback, encode_pubrec

__all__ = [
    "MAX_PACKET_SIZE",
    "MQTT5",
    "V3_CONNACK_CODE",
    "Auth",
    "ConnAck",
    "Connect",
    "ConnectReturnCode",
    "Decoder",
    "Disconnect",
    "LocalProtocolError",
    "Packet",
    "PacketType",
    "PingReq",
    "PingResp",
    "Properties",
    "Property",
    "ProtocolError",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "PublishTemplate",
    "ReasonCode",
    "RemoteProtocolError",
    "SubAck",
    "Subscribe",
    "Subscription",
    "UnsubAck",
    "Unsubscribe",
    "UnsupportedProtocolVersion",
    "Will",
    "encode",
    "encode_puback",
    "encode_pubrec",
    "hot",
    "use_compiled",
]
