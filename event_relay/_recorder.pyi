# event_relay/_recorder.c: event_relay.recorder.Recorder in C (no sampling rules). What it
# reads of the broker's objects is hooks/recorder.py's Recorded* protocols.
from collections.abc import Callable, Sequence
from typing import Any

from event_relay.log import EventLog
from hooks import MatchedAcl, RecordedClient, RecordedDelivery, RecordedMessage

class Recorder:
    sampled_out: int
    schedule: Callable[[Callable[[], None]], object]
    def __init__(
        self,
        log: EventLog,
        relayed: set[str],
        payloads: str,
        sample: dict[str, dict[str, int]],
        schedule: Callable[[Callable[[], None]], object],
    ) -> None: ...
    def published(
        self, client: RecordedClient, message: RecordedMessage, matched_acl: MatchedAcl | None
    ) -> None: ...
    def delivered(self, session: RecordedClient, delivery: RecordedDelivery) -> None: ...
    def completed(self, session: RecordedClient, delivery: RecordedDelivery) -> None: ...
    def published_run(
        self,
        client: RecordedClient,
        topic: str,
        payloads: Sequence[bytes],
        receivers: Sequence[RecordedClient],
        matched_acl: MatchedAcl | None,
    ) -> None: ...
    def append(self, code: int, values: list[Any]) -> None: ...
    def seal(self) -> None: ...
