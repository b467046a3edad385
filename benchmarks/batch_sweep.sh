#!/usr/bin/env bash
# The batched-decoding issue's measurement: vanilla, then each method always speculating and with
# method.sizing=auto, at gen.batch_size 1, 2, 4, 8 (vanilla interleaved at the same batch size in every
# run), one run at a time, then the report (throughput speedup vs batch size). Run it on a quiet machine: nothing
# else may use the CPU while it times.
#   BATCH_SIZES=1,2,4,8 bash benchmarks/batch_sweep.sh [methods...]     (default: pld eagle2)
set -euo pipefail
cd "$(dirname "$0")/.."
methods=("${@:-pld eagle2}")
sizes="${BATCH_SIZES:-1,2,4,8}"
common=(task=all task.limit=5 gen.max_new_tokens=128)
for size in ${sizes//,/ }; do  # the planner's profiles, one per batch size (reused when they exist)
  python -m bench.profile gen.batch_size="$size" "profile.lengths=[1,2,4,8,16,32,64]"
done
for method in ${methods[@]}; do
  python -m bench -m method="$method" gen.batch_size="$sizes" "${common[@]}"
  python -m bench -m method="$method" method.sizing=auto gen.batch_size="$sizes" "${common[@]}"
done
python -m bench.report results/runs --out report/batch_sweep
