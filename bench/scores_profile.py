"""Where the scores stage's time goes on short chains: bench/run.py's pipeline path (a), taken apart.

Same models (`cpu` sizes, bench/run.py build_models), workload (bench/workload.py) and settings as bench/run.py's
(a), Spark local[2], after the same warm-up. Each part is forced to completion on its own (a `noop` write):

- nli: nli_scores.transform; pvi: pvi_scores.transform; arith: the equation check's columns over the steps;
- join: score_steps + split + aggregate with the NLI and PVI frames already computed (held), so the joins, the
  per-chain window, the `_raw` JSON column and the arithmetic check are what runs;
- whole: bench/run.py's pipeline(), as (a) times it.

    .venv/bin/python bench/scores_profile.py --chains 100
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import run as bench_run  # noqa: E402
import workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chains", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=2, help="each part timed this many times; the best is kept")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from pyspark.sql import functions as F

    from jobs.infra.config_layers import load_settings
    from jobs.infra.session import build_session
    from jobs.receval import aggregate, arith_scores, nli_scores, pvi_scores, score
    from schemas import steps as S

    models = bench_run.build_models(ROOT / "models" / "bench", "cpu")
    ref = {"nli": f"{{path: {models.nli}, family: nli}}", "t5": f"{{path: {models.t5}, family: seq2seq}}",
           "gpt2": f"{{path: {models.gpt2}, family: causal}}"}
    settings = load_settings(overrides=[
        "spark.master=local[2]", "spark.shuffle_partitions=2", f"models.nli={ref['nli']}", f"models.pvi_g={ref['t5']}",
        f"models.pvi_null={ref['t5']}", f"models.info_gain={ref['gpt2']}", "runtime.max_length=256",
        "runtime.on_row_error=fail", "nli.inter_history=all", "nli.intra_history=all", "pvi.intra_history=all",
    ], environ={})
    spark = build_session(settings.spark, extra={"spark.driver.memory": "2g", "spark.sql.adaptive.enabled": "false"})
    bench_run.pipeline(spark, settings, workload.chains(4, seed=99))  # warm-up: workers start, models load
    steps, contexts = workload.frames(spark, workload.chains(args.chains))
    steps, contexts = steps.persist(), contexts.persist()
    steps.count(), contexts.count()

    def force(df) -> None:
        df.write.format("noop").mode("overwrite").save()

    nli = nli_scores.transform(steps, contexts, settings.nli, settings.models.nli, settings.runtime)
    pvi = pvi_scores.transform(steps, contexts, settings.pvi, settings.models, settings.runtime)

    def joined() -> None:
        scored = score.score_steps(steps, contexts, settings, lambda *_: held_nli, lambda *_: held_pvi).persist()
        good, _ = score.split(scored)
        scored.where(F.col(score.ERROR).isNotNull()).first()
        aggregate.transform(good, settings.aggregate).count()
        scored.unpersist()

    def hold() -> None:  # untimed, after the nli and pvi parts: held before they ran, they only read the cache
        nonlocal held_nli, held_pvi
        held_nli, held_pvi = nli.persist(), pvi.persist()
        held_nli.count(), held_pvi.count()

    held_nli = held_pvi = None
    parts = {
        "nli": lambda: force(nli),
        "pvi": lambda: force(pvi),
        "arith": lambda: force(steps.select(*arith_scores.columns(F.col(S.STEP_TEXT)))),
        "join, split, aggregate (scores held)": joined,
        "whole (bench/run.py (a))": lambda: bench_run.pipeline(spark, settings, workload.chains(args.chains)),
    }
    times = {}
    for name, fn in parts.items():
        if name.startswith("join"):
            hold()
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        times[name] = best
        print(f"[profile] {name}: {best:.1f} s", flush=True)
    spark.stop()
    print(f"\n{args.chains} chains, best of {args.repeats}, load {os.getloadavg()[0]:.1f}\n")
    print("| part | seconds | share of whole |\n|---|---:|---:|")
    whole = times["whole (bench/run.py (a))"]
    for name, t in times.items():
        print(f"| {name} | {t:.1f} | {t / whole:.0%} |")


if __name__ == "__main__":
    main()
