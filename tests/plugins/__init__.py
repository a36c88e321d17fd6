"""Plugin tests, one package per plugin."""
