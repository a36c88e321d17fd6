"""event_relay: placeholder package; built in a later issue (see issues)."""
