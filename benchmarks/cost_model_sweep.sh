#!/usr/bin/env bash
# The cost-model issue's measurement: every method on `task=all task.limit=5 gen.max_new_tokens=128`, with its
# upstream setting and with method.sizing=auto, one run at a time, then the report (measured vs predicted speedup,
# time shares). Run it on a quiet machine: nothing else may use the CPU while it times.
#   bash benchmarks/cost_model_sweep.sh [methods...]     (default: every method)
set -euo pipefail
cd "$(dirname "$0")/.."
methods=("${@:-lookahead rest pld sps medusa eagle eagle2 hydra}")
common=(task=all task.limit=5 gen.max_new_tokens=128)
python -m bench.profile                                  # reused when it exists for this setting
for method in ${methods[@]}; do
  python -m bench method="$method" "${common[@]}"
  python -m bench method="$method" method.sizing=auto "${common[@]}"
done
python -m bench.report results/runs --out report/cost_model
