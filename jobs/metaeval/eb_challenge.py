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

from jobs.infra.config import Settings
from jobs.infra.stage import Job, Stage, dry_run
from jobs.infra.tracking import JobRun
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
        scoring = _scoring(settings)
        pipeline.prepare(scoring)
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


# eb_challenge's --stages names -> the declared stage each one runs ("score": the pipeline's scoring stages).
PARTS = {"perturb": perturb.STAGE, "human_labels": human_labels.STAGE, "score": pipeline.STAGE,
         "baselines": baselines.STAGE, "meta_eval": meta_eval.STAGE}


def _scoring(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"pipeline": settings.pipeline.model_copy(update={"stages": ["steps", "scores", "aggregate"]})}
    )


def _plan(spark, settings: Settings, args: argparse.Namespace) -> list[str]:
    lines = [f"stages {args.stages}"]
    for name in args.stages.split(","):
        stage = PARTS[name]
        lines += dry_run(spark, _scoring(settings) if name == "score" else settings, stage, args).splitlines()
    return lines


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--out", help="folder for correlations.md, heatmap.png and report.json")


def _body(job: Job) -> dict:
    args, tracked = job.args, job.tracked
    report = run(job.spark, job.settings, tracked, args.stages.split(","))
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


STAGE = Stage("eb_challenge", __doc__, _body, arguments=_arguments, plan=_plan, parts=tuple(PARTS.values()))


def main(argv: list[str] | None = None) -> dict:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
