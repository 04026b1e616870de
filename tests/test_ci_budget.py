"""CI's time budgets (.ci/budget.py, called by .ci/run): a set's time in quiet-machine seconds against its budget."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

CI = Path(__file__).resolve().parents[1] / ".ci"
spec = importlib.util.spec_from_file_location("ci_budget", CI / "budget.py")
budget = importlib.util.module_from_spec(spec)
spec.loader.exec_module(budget)


def test_slowdown_is_the_probes_mean_over_the_quiet_probe_and_never_below_one():
    assert budget.slowdown(1.84, 1.84, 0.92) == pytest.approx(2.0, rel=1e-12)
    assert budget.slowdown(1.38, 1.84, 0.92) == pytest.approx(1.75, rel=1e-12)
    assert budget.slowdown(0.80, 0.90, 0.92) == 1.0  # a faster host than the reference does not tighten it


def test_a_busy_host_widens_the_budget_by_its_slowdown_and_creep_still_fails():
    # CI's slow set: 2,668 s with the host at half speed is 1,334 quiet-machine seconds: within 1,100 * 1.25.
    assert budget.quiet_seconds(2668, budget.slowdown(1.84, 1.84, 0.92)) == 1334
    assert not budget.over_budget(1334, 1100)
    # The same time on a quiet host is a creep of 2.4x: over.
    assert budget.over_budget(budget.quiet_seconds(2668, 1.0), 1100)
    # The line: 25% over is allowed, one second more is not.
    assert not budget.over_budget(700, 560) and budget.over_budget(701, 560)


def test_cli_prints_slowdown_quiet_seconds_and_the_cpus():
    out = subprocess.run(
        [sys.executable, str(CI / "budget.py"), "1000", "1.84", "1.84", "0.92", "150000", "2000"],
        capture_output=True, text=True, check=True,
    ).stdout.split(maxsplit=2)
    hz = __import__("os").sysconf("SC_CLK_TCK")
    assert out[:2] == ["2.00", "500"]
    assert out[2].startswith(f"CPU busy {150000 / hz:.0f} s, steal ")
