"""Server Wide Clocks: leaderless replication of the cluster's metadata, without I/O.

clock.py (dots, node clocks), dcc.py (the object kept per key), watermark.py (what every
peer is known to hold), replica.py (one group's replica: writes, broadcasts received,
anti-entropy, GC). VerneMQ's vmq_swc design, rebuilt in Python (docs/clustering.md).
"""
