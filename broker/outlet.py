"""The outlet: what a session sees of its client's connection.

Sessions write deliveries through this narrow interface and never import the connection,
so the session layer can be driven by a fake outlet in unit tests, and the connection is
free to change how it writes (batching, back-pressure, transports other than TCP).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from broker.message import TopicAliases
    from broker.protocol import Packet


class Outlet(Protocol):
    # Identity, for the hook contexts of deliveries.
    client_id: str | None
    username: str | None
    attributes: dict[str, Any]
    # The client's wire profile.
    protocol_level: int
    aliases_out: TopicAliases | None  # MQTT 5 Topic Aliases towards the client, if any
    max_packet_out: int  # the client's Maximum Packet Size; 0: no limit
    # Room: False while the connection's buffers are full; resume_writing() drains.
    writable: bool

    def write(self, data: bytes) -> None:
        """Queue encoded bytes; they are flushed once per event-loop turn."""

    def send(self, packet: Packet) -> None:
        """Encode and write a control packet."""
