"""The per-client engine: one client's MQTT without I/O (engine.py) and the packet flows
it runs (connect.py, publish.py, subscribe.py; flows.py says which handles each packet).
The client's state is broker/client_state.py; its asyncio shell is broker/connection.py."""
