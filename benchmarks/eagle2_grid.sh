#!/usr/bin/env bash
# The CPU-sized EAGLE-2 tree, chosen by measurement: a small grid of total_token/depth/top_k (the tree as upstream
# builds it: the root's top_k children, then depth expansions; total_token tokens verified a step), each run with its
# interleaved vanilla baseline, one run at a time, then one table. Run it on a quiet machine: nothing else may use
# the CPU while it times.
#   bash benchmarks/eagle2_grid.sh [total/depth/top_k ...]   (default: the grid below)
set -euo pipefail
cd "$(dirname "$0")/.."
grid=("${@:-6/2/2 8/2/2 8/3/2 8/4/2 12/3/3 16/4/4}")
out=${OUT:-results/eagle2_grid}
for shape in ${grid[@]}; do
  IFS=/ read -r total depth top_k <<<"$shape"
  python -m bench method=eagle2 task=all task.limit=1 gen.max_new_tokens=96 method.drafter.total_token="$total" \
    method.drafter.depth="$depth" method.drafter.top_k="$top_k" out_dir="$out/eagle2-$total-$depth-$top_k"
done
python - "$out" <<'PY'
import sys
from pathlib import Path

import pandas as pd

rows = []
for summary in sorted(Path(sys.argv[1]).glob("*/summary.csv")):
    table = pd.read_csv(summary)
    overall = table[table.task == "overall"].iloc[-1] if "task" in table and (table.task == "overall").any() \
        else table.iloc[-1]
    rows.append({"shape": summary.parent.name.removeprefix("eagle2-").replace("-", "/"),
                 **{k: overall[k] for k in overall.index if k in ("speedup", "speedup_ci_low", "speedup_ci_high",
                                                                  "mean_accepted_tokens", "exact_match")}})
print(pd.DataFrame(rows).to_string(index=False))
PY
