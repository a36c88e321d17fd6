"""Nautilus: an MQTT 3.1 / 3.1.1 / 5.0 broker in the image of VerneMQ."""

__version__ = "0.1.0"
