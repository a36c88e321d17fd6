"""plugins/auth_jwt: placeholder package; built in a later issue (see issues)."""
