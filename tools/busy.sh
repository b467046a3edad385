#!/usr/bin/env bash
# Runs a command while other work keeps every core busy, as on a laptop with a browser open or a shared CI runner:
# one spinning Python process per core (HOGS=N to choose), stopped when the command ends. Prints the command's
# wall time and exits with its status.
#   bash tools/busy.sh                      # README's test command: python -m pytest -q
#   HOGS=2 bash tools/busy.sh python -m pytest -q -m "not real_model"
set -uo pipefail
hogs=${HOGS:-$(OMP_NUM_THREADS= nproc)}  # cores, whatever OMP_NUM_THREADS says
[ $# -gt 0 ] || set -- python -m pytest -q
pids=()
for _ in $(seq "$hogs"); do
    python -c "while True: pass" &
    pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
echo "busy.sh: $hogs spinning processes beside: $*" >&2
start=$(date +%s)
"$@"
status=$?
echo "busy.sh: exit $status after $(( $(date +%s) - start )) s beside $hogs spinning processes" >&2
exit $status
