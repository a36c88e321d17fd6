"""Nautilus benchmarks: a raw-socket MQTT load generator and side-by-side broker runs.

`python -m bench.compare` runs every scenario against Nautilus, Mosquitto and amqtt, one
broker at a time, and writes the table in docs/performance.md. See bench/README.md.
"""
