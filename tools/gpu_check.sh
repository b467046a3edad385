#!/usr/bin/env bash
# The GPU check, run as is on any machine with a CUDA GPU (under 10 minutes on one recent GPU):
#   bash tools/gpu_check.sh                      # device cuda, float16
#   DEVICE=cpu bash tools/gpu_check.sh           # (or: bash tools/gpu_check.sh cpu) a dry run on CPU with
#                                                     # tiny settings (2 methods, 1 question per task, 8 tokens)
# 1. environment facts (torch, transformers, CUDA, GPU name, driver), 2. our vanilla against transformers'
# `generate` (batch 1 and 4; batch 1 also compiled on both sides), 3. every method (conf/method/*.yaml) on task=all
# task.limit=2 with SmolLM2, greedy, in float16 with the float16 tie margin (model.tie_margin), on the compiled engine
# (engine.compile=on; COMPILE=off for the eager one), 4. the batch sweep gen.batch_size=1,4,16 (vanilla,
# pld, eagle2; 18 questions; compiled too), 5. step 3 for every larger conf/model entry whose weights are in the local Hugging
# Face cache (as far as the time budget goes), 6. the reports (python -m bench.report on runs/ and sweep/) and a
# summary: speedup, losslessness (exact or numeric tie), joules per token (NVML), NVML errors.
# Everything goes to one folder, results/gpu_check-<date>/ (OUT_DIR=... to change it); log: gpu_check.log there.
# Exit status 0: every method that ran matched vanilla (numeric ties aside) and none crashed; 1 otherwise.
# Knobs (environment): DEVICE, DTYPE, TIE_MARGIN, METHODS, SWEEP_METHODS, BATCH_SIZES, LIMIT, SWEEP_LIMIT,
# MAX_NEW_TOKENS, COMPILE, BUDGET_S (seconds after which optional stages are skipped; default 540).
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"  # never wait on the network: use what is cached
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's bench, whatever is installed

device="${1:-${DEVICE:-cuda}}"
all_methods="vanilla $(ls conf/method/*.yaml | xargs -n1 basename | sed 's/\.yaml$//' | grep -v '^vanilla$' | xargs)"
if [ "$device" = cpu ]; then  # a dry run: every stage, tiny
  dtype="${DTYPE:-float32}" methods="${METHODS:-vanilla pld}" sweep_methods="${SWEEP_METHODS:-pld}"
  sizes="${BATCH_SIZES:-1 4}" limit="${LIMIT:-1}" sweep_limit="${SWEEP_LIMIT:-1}" tokens="${MAX_NEW_TOKENS:-8}"
  warmup=4
  generate_args=(--questions 2 --max-new-tokens 8)
else
  dtype="${DTYPE:-float16}" methods="${METHODS:-$all_methods}" sweep_methods="${SWEEP_METHODS:-pld eagle2}"
  sizes="${BATCH_SIZES:-1 4 16}" limit="${LIMIT:-2}" sweep_limit="${SWEEP_LIMIT:-3}" tokens="${MAX_NEW_TOKENS:-64}"
  warmup=16
  generate_args=(--questions 8 --max-new-tokens 128)
fi
case "$dtype" in  # logit gap under which a greedy difference from vanilla is a numerical tie, not a bug
  float16) tie="${TIE_MARGIN:-0.0625}" ;;
  bfloat16) tie="${TIE_MARGIN:-1.0}" ;;
  *) tie="${TIE_MARGIN:-}" ;;
esac
out="${OUT_DIR:-results/gpu_check-$(date +%Y-%m-%d_%H-%M-%S)}"
mkdir -p "$out"
exec > >(tee -a "$out/gpu_check.log") 2>&1
deadline=$(( $(date +%s) + ${BUDGET_S:-540} ))
export GPU_CHECK_DEADLINE="$deadline"
status=0
stage() { echo; echo "=== gpu_check: $* ==="; }

