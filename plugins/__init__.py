"""plugins: placeholder package; built in a later issue (see issues)."""
