#!/usr/bin/env bash
# Regenerate event_relay/sidecar_pb/ (the Python modules of Courier's eventssidecar.v1
# messages) from event_relay/sidecar_proto/*.proto. Needs grpcio-tools: pip install -e '.[proto]'.
# protoc writes `import matched_acl_pb2 as ...` between the generated modules, which only
# works with the folder on sys.path; the sed turns those into package-relative imports.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
OUT=event_relay/sidecar_pb

rm -f "$OUT"/*_pb2.py "$OUT"/*_pb2.pyi
"$PYTHON" -m grpc_tools.protoc -I event_relay/sidecar_proto \
    --python_out="$OUT" --pyi_out="$OUT" event_relay/sidecar_proto/*.proto
sed -i -E 's/^import ([a-z0-9_]+_pb2) as /from . import \1 as /; s/^from ([a-z0-9_]+_pb2) import /from .\1 import /' \
    "$OUT"/*_pb2.py "$OUT"/*_pb2.pyi
