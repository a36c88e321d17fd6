"""Broker counters, named as VerneMQ names its metrics (see docs/operations.md).

Plain integer attributes: incrementing one is the cheapest thing Python can do on the hot
path. Readers (the $SYS tree and /metrics of later issues, tests) call `snapshot()`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class Metrics:
    socket_open: int = 0
    socket_close: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    mqtt_connect_received: int = 0
    mqtt_connack_sent: int = 0
    # Every CONNACK by its MQTT 3 return code (an MQTT 5 reason counts under the code an
    # MQTT 3 client would get): VerneMQ's names.
    mqtt_connack_accepted_sent: int = 0
    mqtt_connack_unacceptable_protocol_sent: int = 0
    mqtt_connack_identifier_rejected_sent: int = 0
    mqtt_connack_server_unavailable_sent: int = 0
    mqtt_connack_bad_credentials_sent: int = 0
    mqtt_connack_not_authorized_sent: int = 0
    mqtt_publish_received: int = 0
    mqtt_publish_sent: int = 0
    mqtt_puback_received: int = 0
    mqtt_puback_sent: int = 0
    mqtt_pubrec_received: int = 0
    mqtt_pubrec_sent: int = 0
    mqtt_pubrel_received: int = 0
    mqtt_pubrel_sent: int = 0
    mqtt_pubcomp_received: int = 0
    mqtt_pubcomp_sent: int = 0
    mqtt_subscribe_received: int = 0
    mqtt_suback_sent: int = 0
    mqtt_unsubscribe_received: int = 0
    mqtt_unsuback_sent: int = 0
    mqtt_pingreq_received: int = 0
    mqtt_pingresp_sent: int = 0
    mqtt_disconnect_received: int = 0
    mqtt_disconnect_sent: int = 0
    mqtt_invalid_msg_size_error: int = 0
    mqtt_protocol_error: int = 0  # malformed or illegal packets; the connection is closed
    client_keepalive_expired: int = 0
    client_publish_throttled: int = 0  # times max_message_rate paused a publisher
    client_turns_yielded: int = 0  # times a client's packets waited for the next loop turn
    topic_depth_exceeded: int = 0  # topics or filters deeper than topic_max_depth
    subscription_limit_exceeded: int = 0  # max_subscriptions_per_client refusals
    listener_connections_refused: int = 0  # over a listener's max_connections
    queue_message_in: int = 0
    queue_message_out: int = 0
    queue_message_drop: int = 0
    queue_message_expired: int = 0  # MQTT 5 messages whose expiry passed while queued
    queue_message_retried: int = 0  # resent to MQTT 3 clients after retry_interval
    queue_message_unhandled: int = 0  # QoS 0 messages for an offline session
    store_publish_refused: int = 0  # QoS 1/2 PUBLISHes refused while the store cannot write
    flow_publisher_held: int = 0  # times a publisher stopped being read for a full queue
    flow_slow_subscribers: int = 0  # subscribers found stuck (slow_subscriber_timeout)
    # Routing: subscribers a publish matched on this node, and other nodes it was
    # forwarded to (one per node): the routing score of docs/clustering.md.
    router_matches_local: int = 0
    router_matches_remote: int = 0
    # The cluster channel (docs/clustering.md).
    cluster_bytes_sent: int = 0
    cluster_bytes_received: int = 0
    cluster_bytes_dropped: int = 0  # frames a full or closed link could not take
    cluster_frames_invalid: int = 0  # links closed for a malformed frame
    cluster_enqueue_dropped: int = 0  # messages for a session no longer on this node
    cluster_messages_dropped: int = 0  # QoS 1/2 messages for another node, not kept
    cluster_messages_resent: int = 0  # sent again on a new link, not yet acknowledged
    cluster_messages_duplicate: int = 0  # received again, queued already: dropped
    # Messages only a node's memory held when it went without stopping (losses.py),
    # counted on one survivor.
    cluster_messages_lost_with_node: int = 0
    cluster_sessions_migrated: int = 0  # sessions whose queue moved to another node
    cluster_messages_migrated: int = 0
    cluster_sessions_reaped: int = 0  # persistent sessions taken from dead nodes
    cluster_registrations_refused: int = 0  # CONNECTs refused while the metadata was away
    netsplit_detected: int = 0  # a peer was declared dead
    netsplit_resolved: int = 0  # a dead peer came back
    netsplit_refused: int = 0  # CONNECTs, PUBLISHes, (UN)SUBSCRIBEs refused in a netsplit
    gc_collections: int = 0  # passes of the cyclic garbage collector (broker/collector.py)

    def connack_sent(self, return_code: int) -> None:
        """Count a CONNACK; `return_code` is the MQTT 3 one (0..5)."""
        self.mqtt_connack_sent += 1
        name = _CONNACK_COUNTERS[return_code]
        setattr(self, name, getattr(self, name) + 1)

    def snapshot(self) -> dict[str, int]:
        return asdict(self)

    def reset(self) -> None:
        """Every counter back to 0 (the admin API's metrics reset)."""
        for name in self.__dataclass_fields__:
            setattr(self, name, 0)


_CONNACK_COUNTERS = (
    "mqtt_connack_accepted_sent",
    "mqtt_connack_unacceptable_protocol_sent",
    "mqtt_connack_identifier_rejected_sent",
    "mqtt_connack_server_unavailable_sent",
    "mqtt_connack_bad_credentials_sent",
    "mqtt_connack_not_authorized_sent",
)
