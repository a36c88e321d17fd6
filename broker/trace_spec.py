"""What an operator asks to trace (`nautilus admin trace client`): a value that the admin
API, the tracer (broker/trace/) and the other nodes of a cluster (broker/peers.py) pass
on; it knows nothing of them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """What `nautilus admin trace client` asks for (VerneMQ's options and defaults)."""

    client_id: str
    mountpoint: str = ""
    rate_max: int = 10  # lines ...
    rate_interval: int = 100  # ... per this many milliseconds, at most
    trunc_payload: int = 200  # payload bytes shown

    def problem(self) -> str | None:
        """What is wrong with these options, or None."""
        if not self.client_id:
            return "client_id is required"
        if self.rate_max < 1 or self.rate_interval < 1:
            return "rate_max and rate_interval must be at least 1"
        if self.trunc_payload < 0:
            return "trunc_payload must not be negative"
        return None

    @property
    def key(self) -> tuple[str, str]:
        """The session it follows: (mountpoint, client id)."""
        return (self.mountpoint, self.client_id)
