"""bench/results/: where every benchmark keeps its raw figures, one JSON file a run."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def save_raw(name: str, data: Any) -> Path:
    """Write `data` to bench/results/<name>-<date>-<time>.json and say where."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / time.strftime(f"{name}-%Y%m%d-%H%M%S.json")
    path.write_text(json.dumps(data, indent=1, default=str))
    print(f"raw results: {path}", file=sys.stderr)
    return path
