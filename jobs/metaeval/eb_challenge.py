"""End to end meta-evaluation: EB-challenge + ROSCOE GSM-8K -> `chains` -> ReCEval scores and baselines -> `meta_eval`.

Runs, in one MLflow parent run: perturb (every configured type), human_labels, the pipeline's steps, scores
and aggregate stages (only chains not yet scored under the current config hash), baselines, meta_eval. Each
stage is idempotent, so a rerun after a crash does only the missing work. The correlation table and the
heatmap are logged to MLflow and written under `--out` when given.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from jobs.infra import lineage, tables
from jobs.infra.config import Settings
from jobs.infra.session import build_session
from jobs.infra.tracking import JobRun, job_run
from jobs.metaeval import baselines, human_labels, meta_eval, perturb
from jobs.receval import pipeline

log = logging.getLogger(__spec__.name)

STAGES = ["perturb", "human_labels", "score", "baselines", "meta_eval"]


def run(spark, settings: Settings, tracked: JobRun, stages: list[str] = STAGES) -> dict:
    report: dict = {}

    def timed(name: str, fn):
        started = time.time()
        out = fn()
        report[f"{name}_seconds"] = round(time.time() - started, 1)
        log.info(f"[eb_challenge] {name} done in {report[f'{name}_seconds']} s")
        return out

    if "perturb" in stages:
        report["perturb"] = timed("perturb", lambda: perturb.run(spark, settings))
    if "human_labels" in stages:
        report["human_labels"] = timed("human_labels", lambda: human_labels.run(spark, settings))
    if "score" in stages:
        scoring = settings.model_copy(
            update={"pipeline": settings.pipeline.model_copy(update={"stages": ["steps", "scores", "aggregate"]})}
        )
        pipeline._check_models(scoring, None)
        summary = timed("score", lambda: pipeline.run(spark, scoring, tracked.child("pipeline")))
        report["score"] = {s.name: s.counts for s in summary.stages}
    if "baselines" in stages:
        report["baselines"] = timed("baselines", lambda: baselines.run(spark, settings))
    if "meta_eval" in stages:
        rows = timed("meta_eval", lambda: meta_eval.run(spark, settings, tracked.local_id))
        report["meta_eval_rows"] = len(rows)
        report["table"] = meta_eval.markdown_table(rows)
        tracked.log_text("meta_eval/correlations.md", report["table"])
        if rows:
            report["heatmap"] = meta_eval.heatmap_png(rows)
            tracked.log_bytes("meta_eval/heatmap.png", report["heatmap"])
    return report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--out", help="folder for correlations.md, heatmap.png and report.json")
    settings, args = tables.job_args(__doc__ or "eb_challenge", argv, parser)
    spark = build_session(settings.spark)
    if args.dry_run:
        print(f"[dry-run] eb_challenge: stages {args.stages}; nothing is written")
        for stage in args.stages.split(","):
            print(lineage.dry_run(spark, settings, stage))
        raise SystemExit(0)
    with job_run(settings, "eb_challenge") as tracked:
        report = run(spark, settings, tracked, args.stages.split(","))
        tracked.log_metrics({k: v for k, v in report.items() if k.endswith("_seconds")})
        tracked.log_text("eb_challenge/report.json", json.dumps(
            {k: v for k, v in report.items() if k != "heatmap"}, indent=2, default=str))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if "table" in report:
            (out / "correlations.md").write_text(report["table"])
        if "heatmap" in report:
            (out / "heatmap.png").write_bytes(report["heatmap"])
        (out / "report.json").write_text(json.dumps({k: v for k, v in report.items() if k != "heatmap"},
                                                    indent=2, default=str))
    print(report.get("table", ""))
    return report


if __name__ == "__main__":
    main()
