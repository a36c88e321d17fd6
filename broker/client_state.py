"""ClientState: everything the broker knows about one client connection, in one place.

The client's engine and its packet flows (broker/client/) read and change this state;
sessions and the writer see the client through it (identity for hook contexts, the wire
profile for encoding). Nothing here does I/O.

The phase says which packets are welcome, and moves only forward:

    AWAITING_CONNECT --> AUTHENTICATING --> CONNECTED --> CLOSING
            |                  |                              ^
            +------------------+------------------------------+

AUTHENTICATING runs from CONNECT to CONNACK (the auth plugins, and an MQTT 5 enhanced
authentication exchange, when only AUTH and DISCONNECT may arrive [MQTT-4.12.0-4]);
CLOSING is final (the broker reads and discards while the socket lingers).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.message import Message, TopicAliases
    from broker.protocol import Connect
    from hooks.decisions import DecisionKey, KeptDecision

AWAITING_CONNECT = 0
AUTHENTICATING = 1
CONNECTED = 2
CLOSING = 3
PHASE_NAMES = ("awaiting-connect", "authenticating", "connected", "closing")
_NEXT = {
    AWAITING_CONNECT: frozenset({AUTHENTICATING, CLOSING}),
    AUTHENTICATING: frozenset({CONNECTED, CLOSING}),
    CONNECTED: frozenset({CLOSING}),
    CLOSING: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A bug of ours: the connection tried to go back to an earlier phase."""


class ClientState:
    __slots__ = (
        "aliases_in",
        "aliases_out",
        "attributes",
        "certificate",
        "client_id",
        "decisions",
        "disconnect_reason",
        "identity",
        "keepalive",
        "max_message_rate",
        "max_packet_out",
        "mountpoint",
        "peer",
        "pending_connect",
        "phase",
        "problem_info",
        "protocol_level",
        "session_id",
        "subscriber_id",
        "username",
        "will",
        "will_delay",
    )

    def __init__(self, peer: tuple[str, int] = ("?", 0), max_message_rate: int = 0) -> None:
        self.phase = AWAITING_CONNECT
        # Identity.
        self.peer = peer
        self.client_id = ""  # until CONNECT (or the one the broker assigned)
        # The client's topic tree (its listener's, or a plugin's choice at CONNECT): "" is
        # the default tree; the session is (mountpoint, client id) (docs/operations.md).
        self.mountpoint = ""
        # The session's key, from both, once the client is accepted (broker/mountpoints.py).
        self.subscriber_id = ""
        self.username: str | None = None
        self.attributes: dict[str, Any] = {}  # shared by the plugins for this client
        # TLS: the client's certificate (DER) and, with use_identity_as_username, its CN:
        # the username, authenticated by the certificate.
        self.certificate: bytes | None = None
        self.identity: str | None = None
        # Names this connection in events (a reconnect is a new session id), as Courier's.
        self.session_id = str(uuid.uuid4())
        # Why the connection ended, in Courier's words (the first reason given wins).
        self.disconnect_reason = ""
        # Negotiated at CONNECT.
        self.protocol_level = 4  # until CONNECT says otherwise
        self.keepalive = 0  # seconds; 0: none
        self.max_packet_out = 0  # the MQTT 5 client's Maximum Packet Size; 0: no limit
        self.problem_info = True  # may acknowledgements carry Reason Strings [3.1.2.11.7]
        self.max_message_rate = max_message_rate  # PUBLISHes per second; 0: no limit
        # Topic Aliases: the client's towards us, ours towards the client (if any).
        self.aliases_in: dict[int, str] | None = None  # made at the first alias
        self.aliases_out: TopicAliases | None = None
        # The will, published when the connection ends without a normal DISCONNECT.
        self.will: Message | None = None
        self.will_delay = 0
        # auth_on_publish answers kept while they hold (broker/ingress.py, `recall`): made
        # at the first one, dropped when the client authenticates again.
        self.decisions: dict[DecisionKey, KeptDecision] | None = None
        # (CONNECT, assigned client id) while an enhanced authentication runs.
        self.pending_connect: tuple[Connect, str | None] | None = None

    def __repr__(self) -> str:
        return f"<ClientState {self.client_id!r} {PHASE_NAMES[self.phase]}>"

    def advance(self, phase: int) -> None:
        """Move to `phase`; only forward moves are legal (see the module docstring)."""
        if phase not in _NEXT[self.phase]:
            raise IllegalTransition(f"{PHASE_NAMES[self.phase]} -> {PHASE_NAMES[phase]}")
        self.phase = phase

    def name(self) -> str:
        """How logs name this client: its address, and its client id once known."""
        peer = f"{self.peer[0]}:{self.peer[1]}"
        return f"{peer} ({self.client_id})" if self.client_id else peer
