"""A listener's `max_connections`, MQTT's and HTTP's alike, and the episodes of it being
reached (broker/episodes.py): one line when it starts refusing, one when the connections
open are back to 90% of it.
"""

from __future__ import annotations

import logging

from broker.clock import Clock
from broker.episodes import Episode


class ConnectionCap:
    """A listener's `max_connections`, and the episodes of it being reached.

    The first refusal of an episode is logged with the numbers, the others are counted;
    the episode ends, in one more line, when the connections open are down to 90% of the
    cap, not at the first free slot: a count that sways at the cap does not log every
    refusal. The caller counts the connections open."""

    def __init__(self, logger: logging.Logger, name: str, limit: int, clock: Clock) -> None:
        self.name = name  # in the lines: "http", "listeners[0] (tcp on 0.0.0.0:1883)"
        self.limit = limit  # 0: none
        self.full = Episode(logger, "connections refused", clock, end_level=logging.INFO)

    def admits(self, open_now: int) -> bool:
        """Whether a new connection fits beside the `open_now` others."""
        if not self.limit or open_now < self.limit:
            return True
        self.full.occurred(
            "%s: %d connections open, max_connections %d: refusing new ones",
            self.name,
            open_now,
            self.limit,
        )
        return False

    def closed(self, open_now: int) -> None:
        """A connection it admitted closed, leaving `open_now` others."""
        if self.full.active and open_now <= self.limit * 9 // 10:
            self.full.ended("%s: accepting again, %d open", self.name, open_now)
