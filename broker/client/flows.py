"""The packet flows of a client, as one set the Broker gives each engine (engine.Flows):
which function handles each packet class the client may send.

The engine (broker/client/engine.py) decodes and runs what this table names; the flows
(connect, publish, subscribe) handle the packets and answer through the client's outlet.
The engine imports none of them: only this table does.
"""

from __future__ import annotations

from broker.client import connect, publish, subscribe
from broker.client.engine import ClientEngine, Flows
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

FLOWS = Flows(
    handlers={
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
