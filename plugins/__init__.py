"""plugins: the built-in plugins, one package each, enabled by `[plugins.<name>]`
(docs/plugins.md); each exports its class as `PLUGIN`.

- `passwd`: users and passwords from a file (VerneMQ's vmq_passwd), `nautilus passwd`;
- `acl`: topic access lists from a file (vmq_acl, with Courier's tokens, labels and
  per-label rate limits);
- `auth_db`: users and ACLs in PostgreSQL, MySQL/MariaDB or Redis (vmq_diversity's auth);
- `auth_jwt`: a JWT in the CONNECT password decides who connects;
- `webhooks`: any hook answered by an HTTP endpoint, with VerneMQ's JSON (vmq_webhooks);
- `bridge`: MQTT bridges to other brokers (VerneMQ's vmq_bridge), built from the
  top-level `[[bridges]]` tables;
- `redis_subs`: the cluster's subscriptions, sessions and retained messages in Redis
  (Courier's way; docs/clustering.md).
"""
