"""The benchmark harness runs end to end in its CPU dry mode (tiny models, 6 chains, also on a 2-worker standalone
cluster): what CI can check of it."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

from jobs.infra.config import PROJECT_ROOT


@pytest.mark.slow
def test_bench_run_dry_mode_reports_both_ratios(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    out = subprocess.run(
        [sys.executable, "bench/run.py", "--dry-run", "--cluster", "2", "--results", str(tmp_path / "RESULTS.md")],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=1200, env=env,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    text = out.stdout
    for row in ("(a) pipeline", "(b) official shape", "(c) raw batched forwards"):
        assert re.search(rf"\| {re.escape(row)}[^|]*\| [0-9.]+ \|", text), text[-3000:]
    official_over_pipeline = float(re.search(r"\(b\)/\(a\) = ([0-9.]+)x", text).group(1))
    pipeline_over_raw = float(re.search(r"\(a\)/\(c\) = ([0-9.]+)", text).group(1))
    assert math.isfinite(official_over_pipeline) and official_over_pipeline > 0
    # Spark cannot beat the same forwards without Spark by much; far above 1 is expected for 6 chains.
    assert pipeline_over_raw > 0.5
    # The same scoring on a two-worker standalone cluster (in-process driver, executors import the checkout).
    assert re.search(r"\| 2 \| [0-9.]+ \| [0-9.]+ \| 1\.00x \|", text), text[-3000:]
    assert not (tmp_path / "RESULTS.md").exists()  # a dry run records nothing
