"""The outlet: what a session sees of its client's connection (broker/writer.py's Writer).

Sessions write deliveries through this narrow interface and never import the connection,
so the session layer can be driven by a fake outlet in unit tests, and the writer is free
to change how it writes (batching, back-pressure, transports other than TCP).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.client_state import ClientState
    from broker.protocol import Packet


class Outlet(Protocol):
    # The client: its identity (for the hook contexts of deliveries) and its wire profile
    # (protocol level, Topic Aliases towards it, its Maximum Packet Size).
    client: ClientState
    # Room: False while the connection's buffers are full; resume_writing() drains.
    writable: bool

    def write(self, data: bytes) -> None:
        """Queue encoded bytes; they are flushed once per event-loop turn."""

    def send(self, packet: Packet) -> None:
        """Encode and write a control packet."""

    def take_over(self) -> None:
        """A new connection claimed this client id: close, and release the session now."""
