"""Other tools' results as leaderboard rows, beside our runs (`python -m bench.report results/runs --vllm-bench-serve
FILE --aiperf FILE --spec-bench FILE --spec-bench-baseline FILE`; docs/reporting.md).

One module per format (vllm_bench_serve.py, aiperf.py, spec_bench.py), each turning a file into ImportedRows: the
columns its source reports (speedup only where it has a vanilla baseline, tokens/s, #MAT where it reports
acceptance), NaN elsewhere, never invented. A file that is not what its flag says, or lacks a field its numbers need,
is refused in one line naming the file and the field (ConfigError: `error: ...`, exit status 2), before the report
writes anything. Every file is only read.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.errors import ConfigError
from bench.report.imports import aiperf as aiperf_format
from bench.report.imports import spec_bench as spec_bench_format
from bench.report.imports import vllm_bench_serve
from bench.report.imports.shared import OURS


def load_imports(vllm: list[Path] = (), aiperf: list[Path] = (), spec_bench: list[Path] = (),
                 spec_bench_baseline: Path | None = None, spec_bench_tokenizer: str | None = None) -> pd.DataFrame:
    """Every imported file's rows in the leaderboard's columns (empty without imports); refuses a bad file."""
    if spec_bench_baseline is not None and not spec_bench:
        raise ConfigError("--spec-bench-baseline: no --spec-bench answer file to compare with it")
    rows = [row for path in vllm for row in vllm_bench_serve.rows(Path(path))]
    rows += [row for path in aiperf for row in aiperf_format.rows(Path(path))]
    if spec_bench:
        tokenizer = spec_bench_format.load_tokenizer(spec_bench_tokenizer) if spec_bench_tokenizer else None
        baseline = None if spec_bench_baseline is None else Path(spec_bench_baseline)
        rows += [row for path in spec_bench for row in spec_bench_format.rows(Path(path), baseline, tokenizer)]
    return pd.DataFrame([row.board_row() for row in rows])


def with_imports(board: pd.DataFrame, imported: pd.DataFrame | None) -> pd.DataFrame:
    """The leaderboard with a `source` column (ours: specbench) and the imported rows after ours."""
    ours = board.copy()
    ours.insert(ours.columns.get_loc("method"), "source", OURS)
    if imported is None or imported.empty:
        return ours
    return pd.concat([ours, imported.reindex(columns=ours.columns)], ignore_index=True)
