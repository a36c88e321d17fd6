# event_relay/_recorder.c: event_relay.recorder.Recorder in C (no sampling rules).
from collections.abc import Callable
from typing import Any

from event_relay.log import EventLog
from hooks import MatchedAcl

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
    def published(self, client: Any, message: Any, matched_acl: MatchedAcl | None) -> None: ...
    def delivered(self, session: Any, delivery: Any) -> None: ...
    def completed(self, session: Any, delivery: Any) -> None: ...
    def append(self, code: int, values: list[Any]) -> None: ...
    def seal(self) -> None: ...
