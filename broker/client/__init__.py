"""The per-client layer: what the broker knows about one client connection, apart from
its socket (broker/connection.py is the asyncio shell around it)."""

from broker.client.state import AUTHENTICATING, AWAITING_CONNECT, CLOSING, CONNECTED, ClientState

__all__ = ["AUTHENTICATING", "AWAITING_CONNECT", "CLOSING", "CONNECTED", "ClientState"]
