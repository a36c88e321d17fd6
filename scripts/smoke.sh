#!/usr/bin/env bash
# The package as a user gets it (make smoke, part of make test; make test-latest and
# test-lowest too): builds the sdist and the wheel, checks the sdist holds what a build
# needs, installs the wheel (not editable, with the spark extra) into a clean venv, then
# runs scripts/smoke_installed.py with that venv's Python from outside the checkout, so
# nothing is imported from the source tree.
#
# usage: scripts/smoke.sh PYTHON [PIP-ARGS...]
#   PYTHON    an interpreter with `build` and `trustme` (the dev venv's)
#   PIP-ARGS  how to pick the dependencies' versions: `-c requirements/lock.txt`, `--upgrade`
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
python=$1
shift

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "smoke: building the sdist and the wheel"
"$python" -m build --sdist --wheel --outdir "$work/dist" . >"$work/build.log" 2>&1 ||
    { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/*.whl)
sdist=$(ls "$work"/dist/*.tar.gz)

# The sdist must build on its own: the C sources, the metadata, the data files.
listing=$(tar tzf "$sdist")
for needed in event_relay/_recorder.c broker/protocol/_speedups.c setup.cfg setup.py pyproject.toml \
    broker/http/status.html plugins/redis_subs/ event_relay/sidecar_pb/on_publish_pb2.py; do
    grep -q "/$needed" <<<"$listing" || { echo "smoke: the sdist lacks $needed" >&2; exit 1; }
done
# testing/ (the real servers the tests and the benchmarks start) is shipped in neither.
if grep -qE '(^|/)testing/' <<<"$listing"$'\n'"$("$python" -m zipfile -l "$wheel")"; then
    echo "smoke: testing/ is in the sdist or the wheel (setup.cfg's packages leave it out)" >&2
    exit 1
fi

# Without a C compiler the sdist still builds: a wheel of the pure-Python twins (whose
# behaviour the tests check with NAUTILUS_NO_SPEEDUPS=1).
echo "smoke: building the sdist without a C compiler"
CC=/bin/false "$python" -m pip wheel -q --no-deps -w "$work/pure" "$sdist" >"$work/pure.log" 2>&1 ||
    { cat "$work/pure.log"; exit 1; }
"$python" - "$work"/pure/*.whl <<'EOF' || exit 1
import sys
import zipfile

compiled = [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith(".so")]
if compiled:
    sys.exit(f"smoke: a wheel built without a C compiler holds compiled code: {compiled}")
EOF

echo "smoke: installing $(basename "$wheel") into a clean venv"
"${PYTHON:-python3}" -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$@" "$wheel[spark]" >"$work/install.log" 2>&1 ||
    { grep -v '^WARNING: Location' "$work/install.log"; exit 1; }

# Certificates for the TLS listener, made with the dev venv's trustme.
"$python" - "$work" <<'EOF'
import sys

import trustme

ca = trustme.CA()
cert = ca.issue_cert("127.0.0.1", "localhost")
cert.private_key_and_cert_chain_pem.write_to_path(f"{sys.argv[1]}/server.pem")
ca.cert_pem.write_to_path(f"{sys.argv[1]}/ca.pem")
EOF

cd "$work"
"$work/venv/bin/python" "$repo/scripts/smoke_installed.py" "$work"
