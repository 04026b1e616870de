"""The localisation meta-evaluation's cost over ProcessBench's GSM8K and MATH subsets (1,400 chains, 8,587 steps):
`jobs.metaeval.localise.run` (the Spark join and per-chain collection, the driver maths, the three Delta writes)
on a lake shaped exactly like them: each item's id, step count and earliest-error label from the mirror's JSON,
`step_labels` rows as the adapter writes them, and seeded synthetic step scores for the four ReCEval metrics (the
figures are meaningless; the time is what is measured). Issue 31's target: localisation adds <= 10% to scoring
the same chains.

    .venv/bin/python bench/localise_bench.py [--rounds 2] [--resamples 1000] [--data /work/shared/data]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.infra.config_layers import load_settings  # noqa: E402
from jobs.infra.session import build_session  # noqa: E402
from jobs.metaeval import localise  # noqa: E402
from jobs.metaeval import localise_maths as L  # noqa: E402
from schemas import chains as C  # noqa: E402
from schemas import step_labels as SL  # noqa: E402
from schemas import step_scores as SS  # noqa: E402

SUBSETS = ("gsm8k", "math")


def build_lake(spark, settings, data: Path, seed: int = 0) -> tuple[int, int]:
    """chains, step_scores and step_labels of both subsets; returns (chains, steps)."""
    rng = np.random.default_rng(seed)
    h = settings.scoring_hash()
    chains, scores, labels = [], [], []
    for subset in SUBSETS:
        for item in json.loads((data / "processbench" / f"{subset}.json").read_text()):
            cid, n, label = f"processbench_{subset}:{item['id']}", len(item["steps"]), int(item["label"])
            chains.append({**{f.name: None for f in C.SCHEMA.fields}, C.CHAIN_ID: cid, C.CONTENT_HASH: cid,
                           C.DATASET: f"processbench_{subset}", C.STEPS: item["steps"], C.CONTEXT: item["problem"],
                           C.LABELS: {SL.FIRST_ERROR_INDEX: float(label),
                                      SL.FINAL_ANSWER_CORRECT: float(item["final_answer_correct"])}})
            for i in range(n):
                # A weak signal at the labelled step, so thresholds are not all at an edge.
                shift = 0.2 if i == label else 0.0
                scores.append({**{f.name: None for f in SS.SCHEMA.fields}, SS.CHAIN_ID: cid, SS.STEP_IDX: i,
                               SS.CONFIG_HASH: h, SS.INTRA_ENTAIL: float(rng.random() - shift),
                               SS.INTER: float(rng.random() - shift), SS.INTRA_PVI: float(rng.normal() - 2 * shift),
                               SS.INFO_GAIN: float(rng.normal() - 2 * shift)})
            end = n if label == L.NO_ERROR else label + 1
            labels += [(cid, i, SL.FIRST_ERROR, 0.0 if i == label else 1.0, f"processbench_{subset}")
                       for i in range(end)]
    for name, rows, schema in (("chains", chains, C.SCHEMA), ("step_scores", scores, SS.SCHEMA),
                               ("step_labels", labels, SL.SCHEMA)):
        spark.createDataFrame(rows, schema).write.format("delta").mode("overwrite").save(settings.table(name))
    return len(chains), len(scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--data", default=os.environ.get("RECEVAL_DATA_MIRROR", str(ROOT / "data")))
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="localise-bench-"))
    settings = load_settings(overrides=[f"paths.lake={folder}/lake", "mlflow.enabled=false", "spark.master=local[2]",
                                        "spark.shuffle_partitions=2",
                                        f"localise.bootstrap_resamples={args.resamples}"], environ={})
    spark = build_session(settings.spark)
    n_chains, n_steps = build_lake(spark, settings, Path(args.data))
    times, maths = [], []
    original = localise.evaluate

    def timed(*a, **k):
        t = time.perf_counter()
        out = original(*a, **k)
        maths.append(time.perf_counter() - t)
        return out

    localise.evaluate = timed
    for r in range(args.rounds):
        t = time.perf_counter()
        out = localise.run(spark, settings, run_id=f"bench-{r}")
        times.append(time.perf_counter() - t)
    f1 = {(row[SL.DATASET], row["metric"]): row["f1"] for row in out.evaluation.results}
    load = "/".join(f"{v:.1f}" for v in os.getloadavg())
    lines = [
        "## Localisation meta-evaluation over ProcessBench GSM8K + MATH (bench/localise_bench.py)", "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; 2 cores, Spark local[2]; load average (1/5/15 min) at "
        f"the end: {load}",
        f"- lake: {n_chains} chains, {n_steps} steps (the mirror's items: ids, step counts, labels), synthetic "
        f"seeded step scores for 4 metrics; {len(out.evaluation.results)} result rows ({len({r['metric'] for r in out.evaluation.results})}"
        f" metrics incl. receval_rank_min x 2 subsets), bootstrap {args.resamples} resamples",
        f"- command: `.venv/bin/python bench/localise_bench.py --rounds {args.rounds} --resamples {args.resamples}`",
        "", "| round | localise.run s | of which driver maths (jobs/metaeval/localise_maths.py) s |", "|---:|---:|---:|",
        *[f"| {i + 1} | {t:.1f} | {m:.1f} |" for i, (t, m) in enumerate(zip(times, maths, strict=True))], "",
        f"counts {out.counts}; F1 (synthetic scores) e.g. {({k: round(v, 3) for k, v in list(f1.items())[:2]})}", "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_append:
        with (ROOT / "bench" / "RESULTS.md").open("a") as f:
            f.write("\n" + text)
    spark.stop()


if __name__ == "__main__":
    main()
