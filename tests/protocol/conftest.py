"""Every codec test runs twice: with the compiled decoder (broker/protocol/_speedups.c)
and with the pure-Python one it falls back to, which must decode and refuse alike."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.protocol import _decoder

BUILT = pytest.mark.skipif(_decoder.COMPILED is None, reason="_speedups.c was not built")


@pytest.fixture(autouse=True, params=[pytest.param("compiled", marks=BUILT), "python"])
def decoder_implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    saved = _decoder.decode_run
    _decoder.use_compiled(request.param == "compiled")
    yield request.param
    _decoder.decode_run = saved
