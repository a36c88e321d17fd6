"""The compiled parts, each optional: without a C compiler the build goes on and the
pure-Python twin is used. event_relay/_recorder.c, the relay's message recorder
(event_relay/recorder.py; docs/event-relay.md, "What it costs"); broker/protocol/_speedups.c,
the decoder's hot path (broker/protocol/_decoder.py; docs/performance.md). Everything else
is in setup.cfg."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("event_relay._recorder", ["event_relay/_recorder.c"], optional=True),
        Extension("broker.protocol._speedups", ["broker/protocol/_speedups.c"], optional=True),
    ]
)
