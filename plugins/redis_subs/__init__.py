"""plugins/redis_subs: placeholder package; built in a later issue (see issues)."""
