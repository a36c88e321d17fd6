"""spark_consumers: placeholder package; built in a later issue (see issues)."""
