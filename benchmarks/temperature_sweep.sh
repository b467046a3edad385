#!/usr/bin/env bash
# Sampled decoding (issue 46): each method at gen.temperature 0 (greedy: one seed) and at 0.7 and 1.0 with several
# seeds, vanilla decoded interleaved in every run, one run at a time, each run in its own folder
# (results/runs/temperature/<model>/<method>/<task>-t<T>-s<seed>: runs of one folder must share their settings),
# then the report, whose temperature view pools each method's questions and seeds per temperature. It times: run it
# on a quiet machine, nothing else using the CPU.
#   SEEDS=0,1,2 TEMPERATURES=0.7,1.0 LIMIT=5 MAX_NEW_TOKENS=128 bash benchmarks/temperature_sweep.sh [methods...]
# (default methods: every conf/method/*.yaml but vanilla; extra Hydra overrides go in EXTRA, e.g. EXTRA="model=smollm2_135m_bf16")
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -gt 0 ]; then
  methods=("$@")
else
  mapfile -t methods < <(ls conf/method/*.yaml | xargs -n1 basename | sed 's/\.yaml$//' | grep -vx vanilla)
fi
for method in "${methods[@]}"; do
  # shellcheck disable=SC2016  # ${...} are Hydra's interpolations, resolved in each run
  common=(method="$method" task=all task.limit="${LIMIT:-5}" gen.max_new_tokens="${MAX_NEW_TOKENS:-128}" ${EXTRA:-}
          'out_dir=results/runs/temperature/${model.name}/'"$method"'/${task.name}-t${gen.temperature}-s${seed}')
  python -m bench -m gen.temperature=0 seed=0 "${common[@]}"
  python -m bench -m gen.temperature="${TEMPERATURES:-0.7,1.0}" seed="${SEEDS:-0,1,2}" "${common[@]}"
done
python -m bench.report results/runs/temperature --out report/temperature
