#!/usr/bin/env bash
# Run tests N times in a row while another process keeps one core busy, to find the tests
# that depend on timing. Stops at the first failing run.
#
#   scripts/repeat-tests.sh N PATH...      e.g. scripts/repeat-tests.sh 20 tests/cluster tests/store
#
# Each run is `.venv/bin/python -m pytest -q -x -p no:randomly PATH...` (in the repository's
# root), its output kept in a log file of its own; one summary line is printed per run. The
# busy loop is pinned to core 0 with taskset where there is one, and is killed on exit.
# REPEAT_LOG_DIR chooses where the logs go (default: a new directory under /tmp);
# REPEAT_PYTHON the interpreter (default: .venv/bin/python; a git worktree has no .venv of
# its own, so give it the main checkout's). The tests run this tree's code, also in the
# brokers they start as subprocesses: PYTHONPATH names it, since an editable install of
# the package may point at another checkout.
set -u

usage() {
    echo "usage: $0 N PATH...  (N runs of pytest over PATH... with one core kept busy)" >&2
    exit 2
}
[ $# -ge 2 ] || usage
runs=$1
shift
case $runs in '' | *[!0-9]* | 0) usage ;; esac

cd "$(dirname "$0")/.." || exit 2
python=${REPEAT_PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -x "$python" ] || { echo "$0: no $python (make test creates it)" >&2; exit 2; }
logs=${REPEAT_LOG_DIR:-$(mktemp -d /tmp/repeat-tests.XXXXXX)}
mkdir -p "$logs" || exit 2

hog=
run_pid=
cleanup() {
    if [ -n "$run_pid" ]; then  # interrupted: pytest tears its fixtures down on SIGINT
        kill -INT "$run_pid" 2>/dev/null
        wait "$run_pid" 2>/dev/null
    fi
    if [ -n "$hog" ]; then
        kill "$hog" 2>/dev/null
        wait "$hog" 2>/dev/null
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if command -v taskset >/dev/null; then
    taskset -c 0 "$python" -c 'while True: pass' &
    where="core 0"
else
    "$python" -c 'while True: pass' &
    where="any core (no taskset)"
fi
hog=$!

command=("$python" -m pytest -q -x -p no:randomly "$@")
echo "repeat-tests: ${command[*]}, $runs runs; busy loop (pid $hog) on $where; logs in $logs"
total=0
slowest=0
fastest=
for ((run = 1; run <= runs; run++)); do
    log=$logs/run-$run.log
    started=$(date +%s)
    "${command[@]}" >"$log" 2>&1 &  # waited for so that a signal is handled at once
    run_pid=$!
    wait "$run_pid"
    status=$?
    run_pid=
    took=$(($(date +%s) - started))
    total=$((total + took))
    if ((took > slowest)); then slowest=$took; fi
    if [ -z "$fastest" ] || ((took < fastest)); then fastest=$took; fi
    # pytest's last line: "245 passed, 3 skipped in 310.12s (0:05:10)"
    outcome=$(grep -E '^[=]* ?[0-9]+ (passed|failed|error)' "$log" | tail -n 1 | tr -d '=')
    outcome=${outcome# }
    if [ "$status" -eq 0 ]; then
        echo "run $run/$runs: ok in ${took}s (${outcome:-no summary})"
        continue
    fi
    echo "run $run/$runs: FAILED (exit $status) in ${took}s (${outcome:-no summary}); log: $log"
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
    echo "repeat-tests: stopped at run $run of $runs after ${total}s"
    exit 1
done
echo "repeat-tests: $runs of $runs runs passed in ${total}s (fastest ${fastest}s, slowest ${slowest}s)"
