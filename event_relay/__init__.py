"""event_relay: every broker event, streamed to consumers over TCP (docs/event-relay.md).

A plugin (`plugin.py`, with `recorder.py` and its C twin `_recorder.c` for the
per-message events) appends each event under a gap-free sequence number to the log
(`log.py`: newest in memory, older in the LevelDB spool, `spool.py`); the TCP server
(`server.py`) lets consumers replay from a sequence number, commit, and read ranges, over
the frames of `frames.py` with the events of `schema.py`. `sidecar.py` pushes the same
events to a sidecar written for Courier, as its protobuf messages (`sidecar_pb/`).
`client.py` is the asyncio client, `cli.py` is `nautilus events`, `config.py` the
`[event_relay]` keys.
"""
