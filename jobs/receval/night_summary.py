"""The summary of one nightly pipeline run: what each stage did, the tables' rows and Delta versions before and
after, the chains scored per label. Logged to the run's MLflow parent run (`log_summary`) and printed on the
console (`print_summary`); the HTML report (jobs/receval/report.py) is built from it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.config_describe import random_models_note
from jobs.infra.config_paths import resolve_path
from jobs.infra.tracking import JobRun, tracking_uri
from jobs.receval import aggregate, curate
from schemas import chain_scores as CS

if TYPE_CHECKING:
    from rich.table import Table


@dataclass
class StageReport:
    name: str
    chains: int = 0
    seconds: float = 0.0
    counts: dict[str, float] = field(default_factory=dict)
    skipped: bool = False

    @property
    def rate(self) -> float:
        return self.chains / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Summary:
    run_id: str
    config_hash: str
    stages: list[StageReport] = field(default_factory=list)
    # Rows and Delta version of each table of the night (pipeline.ALL_TABLES, in its order): these dicts' keys
    # are the tables the summary shows and logs.
    rows_before: dict[str, int] = field(default_factory=dict)
    rows_after: dict[str, int] = field(default_factory=dict)
    versions_before: dict[str, int | None] = field(default_factory=dict)
    versions_after: dict[str, int | None] = field(default_factory=dict)
    curation: curate.CurationResult | None = None
    report_html: str | None = None
    report_file: str | None = None
    mlflow_run_id: str | None = None
    # Mean chain scores of the chains this run scored, per dataset and label (aggregate.by_label rows).
    label_scores: list[dict[str, Any]] = field(default_factory=list)

    @property
    def slowest(self) -> StageReport | None:
        ran = [s for s in self.stages if not s.skipped]
        return max(ran, key=lambda s: s.seconds) if ran else None

    @property
    def pass_rate(self) -> float | None:
        return self.curation.pass_rates.get("all") if self.curation is not None else None


def label_scores(spark: SparkSession, settings: Settings, config_hash: str, since: float) -> list[dict[str, Any]]:
    """aggregate.by_label over the chain scores of `config_hash` written since `since` (this run)."""
    if not tables.exists(spark, settings.table("chain_scores")):
        return []
    scores = tables.read(spark, settings.table("chain_scores")).where(
        (F.col(CS.CONFIG_HASH) == config_hash)
        & (F.col(CS.SCORED_AT) >= F.lit(datetime.fromtimestamp(since, timezone.utc))))
    rows = aggregate.by_label(scores, tables.read(spark, settings.table("chains"))).collect()
    return [r.asDict() for r in rows]


def log_summary(summary: Summary, tracked: JobRun) -> None:
    """The night's metrics and tags on its parent run: rows and new rows per table, versions before and after,
    seconds per stage, the pass rate, the slowest stage and the config hash."""
    for name in summary.rows_after:
        tracked.log_metrics(
            {f"rows.{name}": summary.rows_after.get(name, 0), f"new_rows.{name}": summary.rows_after.get(name, 0)
             - summary.rows_before.get(name, 0)}
        )
        tracked.set_tags(
            {f"version_before.{name}": summary.versions_before.get(name),
             f"version_after.{name}": summary.versions_after.get(name)}
        )
    for s in summary.stages:
        tracked.log_metrics({f"stage_seconds.{s.name}": s.seconds})
    if summary.pass_rate is not None:
        tracked.log_metrics({"pass_rate": summary.pass_rate})
    if summary.slowest is not None:
        tracked.set_tags({"slowest_stage": summary.slowest.name})
    tracked.set_tags({"config_hash": summary.config_hash})


def mlflow_location(settings: Settings, run_id: str | None) -> str:
    uri = tracking_uri(settings)
    if not run_id:
        return f"(not logged) tracking store {uri}"
    if uri.startswith("http"):
        try:
            from mlflow.tracking import MlflowClient

            exp = MlflowClient(uri).get_run(run_id).info.experiment_id
            return f"{uri.rstrip('/')}/#/experiments/{exp}/runs/{run_id}"
        except Exception:  # the id is still useful when the server cannot be asked
            return f"run {run_id} at {uri}"
    return f"run {run_id} in {uri} (browse: mlflow ui --backend-store-uri {uri})"


def label_scores_table(rows: list[dict[str, Any]]) -> Table:
    """The summary's "Scores by label" table: mean chain scores of this run's chains per dataset and label."""
    from rich.table import Table

    cols = aggregate.label_score_cols()
    # The explanation is the caption: with every score a column, a long title would wrap inside its own words.
    t = Table(title="Scores by label", caption="chains scored by this run; mean of each chain's min over steps; "
                    "label value 1 = no error, 0 = error")  # fmt: skip
    for col in ("dataset", "label", "value", "chains", *cols):
        if col in ("dataset", "label"):  # names are never cut; the score columns' headers fold instead
            widest = max([len(col), *(len(str(r[col])) for r in rows)])
            t.add_column(col, justify="left", no_wrap=True, min_width=widest)
        else:
            t.add_column(col, justify="right", overflow="fold")
    for r in rows:
        means = ["-" if r[c] is None else f"{r[c]:.3f}" for c in cols]
        value = "" if r["value"] is None else f"{r['value']:g}"
        t.add_row(str(r["dataset"]), r["label"], value, str(r["chains"]), *means)
    return t


def print_summary(summary: Summary, settings: Settings) -> None:
    """The night on the console: rows, new rows and versions per table, the stages, the scores by label, the pass
    rate and where the tables, the MLflow run and the report are."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    t = Table(title=f"Nightly pipeline summary (config hash {summary.config_hash})")
    for col in ("table", "rows", "new rows", "version"):
        t.add_column(col, justify="right" if col != "table" else "left")
    for name in summary.rows_after:
        before, after = summary.versions_before.get(name), summary.versions_after.get(name)
        version = "-" if after is None else (f"{before} -> {after}" if before != after else f"{after} (unchanged)")
        t.add_row(name, str(summary.rows_after.get(name, 0)),
                  str(summary.rows_after.get(name, 0) - summary.rows_before.get(name, 0)), version)
    console.print(t)
    s = Table(title="Stages")
    for col in ("stage", "chains", "seconds", "chains/s", "notes"):
        s.add_column(col, justify="left" if col in ("stage", "notes") else "right")
    for r in summary.stages:
        notes = "skipped (input unchanged)" if r.skipped else ", ".join(
            f"{k}={int(v) if float(v).is_integer() else round(v, 3)}" for k, v in r.counts.items()
            if k in ("unscored", "quarantined", "new_input_files", "run_passed", "run_failed")
        )
        s.add_row(r.name, str(r.chains), f"{r.seconds:.1f}", f"{r.rate:.1f}", notes)
    console.print(s)
    if summary.label_scores:
        console.print(label_scores_table(summary.label_scores))
    slowest = summary.slowest
    lines = [
        f"pass rate: {summary.pass_rate:.1%}" if summary.pass_rate is not None else "pass rate: - (no chains curated)",
        f"slowest stage: {slowest.name} ({slowest.seconds:.1f} s)" if slowest else "slowest stage: -",
        f"Delta tables: {resolve_path(settings.paths.lake)}",
        f"MLflow: {mlflow_location(settings, summary.mlflow_run_id)}",
        *([f"report: {summary.report_file}"] if summary.report_file else []),
        f"models: {settings.models.profile} (NLI {settings.models.nli.path})",
    ]
    # Tiny random models score every chain alike: say so where the scores are read, and how to get real ones.
    lines += [note] if (note := random_models_note(settings)) else []
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
