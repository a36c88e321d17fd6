"""The one compiled part: event_relay/_recorder.c (the relay's message recorder in C).
Optional: without a C compiler the build goes on and event_relay/recorder.py is used
(docs/event-relay.md, "What it costs"). Everything else is in setup.cfg."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("event_relay._recorder", ["event_relay/_recorder.c"], optional=True),
    ]
)
