"""plugins/bridge: MQTT bridges to other brokers, VerneMQ's vmq_bridge.

    [[bridges]]
    name = "cloud"
    address = "broker.example.com:1883"
    [[bridges.topics]]
    pattern = "sensors/#"
    direction = "out"

Configured by top-level `[[bridges]]` tables (not [plugins.bridge]). See docs/bridge.md.
"""

from plugins.bridge.plugin import BridgePlugin, BridgesConfig

PLUGIN = BridgePlugin

__all__ = ["PLUGIN", "BridgePlugin", "BridgesConfig"]
