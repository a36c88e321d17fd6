"""Courier's eventssidecar.v1 messages, generated from event_relay/sidecar_proto/ by
scripts/gen-sidecar-proto.sh. Do not edit the *_pb2 modules by hand."""