stage "environment ($device, $dtype) -> $out"
python - "$device" <<'PY' | tee "$out/environment.txt"
import os, platform, subprocess, sys
import torch, transformers
print(f"python {platform.python_version()}  torch {torch.__version__}  transformers {transformers.__version__}")
print(f"torch CUDA build: {torch.version.cuda}  cuDNN: {torch.backends.cudnn.version()}")
print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}  "
      f"visible CUDA devices: {torch.cuda.device_count() if torch.cuda.is_available() else 0}")
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"cuda:{i} {p.name}  {p.total_memory / 2**30:.1f} GiB  compute {p.major}.{p.minor}  uuid {p.uuid}")
try:
    import pynvml
    pynvml.nvmlInit()
    print(f"NVIDIA driver {pynvml.nvmlSystemGetDriverVersion()}  NVML CUDA driver API "
          f"{pynvml.nvmlSystemGetCudaDriverVersion()}")
except Exception as err:  # a fact to print, not a failure
    print(f"NVML: {type(err).__name__}: {err}")
try:
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip())
except (OSError, subprocess.SubprocessError):
    print("nvidia-smi: not available")
if sys.argv[1] != "cpu" and not torch.cuda.is_available():
    sys.exit("error: torch sees no CUDA device; run DEVICE=cpu bash tools/gpu_check.sh for a dry run")
PY
[ "${PIPESTATUS[0]}" = 0 ] || exit 2

stage "compiled vanilla vs transformers generate over its static cache, compiled ($dtype, batch 1)"
python -m studies.vs_transformers vanilla --compile --device "$device" --dtype "$dtype" "${generate_args[@]}" \
  | tee -a "$out/vanilla_vs_generate.txt" || status=1

stage "vanilla vs transformers generate ($dtype, batch 1 and 4)"
for b in 1 4; do
  python -m studies.vs_transformers vanilla --device "$device" --dtype "$dtype" --batch-size "$b" "${generate_args[@]}" \
    | tee -a "$out/vanilla_vs_generate.txt" || status=1
done

# Runs each method in one process (one model load per run, no interpreter start-up per method); a method whose
# artifacts are missing is skipped with its fix printed; after the deadline the remaining ones are skipped.
run_methods() {  # run_methods <runs folder> "<methods>" <overrides...>
  python - "$@" <<'PY'
import os, sys, time, traceback
import torch
from bench.config import compose_config
from bench.engine.kvcache import UnsupportedModelError
from bench.errors import MissingArtifactError
from bench.measure.run import run

root, methods, overrides = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
rest = os.environ.get("REST_OVERRIDES", "").split()
failed = False
for method in methods:
    began = time.time()
    if began > float(os.environ["GPU_CHECK_DEADLINE"]):
        print(f"=== gpu_check: {method}: skipped (time budget BUDGET_S spent)", flush=True)
        continue
    try:
        run(compose_config(f"method={method}", *overrides, *(rest if method == "rest" else []),
                           f"out_dir={root}/{method}"))
        result = "ran"
    except (MissingArtifactError, UnsupportedModelError) as err:  # anything else is a failure of the check
        result = f"skipped: {err}".splitlines()[0]
    except Exception:
        traceback.print_exc()
        result, failed = "FAILED", True
    print(f"=== gpu_check: {method}: {result} ({time.time() - began:.0f} s)", flush=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
sys.exit(1 if failed else 0)
PY
}

models="smollm2_135m $(python - <<'PY'
from pathlib import Path
from omegaconf import OmegaConf
from bench.artifacts import resolve_artifact_path
for path in sorted(Path("conf/model").glob("*.yaml")):
    cfg = OmegaConf.load(path)
    if cfg.name == "smollm2_135m" or not cfg.get("path") or cfg.get("gguf_file"):
        continue
    local = resolve_artifact_path(cfg.path)
    if local is not None:
        found = local.exists()
    else:
        from huggingface_hub import try_to_load_from_cache
        found = isinstance(try_to_load_from_cache(cfg.path, "config.json"), str)
    if found:
        print(cfg.name)
PY
)"
[ "$device" = cpu ] && models="smollm2_135m"  # the dry run checks the script, not a 7B model on CPU
export REST_OVERRIDES="datastore.max_conversations=2000 datastore.auto_build=true"  # a quick REST datastore
common=(device="$device" model.dtype="$dtype" ${tie:+model.tie_margin=$tie} task=all gen.max_new_tokens="$tokens"
        warmup_tokens="$warmup")
