"""Which function handles each packet class a client may send: one table
(engine.PacketHandlers) the Broker gives every engine.

The engine (broker/client/engine.py) decodes and runs what this table names; the handlers
(connect, publish, subscribe) handle the packets and answer through the client's outlet.
The engine imports none of them: only this table does.
"""

from __future__ import annotations

from broker.client import connect, publish, subscribe
from broker.client.engine import ClientEngine, PacketHandlers
from broker.protocol import (
    Auth,
    Connect,
    Disconnect,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
)

HANDLERS = PacketHandlers(
    by_packet={
        Connect: connect.on_connect,
        Auth: connect.on_auth,
        Disconnect: connect.on_disconnect,
        Publish: publish.on_publish,
        PubAck: publish.on_puback,
        PubRec: publish.on_pubrec,
        PubRel: publish.on_pubrel,
        PubComp: publish.on_pubcomp,
        Subscribe: subscribe.on_subscribe,
        Unsubscribe: subscribe.on_unsubscribe,
        PingReq: ClientEngine.on_pingreq,
    },
    route_held=publish.route_held,
)
