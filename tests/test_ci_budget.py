"""CI's time budgets (.ci/budget.py, called by .ci/run): a set's time in quiet-machine seconds against its budget."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

CI = Path(__file__).resolve().parents[1] / ".ci"
budget = load_script(CI / "budget.py")


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


def _cli(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, str(CI / "budget.py"), *args], capture_output=True, text=True, check=True)
    return out.stdout.split(maxsplit=3)


def test_cli_prints_slowdown_quiet_seconds_verdict_and_the_cpus():
    hz = os.sysconf("SC_CLK_TCK")
    out = _cli("1000", "400", "1.84", "1.84", "0.92", "150000", "2000")
    assert out[:3] == ["2.00", "500", "ok"]  # 500 quiet-machine seconds of a 400 s budget: 125%, allowed
    assert out[3].startswith(f"CPU busy {150000 / hz:.0f} s, steal ")
    assert _cli("1002", "400", "1.84", "1.84", "0.92", "0", "0")[:3] == ["2.00", "501", "over"]
    # A set without a probe (.ci/run passes the quiet probe twice): its wall time is what counts.
    assert _cli("76", "60", "0.92", "0.92", "0.92", "0", "0")[:3] == ["1.00", "76", "over"]