every_method() {  # every_method <model>
  stage "every method on $1: task=all task.limit=$limit, $tokens tokens, $dtype${tie:+, tie margin $tie}"
  local ds="${SPECBENCH_CACHE:-$HOME/.cache/specbench}/datastores/$1-sharegpt-2000.idx"
  REST_OVERRIDES="$REST_OVERRIDES datastore.path=$ds" \
    run_methods "$out/runs/$1" "$methods" model="$1" "${common[@]}" task.limit="$limit" \
      engine.compile="${COMPILE:-on}" || status=1
}

every_method smollm2_135m
stage "batch sweep on smollm2_135m: gen.batch_size=${sizes// /,}, task.limit=$sweep_limit"
for size in $sizes; do
  run_methods "$out/sweep/smollm2_135m/b$size" "vanilla $sweep_methods" model=smollm2_135m "${common[@]}" \
    task.limit="$sweep_limit" gen.batch_size="$size" engine.compile="${COMPILE:-on}" || status=1
done
for model in ${models#smollm2_135m}; do  # larger models last: what the time budget leaves
  every_method "$model"
done

stage "reports"
python -m bench.report "$out/runs" --out "$out/report" > /dev/null || status=1
python -m bench.report "$out/sweep" --out "$out/report_sweep" > /dev/null || status=1
cat "$out/report/leaderboard.md"
sed -n '/^## Batch-size sweep/,$p' "$out/report_sweep/leaderboard.md"

stage "summary"
python - "$out" <<'PY' || status=1
import json, sys
from pathlib import Path
import pandas as pd

out = Path(sys.argv[1])
pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 20)
columns = ["model", "dtype", "batch_size", "method", "n_questions", "tokens_per_s", "speedup", "mean_accepted_tokens",
           "exact_match", "numeric_ties", "exact_match_or_tie", "joules_per_token", "baseline_joules_per_token"]
boards = [pd.read_csv(out / name / "leaderboard.csv") for name in ("report", "report_sweep")
          if (out / name / "leaderboard.csv").exists()]
board = pd.concat(boards, ignore_index=True)
overall = board[board.task == "overall"][columns].drop_duplicates(["model", "dtype", "batch_size", "method"])
print(overall.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
metas = [json.loads(p.read_text()) for p in sorted(out.rglob("meta.json"))]
sources = sorted({str(m.get("gpu_energy_source")) for m in metas})
errors = {k: v for m in metas for k, v in (m.get("nvml_errors") or {}).items()}
print(f"energy source: {', '.join(sources)}; NVML errors: {errors or 'none'}; peak allocated MB: "
      f"{max((m.get('gpu_peak_allocated_mb') or 0) for m in metas):.0f}")
lossy = overall[overall.exact_match_or_tie < 1]
for row in lossy.itertuples():
    print(f"NOT LOSSLESS: {row.model} {row.method} batch {row.batch_size}: exact_match {row.exact_match:.3f} "
          f"(beyond numeric ties; see {out}/report*/leaderboard.md)")
print("losslessness: " + ("every method matched vanilla (numeric ties aside)" if lossy.empty else "FAILED"))
sys.exit(1 if not lossy.empty else 0)
PY
echo "gpu_check: results in $out (exit $status)"
exit "$status"
