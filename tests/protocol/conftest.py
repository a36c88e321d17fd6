"""Every codec test runs twice: with the compiled hot path (broker/protocol/_speedups.c)
and with the pure-Python twins it falls back to, which must decode and refuse alike."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.protocol import _compiled

BUILT = pytest.mark.skipif(not _compiled.BUILT, reason="_speedups.c was not built")


@pytest.fixture(autouse=True, params=[pytest.param("compiled", marks=BUILT), "python"])
def codec_implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    was = _compiled.hot.decode_run is not None
    _compiled.use_compiled(request.param == "compiled")
    yield request.param
    _compiled.use_compiled(was)
