"""`nautilus admin retain delete-expired` / `retain/delete-expired`: retained messages
whose MQTT 5 expiry has passed are swept at once, the others kept."""

from __future__ import annotations

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.broker.helpers import V5, PahoClient

from .conftest import api, table
from .test_commands import admin


def test_expired_retained_messages_are_swept_and_the_others_kept(keyed_broker, tmp_path):
    server, key = keyed_broker()
    client = PahoClient(server.host, server.port, V5)
    client.connect()
    short = Properties(PacketTypes.PUBLISH)
    short.MessageExpiryInterval = 1
    client.publish("shelf/short", b"soon gone", qos=1, retain=True, properties=short)
    client.publish("shelf/kept", b"stays", qos=1, retain=True)
    client.close()
    assert len(table(api(server, "retain/show", key))) == 2
    server.advance(2)  # the broker's clock: past the first one's expiry
    swept = admin(server, "--json", "retain", "delete-expired", key=key, cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr
    assert '"deleted": 1' in swept.stdout
    assert server.call(lambda: len(server.broker.retained)) == 1  # swept, not just hidden
    assert [r["topic"] for r in table(api(server, "retain/show", key))] == ["shelf/kept"]
    assert table(api(server, "retain/delete-expired", key)) == [{"deleted": 0}]
