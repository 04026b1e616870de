"""How busy this machine's CPUs are right now, for .ci/run's budgets.

Prints the seconds a fixed pure-Python workload takes on two processes at once (median of three rounds). On a
quiet 2-core machine of CI's kind it takes 0.88-1.00 s; each busy process beside it adds about half of that
(one busy loop beside it: 1.52 s, two: 2.08 s). CI's machines are shared: the same test set has taken 1,359 s
and 2,668 s in two CI runs of nearly the same code, and 971 s here with this probe at 0.88-0.93 s, so a fixed
budget in wall-clock seconds either misses creep or fails on a busy day. `.ci/run` runs this before and after
each test set and divides the set's time by the slowdown it shows (never by less than 1; .ci/budget.py).
"""

import multiprocessing as mp
import statistics
import time


def work(_: int) -> int:
    total = 0
    for i in range(16_000_000):
        total = (total + i * i) % 1_000_003
    return total


def one_round() -> float:
    t0 = time.perf_counter()
    with mp.Pool(2) as pool:
        pool.map(work, range(2))
    return time.perf_counter() - t0


if __name__ == "__main__":
    print(f"{statistics.median(one_round() for _ in range(3)):.2f}")
