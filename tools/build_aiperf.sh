#!/usr/bin/env bash
# NVIDIA's AIPerf in a side environment (~/.cache/specbench/aiperf-venv, about 1.2 GB, 3 minutes), never imported by
# the project: tests/test_aiperf_real.py checks with AIPerf's own models (MetricRecordInfo, SpecDecodeAcceptanceRecord)
# that the report's AIPerf export (bench/report/exports.py) is what AIPerf reads; the test is skipped without it.
set -euo pipefail
venv=${AIPERF_VENV:-$HOME/.cache/specbench/aiperf-venv}
version=0.13.0
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('aiperf') != '$version')" 2>/dev/null; then
    echo "aiperf $version is ready in $venv"
    exit 0
fi
python -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "aiperf==$version"
echo "aiperf $version installed in $venv"
