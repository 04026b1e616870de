"""A test set's time against its budget, in quiet-machine seconds (called by .ci/run; tests/test_ci_budget.py).

    python3 .ci/budget.py TOOK_S BUDGET_S PROBE_BEFORE PROBE_AFTER PROBE_QUIET BUSY_TICKS STEAL_TICKS
prints one line, `SLOWDOWN QUIET_S VERDICT NOTE`: VERDICT is `over` when the quiet-machine time is more than 25%
over the budget, else `ok`; NOTE describes the CPUs over the set (busy seconds, steal).
The slowdown is the probes' mean over a quiet host's probe, never below 1: a faster host than the reference
does not tighten the budget, a busier one widens it by as much as it slows a fixed workload.
"""

from __future__ import annotations

import os
import sys

LIMIT = 1.25  # a set fails above its budget by more than 25%


def slowdown(before: float, after: float, quiet: float) -> float:
    return max(1.0, (before + after) / 2 / quiet)


def quiet_seconds(took: float, factor: float) -> int:
    return round(took / factor)


def over_budget(quiet_s: int, budget: int) -> bool:
    return quiet_s > budget * LIMIT


def cpu_note(took: float, busy_ticks: int, steal_ticks: int, hz: int, cores: int) -> str:
    wall = max(took, 1) * cores
    return f"CPU busy {busy_ticks / hz:.0f} s, steal {100 * steal_ticks / hz / wall:.1f}% of {cores} cores"


if __name__ == "__main__":
    took, budget_s, before, after, quiet = (float(a) for a in sys.argv[1:6])
    busy, steal = (int(a) for a in sys.argv[6:8])
    factor = slowdown(before, after, quiet)
    normal = quiet_seconds(took, factor)
    verdict = "over" if over_budget(normal, int(budget_s)) else "ok"
    note = cpu_note(took, busy, steal, os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1)
    print(f"{factor:.2f} {normal} {verdict} {note}")
