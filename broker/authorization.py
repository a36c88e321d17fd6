"""What auth hook results mean for the protocol: reason codes and applied modifiers.

Pure functions, no I/O: the connection runs the chains (hooks.dispatch) and asks here what
to answer. The rules are VerneMQ's (vmq_mqtt_fsm / vmq_mqtt5_fsm), see docs/plugins.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.protocol import MQTT5, Property, ReasonCode
from hooks import Error, Ok, PublishContext, Result, TopicRequest

# Reasons that mean "these credentials are wrong" rather than "you may not".
_BAD_CREDENTIALS = {"invalid_credentials", "bad_username_or_password", "invalid_signature"}
_ACK_PROPERTIES = (Property.REASON_STRING, Property.USER_PROPERTY)


def register_refusal(result: Result) -> int:
    """The MQTT 5 reason code for a refused CONNECT (mapped to 4 or 5 for MQTT 3)."""
    if isinstance(result, Error) and result.reason_code is not None:
        return result.reason_code
    if isinstance(result, Error) and result.reason in _BAD_CREDENTIALS:
        return ReasonCode.BAD_USER_NAME_OR_PASSWORD
    return ReasonCode.NOT_AUTHORIZED


def refusal_reason(result: Result) -> str:
    """A one-word reason for logs and on_register_failed."""
    return result.reason if isinstance(result, Error) else "not_authorized"


def ack_properties(properties: Mapping[int, Any]) -> dict[int, Any]:
    """What a plugin may add to an acknowledgement: a Reason String and User Properties."""
    return {key: properties[key] for key in _ACK_PROPERTIES if key in properties}


def refusal_properties(result: Result) -> dict[int, Any]:
    """The MQTT 5 properties of a refusal: the plugin's reason as Reason String, and the
    User Properties its Error carries."""
    props: dict[int, Any] = {Property.REASON_STRING: refusal_reason(result)}
    if isinstance(result, Error):
        props.update(ack_properties(result.properties))
    return props


def publish_refusal(result: Result) -> int:
    """The MQTT 5 PUBACK/PUBREC reason code for a refused PUBLISH."""
    if isinstance(result, Error) and result.reason_code is not None:
        return result.reason_code
    return ReasonCode.NOT_AUTHORIZED


def apply_publish_modifiers(context: PublishContext, result: Ok) -> bool:
    """Rewrite the message as the plugin asked; True if the message changed (the ACL rule
    that allowed it, `matched_acl`, is noted in the context but changes no message)."""
    modifiers = result.modifiers
    if not modifiers:
        return False
    changed = False
    for key in ("topic", "payload", "qos", "retain", "mountpoint"):
        if key in modifiers:
            setattr(context, key, modifiers[key])
            changed = True
    if "properties" in modifiers:
        context.properties = dict(modifiers["properties"])
        changed = True
    if "matched_acl" in modifiers:
        context.matched_acl = modifiers["matched_acl"]
    return changed


def granted_topics(
    requested: list[TopicRequest], result: Result, protocol_level: int
) -> list[tuple[TopicRequest, int]]:
    """Each requested topic with the QoS granted, or its SUBACK failure code.

    Ok keeps the request or, with a `topics` modifier [(filter, qos or code)] (one entry per
    requested topic, in order), rewrites it; a code above 2 refuses that topic (VerneMQ's
    128). Error or an exhausted chain refuses every topic (MQTT 5: 0x87 or the Error's
    reason code; MQTT 3: 0x80).
    """
    refused = 0x80 if protocol_level < MQTT5 else publish_refusal(result)
    if not isinstance(result, Ok):
        return [(topic, refused) for topic in requested]
    rewritten = result.modifiers.get("topics")
    if rewritten is None:
        return [(topic, topic.qos) for topic in requested]
    if len(rewritten) != len(requested):
        return [(topic, refused) for topic in requested]  # not a rewrite we can apply
    granted = []
    for original, (topic_filter, qos) in zip(requested, rewritten, strict=True):
        request = TopicRequest(
            topic=topic_filter,
            qos=min(qos, 2),
            no_local=original.no_local,
            retain_as_published=original.retain_as_published,
            retain_handling=original.retain_handling,
            matched_acl=original.matched_acl,
        )
        code = qos if qos <= 2 else (0x80 if protocol_level < MQTT5 else qos)
        granted.append((request, code))
    return granted


def subscriber_pair(value: Any) -> tuple[str, str]:
    """(mountpoint, client id) of auth_on_register's `subscriber_id` modifier: VerneMQ's
    {mountpoint, client_id}, as a mapping or a pair (hooks/spec.py checked its shape)."""
    if isinstance(value, Mapping):
        return value["mountpoint"], value["client_id"]
    return value[0], value[1]


def session_limits(modifiers: dict[str, Any]) -> dict[str, Any]:
    """The auth_on_register modifiers that change this session's settings."""
    names = (
        "max_inflight_messages",
        "max_online_messages",
        "max_offline_messages",
        "queue_type",
        "retry_interval",
        "shared_subscription_policy",
    )
    return {name: modifiers[name] for name in names if name in modifiers}
