"""The packet flows of a client connection, as one set the Broker gives each Connection
(connection.Flows): which function handles each packet class the client may send.

The shell (broker/connection.py) reads the socket and runs what this table names; the
flows (connect_flow, publish_flow, subscriptions) handle the packets and answer through
the connection. The shell imports none of them: only this table does.
"""

from __future__ import annotations

from broker import connect_flow, publish_flow, subscriptions
from broker.connection import Connection, Flows
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
        Connect: connect_flow.on_connect,
        Auth: connect_flow.on_auth,
        Disconnect: connect_flow.on_disconnect,
        Publish: publish_flow.on_publish,
        PubAck: publish_flow.on_puback,
        PubRec: publish_flow.on_pubrec,
        PubRel: publish_flow.on_pubrel,
        PubComp: publish_flow.on_pubcomp,
        Subscribe: subscriptions.on_subscribe,
        Unsubscribe: subscriptions.on_unsubscribe,
        PingReq: Connection.on_pingreq,
    },
    route_held=publish_flow.route_held,
)
