"""Real servers for the tests and the benchmarks: Redis and Sentinel, PostgreSQL and
MariaDB, Mosquitto, carbon-cache. Each runs as a child process on 127.0.0.1, on an
ephemeral port, in a directory of the caller's, and shares one life cycle
(testing/lifecycle.py). Not shipped: setup.cfg's package list leaves it out.

Nothing here imports pytest. A binary that is not installed raises `Missing`, naming the
package to install: tests/conftest.py turns it into a skip, a benchmark into a one-line
error.
"""
