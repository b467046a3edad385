"""The report's AIPerf export read by AIPerf's own models (tools/build_aiperf.sh's side environment; skipped when it is
not there): every line a MetricRecordInfo, every speculating request's acceptance a SpecDecodeAcceptanceRecord whose
invariants AIPerf checks, with the counts we wrote."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.report.render import write_report
from tests.report_fixtures import QUESTIONS, method_run

PYTHON = Path(os.environ.get("AIPERF_VENV", "~/.cache/specbench/aiperf-venv")).expanduser() / "bin" / "python"

pytestmark = [pytest.mark.aiperf,
              pytest.mark.skipif(not PYTHON.exists(), reason=f"no AIPerf environment at {PYTHON}: "
                                                             "bash tools/build_aiperf.sh builds it")]

READER = """
import json, sys
from aiperf.common.models.record_models import MetricRecordInfo
out = []
for line in open(sys.argv[1]):
    info = MetricRecordInfo.model_validate_json(line)
    spec = info.spec_decode_acceptance
    out.append(None if spec is None else [spec.num_spec_steps, spec.num_accepted_draft_tokens,
                                          spec.num_draft_tokens, spec.mean_acceptance_length, spec.num_spec_tokens])
print(json.dumps(out))
"""


def test_aiperf_reads_our_export_with_the_counts_we_wrote(tmp_path):
    method_run(tmp_path / "runs" / "sps", "sps", {q: 2.0 for q, _ in QUESTIONS}, [4, 4, 3], drafted=[3, 3, 3])
    write_report(tmp_path / "runs", tmp_path / "report")
    (path,) = (tmp_path / "report" / "aiperf").rglob("profile_export.jsonl")
    read = subprocess.run([str(PYTHON), "-c", READER, str(path)], capture_output=True, text=True)
    assert read.returncode == 0, read.stderr[-2000:]
    assert json.loads(read.stdout) == [[3, 8, 9, 1 + 8 / 3, 3]] * 7  # 3 steps, 8 of 9 drafts accepted, k = 3


def test_aiperf_refuses_what_our_reader_refuses(tmp_path):
    """A record that breaks an invariant is refused by AIPerf too: the two readers check the same rules."""
    method_run(tmp_path / "runs" / "sps", "sps", {81: 2.0}, [4, 4, 3], drafted=[3, 3, 3], questions=QUESTIONS[:1])
    write_report(tmp_path / "runs", tmp_path / "report")
    (path,) = (tmp_path / "report" / "aiperf").rglob("profile_export.jsonl")
    line = json.loads(path.read_text().splitlines()[0])
    line["spec_decode_acceptance"]["num_spec_steps"] = 4  # the histogram holds 3
    path.write_text(json.dumps(line) + "\n")
    read = subprocess.run([str(PYTHON), "-c", READER, str(path)], capture_output=True, text=True)
    assert read.returncode != 0 and "acceptance_histogram counts sum to 3, but num_spec_steps is 4" in read.stderr
