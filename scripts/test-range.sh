#!/usr/bin/env bash
# make test-latest / make test-lowest: a venv of its own, Nautilus installed (editable) with
# the versions PIP-ARGS pick, the versions printed, then the whole pytest suite.
# usage: scripts/test-range.sh VENV PIP-ARGS...
#   make test-latest:  scripts/test-range.sh .venv-latest --upgrade
#   make test-lowest:  scripts/test-range.sh .venv-lowest -c requirements/lowest.txt
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$1
shift
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/pip" install -q "$@" -e '.[test,bench,spark,db]' >"$venv/install.log" 2>&1 ||
    { grep -v '^WARNING: Location' "$venv/install.log"; exit 1; }
"$venv/bin/pip" check
echo "$venv: $("$venv/bin/pip" freeze --exclude-editable | grep -iE \
    '^(aiohttp|msgpack|plyvel|protobuf|proxy-protocol|pyjwt|redis|uvloop|websockets|pyspark|pyarrow|pytest|hypothesis|paho-mqtt)==' |
    tr '\n' ' ')"
"$venv/bin/python" -m pytest -q ${PYTEST_ARGS:-}
