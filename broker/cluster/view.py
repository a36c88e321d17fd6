"""This node's routing view of the other nodes' subscribers, fed from the metadata.

The view mirrors every subscriber record that another node owns and keeps the router in
step with it: a non-shared filter becomes one RemoteNode entry per (node, filter), held
while any subscriber of that node has it (counted); a `$share/<group>/<filter>`
subscription makes a RemoteMember of that group. Applying a record is idempotent, so a
full load followed by the changes that happened during it ends in the right state.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.cluster.metadata import Subscriber
from broker.cluster.remote import RemoteMember, RemoteNode
from broker.subscription_trie import SubOptions, SubscriptionTrie, parse_shared

REMOTE = SubOptions(2)  # a RemoteNode takes every QoS: the other node downgrades


class RemoteView:
    def __init__(
        self,
        router: SubscriptionTrie,
        node: str,
        remote_node: Callable[[str], RemoteNode],
        remote_member: Callable[[str, str], RemoteMember],
        forget_member: Callable[[str, str], None],
    ) -> None:
        self.router = router
        self.node = node  # this node: its own records are not part of the view
        self._remote_node = remote_node
        self._remote_member = remote_member
        self._forget_member = forget_member
        self.records: dict[str, Subscriber] = {}
        self._filters: dict[tuple[str, str], int] = {}  # (node, filter) -> subscribers

    def apply(self, client_id: str, record: Subscriber | None) -> None:
        """Another node set (or deleted, None) the record of `client_id`."""
        if record is not None and record.node == self.node:
            record = None  # ours now: this node's sessions route themselves
        old = self.records.pop(client_id, None)
        if record is not None:
            self.records[client_id] = record
        before = _entries(old)
        after = _entries(record)
        for key in before.keys() - after.keys():
            self._remove(client_id, old, key)  # type: ignore[arg-type]
        for key, options in after.items():
            if before.get(key) != options:
                self._add(client_id, record, key, options, key in before)  # type: ignore[arg-type]

    def load(self, records: dict[str, Subscriber]) -> None:
        """Replace the whole view (after a full load of the metadata)."""
        for client_id in list(self.records):
            if client_id not in records:
                self.apply(client_id, None)
        for client_id, record in records.items():
            self.apply(client_id, record)

    def nodes(self) -> set[str]:
        return {record.node for record in self.records.values()}

    def _add(
        self, client_id: str, record: Subscriber, key: tuple[str, str], options, replaced: bool
    ) -> None:
        node, topic_filter = key
        if parse_shared(topic_filter) is not None:
            self.router.subscribe(self._remote_member(node, client_id), topic_filter, options)
            return
        if replaced:
            return  # the node's entry takes every QoS already
        count = self._filters.get(key, 0)
        self._filters[key] = count + 1
        if not count:
            self.router.subscribe(self._remote_node(node), topic_filter, REMOTE)

    def _remove(self, client_id: str, record: Subscriber, key: tuple[str, str]) -> None:
        node, topic_filter = key
        if parse_shared(topic_filter) is not None:
            self.router.unsubscribe(self._remote_member(node, client_id), topic_filter)
            if not any(
                parse_shared(f) is not None and k == node
                for k, f in _entries(self.records.get(client_id))
            ):
                self._forget_member(node, client_id)  # in no group any more
            return
        count = self._filters[key] - 1
        if count:
            self._filters[key] = count
        else:
            del self._filters[key]
            self.router.unsubscribe(self._remote_node(node), topic_filter)


def _entries(record: Subscriber | None) -> dict[tuple[str, str], SubOptions]:
    if record is None:
        return {}
    return {(record.node, f): options for f, options in record.subscriptions.items()}
