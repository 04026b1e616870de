"""ProcessBench end to end, in one process and one Spark session: the adapter, the scoring pipeline (steps as
given), the per-step ROSCOE baselines (optional) and the localisation meta-evaluation, each through its declared
stage (`STAGE.main`), timed. Issue 31's results and its throughput check (localisation <= 10% of scoring the
same chains) come from one such run; the tables land in `--out` (results.md, results.json).

    .venv/bin/python bench/processbench_run.py --out bench/out/pb_offline [--baselines] \
        [--set models.info_gain.path=registry:gemma3-270m ...] [--max-items N]

Every `--set` goes to every stage (they share the scoring hash). The lake, MLflow store and the results are
under `--out`; the dataset comes from the data folder (`make data`, or `python -m jobs.infra.data fetch
processbench`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.infra.args import add_settings_arguments  # noqa: E402
from jobs.metaeval import baselines, localise, processbench  # noqa: E402
from jobs.metaeval.localise import markdown_table  # noqa: E402
from jobs.receval import pipeline  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the lake, the MLflow store and the results")
    add_settings_arguments(parser)
    parser.add_argument("--baselines", action="store_true", help="also the per-step ROSCOE baselines")
    parser.add_argument("--max-items", type=int, help="the first N items of each subset (smoke runs)")
    parser.add_argument("--subsets", default="gsm8k,math")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    common = [
        f"paths.lake={out}/lake", f"paths.checkpoints={out}/lake/_checkpoints",
        f"mlflow.tracking_uri=sqlite:///{out}/mlruns.db", f"mlflow.artifact_location={out}/mlartifacts",
        "steps.boundary=given", f"processbench.subsets=[{args.subsets}]",
        *([f"processbench.max_items={args.max_items}"] if args.max_items else []),
        *(["localise.step_baselines=step_baseline_scores", "baselines.per_step=true",
           f"baselines.datasets=[{','.join(f'processbench_{s}' for s in args.subsets.split(','))}]",
           "baselines.groups=[sa,ss]"] if args.baselines else []),
        *args.overrides,
    ]
    argv_of = [*(["--config", args.config] if args.config else []), *(x for pair in common for x in ("--set", pair))]
    seconds: dict[str, float] = {}

    def timed(name: str, fn):
        started = time.time()
        result = fn()
        seconds[name] = round(time.time() - started, 1)
        print(f"[processbench_run] {name}: {seconds[name]} s", flush=True)
        return result

    counts = timed("adapter", lambda: processbench.main(argv_of))
    summary = timed("scoring", lambda: pipeline.main(
        [*argv_of, "--set", "pipeline.stages=[steps,scores,aggregate]"]))
    if args.baselines:
        timed("baselines", lambda: baselines.main(argv_of))
    outcome = timed("localise", lambda: localise.main(argv_of))
    rows = outcome.evaluation.results
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end",
        "config": args.config, "overrides": args.overrides, "baselines": args.baselines, "max_items": args.max_items,
        "seconds": seconds, "adapter": counts,
        "scoring_stages": {s.name: {"seconds": round(s.seconds, 1), "chains": s.chains} for s in summary.stages},
        "localise_counts": outcome.counts, "thresholds": outcome.evaluation.thresholds,
        "localise_share_of_scoring": round(seconds["localise"] / seconds["scoring"], 4),
        "results": rows,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "results.md").write_text(
        f"ProcessBench localisation, {result['date']}, {result['machine']}; overrides {args.overrides or 'none'}\n\n"
        f"seconds: {seconds}; localisation / scoring = {result['localise_share_of_scoring']:.1%}\n\n"
        + markdown_table(rows))
    print(json.dumps({k: result[k] for k in ("seconds", "localise_share_of_scoring")}))
    return result


if __name__ == "__main__":
    main()
