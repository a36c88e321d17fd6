"""Interoperability with amqtt's asyncio client (MQTT 3.1.1).

pytest-asyncio is not a project dependency, so each test runs its coroutine with
asyncio.run on the test thread; the broker has its own loop in its own thread.
"""

from __future__ import annotations

import asyncio

import pytest
from amqtt.client import MQTTClient

from .helpers import TIMEOUT, V5, unique_id


def amqtt_client(client_id: str | None = None, **config) -> MQTTClient:
    config = {"auto_reconnect": False, "keep_alive": 30, "plugins": {}, **config}
    return MQTTClient(client_id=client_id or unique_id("amqtt"), config=config)


def url(server) -> str:
    return f"mqtt://{server.host}:{server.port}/"


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_amqtt_publish_and_receive(broker, qos):
    async def scenario():
        sub, pub = amqtt_client(), amqtt_client()
        assert await sub.connect(url(broker)) == 0
        await pub.connect(url(broker))
        assert await sub.subscribe([("amqtt/#", qos)]) == [qos]
        await pub.publish("amqtt/t", b"hello", qos=qos)
        msg = await sub.deliver_message(timeout_duration=TIMEOUT)
        assert (msg.topic, bytes(msg.data), msg.qos) == ("amqtt/t", b"hello", qos)
        await pub.disconnect()
        await sub.disconnect()

    asyncio.run(scenario())


def test_amqtt_to_paho_and_back(broker, paho_client):
    paho = paho_client(broker, V5)
    paho.subscribe("x/to-paho", 2)

    async def scenario():
        client = amqtt_client()
        await client.connect(url(broker))
        await client.subscribe([("x/to-amqtt", 2)])
        await client.publish("x/to-paho", b"from amqtt", qos=2)
        # paho's blocking publish would block this loop: run it in a thread.
        await asyncio.to_thread(paho.publish, "x/to-amqtt", b"from paho", 1)
        msg = await client.deliver_message(timeout_duration=TIMEOUT)
        assert (msg.topic, bytes(msg.data), msg.qos) == ("x/to-amqtt", b"from paho", 1)
        await client.disconnect()

    asyncio.run(scenario())
    msg = paho.expect_message()
    assert (msg.payload, msg.qos) == (b"from amqtt", 2)


def test_amqtt_retained_message(broker):
    async def scenario():
        pub = amqtt_client()
        await pub.connect(url(broker))
        await pub.publish("amqtt/ret", b"kept", qos=1, retain=True)
        await pub.disconnect()
        sub = amqtt_client()
        await sub.connect(url(broker))
        await sub.subscribe([("amqtt/ret", 1)])
        msg = await sub.deliver_message(timeout_duration=TIMEOUT)
        assert (bytes(msg.data), msg.retain) == (b"kept", True)
        await sub.disconnect()

    asyncio.run(scenario())


def test_amqtt_persistent_session(broker):
    client_id = unique_id("amqtt-persist")

    async def scenario():
        sub = amqtt_client(client_id)
        await sub.connect(url(broker), cleansession=False)
        await sub.subscribe([("amqtt/offline", 1)])
        await sub.disconnect()
        pub = amqtt_client()
        await pub.connect(url(broker))
        await pub.publish("amqtt/offline", b"while away", qos=1)
        await pub.disconnect()
        again = amqtt_client(client_id)
        await again.connect(url(broker), cleansession=False)
        msg = await again.deliver_message(timeout_duration=TIMEOUT)
        assert bytes(msg.data) == b"while away"
        await again.disconnect()

    asyncio.run(scenario())


def test_amqtt_unsubscribe(broker):
    async def scenario():
        client = amqtt_client()
        await client.connect(url(broker))
        await client.subscribe([("amqtt/u", 1), ("amqtt/end", 1)])
        await client.unsubscribe(["amqtt/u"])
        await client.publish("amqtt/u", b"unwanted", qos=1)
        await client.publish("amqtt/end", b"end", qos=1)
        msg = await client.deliver_message(timeout_duration=TIMEOUT)
        assert msg.topic == "amqtt/end"
        await client.disconnect()

    asyncio.run(scenario())
