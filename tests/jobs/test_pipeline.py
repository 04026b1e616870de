"""Nightly pipeline: incremental, idempotent and resumable; fake stages for the bookkeeping, real ones (slow) end to end."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import delta_readers
import deltalake
import pytest
from conftest import SAMPLE_LAKE, copy_sample, sqlite_store
from pipeline_fakes import QUARANTINE_MARK, Fakes
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from jobs.infra import maintain, tables
from jobs.infra.config import Settings
from jobs.infra.tracking import JobRun
from jobs.receval import night_summary, pipeline

# Columns a rerun legitimately changes: when a row was written and by which run.
VOLATILE = {"ingested_at", "scored_at", "curated_at", "quarantined_at", "recorded_at", "seen_at", "run_id"}
RESULT_TABLES = ["chains", "steps", "contexts", "step_scores", "chain_scores", "unscored", "curation", "curated",
                 "rejected", "quarantine"]


@pytest.fixture
def lake_input(tmp_path: Path) -> Path:
    """A copy of the sample lake (24 GSM-8K chains + 4 bad rows) that tests can add files to."""
    folder = tmp_path / "input"
    return copy_sample(folder)


def _settings(make_settings, lake_input: Path, *extra: str):
    return make_settings(
        f"ingest.input={lake_input}",
        "pipeline.batch_chains=12",
        "pipeline.progress=plain",
        "pipeline.stages=[ingest,steps,scores,aggregate,curate]",
        "curation.thresholds={intra_entail: 0.3}",
        "curation.quantiles={inter: 0.25}",
        *extra,
    )


def _run(spark, settings, fakes: Fakes) -> night_summary.Summary:
    with fakes.installed():
        return pipeline.run(spark, settings, JobRun("pipeline", settings))


def _stable(spark, settings, name: str):
    df = tables.read(spark, settings.table(name))
    return df.select(*[c for c in df.columns if c not in VOLATILE])


def _state(spark, settings) -> dict[str, int | None]:
    """Every table's Delta version (None: not made). A version fixes a table's content: the same version is the
    same rows, so no row count is needed (each was a Spark job: ~10 s per state on 2 busy cores)."""
    return {name: tables.version(spark, settings.table(name)) for name in pipeline.ALL_TABLES}


def _new_chains_file(folder: Path, ids: list[str], name: str = "night2.jsonl") -> None:
    rows = [
        {"chain_id": i, "dataset": "synthetic", "context": f"Context of {i}. It has two sentences.",
         "chain": f"First step of {i}.\nSecond step of {i} is longer.\nSo the answer is 7.", "answer": "7"}
        for i in ids
    ]
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


@dataclass
class CleanRun:
    """One uninterrupted run over a copy of the sample lake, shared by the tests (they copy its lake)."""

    input: Path
    lake: Path
    summary: night_summary.Summary
    fakes: Fakes
    output: str
    settings: Settings  # of the lake as the copies' reruns see it (five stages)


@pytest.fixture(scope="module")
def clean_run(spark, tmp_path_factory) -> CleanRun:
    """`python -m jobs.receval.pipeline` (its main, fake stages) once: tables, MLflow parent and stage runs."""
    root = tmp_path_factory.mktemp("clean")
    copy_sample(root / "input")
    settings = _clean_settings(root / "input", root / "lake", root)
    fakes = Fakes()
    out = io.StringIO()
    argv = [f"--set={key}={value}" for key, value in _clean_overrides(root / "input", root / "lake", root)]
    # The nightly report too (its MLflow artifact is checked below); the copies' reruns skip it.
    argv += ["--set=pipeline.stages=[ingest,steps,scores,aggregate,curate,report]", "--set=pipeline.report_worst_n=2"]
    # Jobs log to the standard error as it is at each record (jobs.infra.logs).
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), fakes.installed():
        summary = pipeline.main(argv)
    return CleanRun(root / "input", root / "lake", summary, fakes, out.getvalue(), settings)


def _clean_overrides(lake_input: Path, lake: Path, tmp: Path) -> list[tuple[str, str]]:
    return [
        ("paths.lake", str(lake)), ("mlflow.tracking_uri", sqlite_store(tmp / "mlruns.db")),
        ("mlflow.artifact_location", f"{tmp}/mlartifacts"), ("spark.master", "local[2]"),
        ("spark.shuffle_partitions", "1"),
        ("ingest.input", str(lake_input)), ("pipeline.batch_chains", "12"), ("pipeline.progress", "plain"),
        ("pipeline.stages", "[ingest,steps,scores,aggregate,curate]"), ("curation.thresholds", "{intra_entail: 0.3}"),
        ("curation.quantiles", "{inter: 0.25}"),
    ]


def _clean_settings(lake_input: Path, lake: Path, tmp: Path, *extra: str):
    from jobs.infra.config_layers import load_settings

    return load_settings(
        overrides=[f"{key}={value}" for key, value in _clean_overrides(lake_input, lake, tmp)] + list(extra),
        environ={},
    )


def _copy_of_clean(clean: CleanRun, tmp_path: Path, *extra: str):
    """An independent lake equal to the clean run's (a Delta table is its folder), same input folder."""
    shutil.copytree(clean.lake, tmp_path / "lake")
    return _clean_settings(clean.input, tmp_path / "lake", tmp_path, *extra)


def test_run_scores_every_valid_chain_once(spark, clean_run):
    summary, fakes = clean_run.summary, clean_run.fakes
    assert summary.rows_after["chains"] == 24
    assert summary.rows_after["chain_scores"] == 24
    assert summary.rows_after["curation"] == 24
    assert summary.rows_after["curated"] + summary.rows_after["rejected"] == 24
    # Batches of <= 12 chains by hash: each chain reaches each stage exactly once.
    assert len(fakes.seen_steps) == 24 and len(set(fakes.seen_steps)) == 24
    assert len(fakes.seen_nli) == 24 and len(set(fakes.seen_nli)) == 24
    assert fakes.nli_calls == 2  # ceil(24 / 12) batches
    settings = clean_run.settings
    n_steps = tables.read(spark, settings.table("steps")).count()
    assert tables.read(spark, settings.table("step_scores")).count() == n_steps
    hashes = {r[0] for r in tables.read(spark, settings.table("chain_scores")).select("config_hash").distinct().collect()}
    assert hashes == {settings.scoring_hash()}


def test_run_logs_progress_per_batch(clean_run):
    lines = clean_run.output.splitlines()
    # One format for every line: time, level, logger, message.
    assert any(line.endswith("INFO jobs.receval.pipeline: [pipeline scores] 24 chains to do") for line in lines)
    assert "INFO jobs.receval.pipeline: [pipeline] scores: batch 2/2 committed, 24/24 chains (100%)" in clean_run.output
    assert "[pipeline scores] 24/24 chains (100%)" in clean_run.output  # the closing line: rate, ETA, elapsed
    assert "[pipeline] ingest: read=28 new chains=24 already present=0 quarantined=4" in clean_run.output


def test_print_summary_tables_and_locations(clean_run, capsys):
    settings = clean_run.settings
    night_summary.print_summary(clean_run.summary, settings)
    out = capsys.readouterr().out
    assert "Nightly pipeline summary" in out and "chain_scores" in out
    assert "pass rate:" in out and "slowest stage:" in out
    assert f"Delta tables: {clean_run.lake}" in out
    assert f"MLflow: run {clean_run.summary.mlflow_run_id} in sqlite:///" in out


def test_summary_scores_by_label_of_the_run(spark, clean_run, capsys):
    """The summary's mean chain scores per label, against the chain_scores table and the input's own labels."""
    import statistics

    from mlflow.tracking import MlflowClient

    from jobs.receval.aggregate import label_score_cols

    settings = clean_run.settings
    ok = {json.loads(line)["chain_id"]: json.loads(line)["labels"]["verifier_correct"]
          for line in (SAMPLE_LAKE / "gsm8k_sample.jsonl").read_text().splitlines()}
    scores = {r["chain_id"]: r for r in tables.read(spark, settings.table("chain_scores")).collect()}
    got = {(r["dataset"], r["label"], r["value"]): r for r in clean_run.summary.label_scores}
    groups = {("gsm8k", "all", None): list(ok), ("gsm8k", "verifier_correct", 1.0): [c for c in ok if ok[c] == 1.0],
              ("gsm8k", "verifier_correct", 0.0): [c for c in ok if ok[c] == 0.0]}
    assert list(got) == list(groups)  # the dataset's row first, then label values high to low
    for key, ids in groups.items():
        assert got[key]["chains"] == len(ids) == (24 if key[1] == "all" else 12)
        for col in label_score_cols():
            # A sparse chain score (arith_valid_min: null for a chain without an equation) is averaged where set.
            values = [scores[c][col] for c in ids if scores[c][col] is not None]
            want = statistics.fmean(values) if values else None
            assert got[key][col] == (pytest.approx(want, rel=1e-9) if values else None), col
    night_summary.print_summary(clean_run.summary, settings)
    out = capsys.readouterr().out
    assert "Scores by label" in out and "verifier_correct" in out
    client = MlflowClient(settings.mlflow.tracking_uri)
    logged = client.download_artifacts(clean_run.summary.mlflow_run_id, "summary/scores_by_label.json",
                                       str(clean_run.lake.parent))
    assert json.loads(Path(logged).read_text()) == clean_run.summary.label_scores


def test_run_second_run_over_unchanged_input_writes_nothing(spark, clean_run, tmp_path):
    settings = _copy_of_clean(clean_run, tmp_path)
    before = _state(spark, settings)
    again = Fakes()
    summary = _run(spark, settings, again)
    assert _state(spark, settings) == before  # no table has a new version
    assert again.seen_steps == [] and again.nli_calls == 0
    assert [s.chains for s in summary.stages] == [0, 0, 0, 0, 0]
    assert summary.stages[0].skipped  # ingest: no new or changed input file
    assert summary.label_scores == []  # no chain scored by this run
    # Rows of the tables, as the summary prints them: the same before and after (taken from the first state).
    assert summary.rows_after == summary.rows_before and summary.rows_after["chains"] == 24


def test_run_new_input_file_scores_only_its_chains(spark, clean_run, tmp_path):
    shutil.copytree(clean_run.input, tmp_path / "input")
    settings = _copy_of_clean(clean_run, tmp_path, f"ingest.input={tmp_path / 'input'}")
    old_scores = _stable(spark, settings, "chain_scores").collect()
    new_ids = ["night2-a", "night2-b", "night2-c"]
    _new_chains_file(tmp_path / "input", new_ids)
    # The same chain again in a new file (same id, same content): ingested once, scored once.
    first = (tmp_path / "input" / "gsm8k_sample.jsonl").read_text().splitlines()[0]
    (tmp_path / "input" / "night2_dup.jsonl").write_text(first + "\n")
    fakes = Fakes()
    summary = _run(spark, settings, fakes)
    assert sorted(fakes.seen_steps) == new_ids
    assert sorted(fakes.seen_nli) == new_ids and sorted(fakes.seen_pvi) == new_ids
    assert summary.rows_after["chains"] == 27 and summary.rows_after["chain_scores"] == 27
    assert summary.curation.counts["batch"] == 3
    # Scores by label: only the chains this run scored (the new file's three, no labels).
    assert [(r["dataset"], r["label"], r["chains"]) for r in summary.label_scores] == [("synthetic", "all", 3)]
    assertDataFrameEqual(
        _stable(spark, settings, "chain_scores").where(~F.col("chain_id").isin(*new_ids)), old_scores
    )


def test_main_dry_run_counts_per_stage_and_changes_nothing(spark, clean_run, tmp_path, capsys):
    shutil.copytree(clean_run.input, tmp_path / "input")
    settings = _copy_of_clean(clean_run, tmp_path, f"ingest.input={tmp_path / 'input'}")
    _new_chains_file(tmp_path / "input", ["dry-a", "dry-b"])
    before = _state(spark, settings)
    argv = [f"--set=paths.lake={settings.paths.lake}", f"--set=ingest.input={tmp_path / 'input'}",
            f"--set=mlflow.tracking_uri=sqlite:///{tmp_path}/dry.db", "--set=pipeline.batch_chains=12", "--dry-run"]
    with pytest.raises(SystemExit) as stop, Fakes().installed():
        pipeline.main(argv)
    assert stop.value.code == 0
    assert _state(spark, settings) == before  # no table has a new version
    assert not (tmp_path / "dry.db").exists()  # no MLflow run either
    out = capsys.readouterr().out
    # The copied input folder's files are new paths to `input_files`; by chain id only the 2 new chains are new.
    assert "ingest: reads 3 input files (3 new or changed)" in out and "would add 2 chains" in out
    assert "steps: would do 2 chains (0 waiting now, up to 2 from the stages before)" in out
    assert f"reads  chains: version {before['chains']}, 24 rows" in out
    assert f"writes chain_scores: version {before['chain_scores']}, 24 rows, 24 under config hash" in out


@pytest.mark.slow  # 2-3 min each on 2 cores: CI runs them in make test-slow
def test_run_raising_mid_scoring_then_rerun_equals_clean_run(spark, clean_run, tmp_path):
    settings = _clean_settings(clean_run.input, tmp_path / "lake", tmp_path)
    crashing = Fakes(fail_nli_call=2)  # batch 1 of 2 commits, batch 2 raises
    with pytest.raises(RuntimeError, match="injected failure"):
        _run(spark, settings, crashing)
    scored_first = tables.read(spark, settings.table("step_scores")).select("chain_id").distinct().count()
    assert 0 < scored_first < 24
    assert not tables.exists(spark, settings.table("chain_scores"))
    resumed = Fakes()
    _run(spark, settings, resumed)
    # Only the missing work: steps were all done, scoring resumes with the chains not scored yet.
    assert resumed.seen_steps == []
    assert len(resumed.seen_nli) == 24 - scored_first
    _assert_lakes_equal(spark, settings, _clean_settings(clean_run.input, clean_run.lake, tmp_path))


def _assert_lakes_equal(spark, a, b) -> None:
    """Every result table equal row for row (timestamps and run ids aside); absent from both counts as equal."""
    for name in RESULT_TABLES:
        present = tables.exists(spark, a.table(name)), tables.exists(spark, b.table(name))
        assert present[0] == present[1], name
        if present[0]:
            assertDataFrameEqual(_stable(spark, a, name), _stable(spark, b, name))


@pytest.mark.slow  # 2-3 min each on 2 cores: CI runs them in make test-slow
def test_run_changed_model_scores_under_new_hash_only(spark, clean_run, tmp_path):
    settings = _copy_of_clean(clean_run, tmp_path)
    old_hash = settings.scoring_hash()
    old_rows = {n: _stable(spark, settings, n).collect() for n in ("steps", "step_scores", "chain_scores", "curated")}
    # One batch per stage: what is checked is which hash the rows go under (batches: the crash test above).
    changed = _clean_settings(clean_run.input, tmp_path / "lake", tmp_path, "models.nli.path=models/another-nli",
                              "pipeline.batch_chains=24")
    assert changed.scoring_hash() != old_hash
    fakes = Fakes()
    summary = _run(spark, changed, fakes)
    assert len(fakes.seen_nli) == 24
    assert summary.stages[0].skipped  # no new input: only the new hash's rows are written
    for name, rows in old_rows.items():
        assertDataFrameEqual(_stable(spark, settings, name).where(F.col("config_hash") == old_hash), rows)
    per_hash = dict(tables.read(spark, settings.table("chain_scores")).groupBy("config_hash").count().collect())
    assert per_hash == {old_hash: 24, changed.scoring_hash(): 24}


@pytest.mark.slow
def test_run_rescore_recomputes_current_hash(spark, clean_run, tmp_path):
    settings = _copy_of_clean(clean_run, tmp_path)
    expected = {n: _stable(spark, settings, n).collect() for n in ("step_scores", "chain_scores", "curated")}
    fakes = Fakes()
    rescore = _clean_settings(clean_run.input, tmp_path / "lake", tmp_path, "pipeline.rescore=true",
                              "pipeline.batch_chains=24")  # one batch per stage, as in the changed-model test
    _run(spark, rescore, fakes)
    assert len(fakes.seen_nli) == 24
    for name, rows in expected.items():
        assertDataFrameEqual(_stable(spark, settings, name), rows)


@pytest.mark.slow  # 2-3 min each on 2 cores: CI runs them in make test-slow
def test_run_failed_chains_recorded_once_and_not_retried(spark, make_settings, tmp_path):
    folder = tmp_path / "small_input"
    folder.mkdir()
    _new_chains_file(folder, ["fails-at-steps"], "bad_steps.jsonl")
    text = (folder / "bad_steps.jsonl").read_text().replace("First step", QUARANTINE_MARK)
    (folder / "bad_steps.jsonl").write_text(text)
    _new_chains_file(folder, ["fails-at-nli", "scores-fine"], "two.jsonl")
    stages = "pipeline.stages=[ingest,steps,scores,aggregate]"  # curation of the one good chain checks nothing here
    settings = _settings(make_settings, folder, stages)
    summary = _run(spark, settings, Fakes(error_chain="fails-at-nli"))
    unscored = {r["chain_id"]: r["stage"] for r in tables.read(spark, settings.table("unscored")).collect()}
    assert unscored == {"fails-at-steps": "steps", "fails-at-nli": "scores"}
    delta_readers.compare_readers(spark, settings.table("unscored"))  # the one table a clean night does not make
    assert summary.rows_after["chain_scores"] == 1
    q = tables.read(spark, settings.table("quarantine")).where(F.col("chain_id").isNotNull())
    reasons = sorted((r["chain_id"], r["stage"], r["reason"]) for r in q.collect())
    # The NLI failure quarantines every step of its chain (3 steps).
    assert reasons == [("fails-at-nli", "score", "nli_error")] * 3 + [("fails-at-steps", "steps", "fake_failure")]
    again = Fakes(error_chain="fails-at-nli")
    _run(spark, _settings(make_settings, folder, stages, "pipeline.skip_unchanged_input=false"), again)
    assert again.seen_steps == [] and again.nli_calls == 0


def test_main_logs_parent_run_with_stage_children(spark, clean_run):
    from mlflow.tracking import MlflowClient

    settings = clean_run.settings
    client = MlflowClient(settings.mlflow.tracking_uri)
    parent = client.get_run(clean_run.summary.mlflow_run_id)
    assert parent.data.tags["version_after.chain_scores"] == str(tables.version(spark, settings.table("chain_scores")))
    assert parent.data.metrics["rows.chain_scores"] == 24
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    by_name = {c.data.tags["mlflow.runName"]: c for c in children}
    assert set(by_name) == {"ingest", "steps", "scores", "aggregate", "curate"}
    scores = by_name["scores"].data
    assert scores.tags["input_version.steps"] == str(tables.version(spark, settings.table("steps")))
    assert scores.tags["output_version_before.step_scores"] == "None"
    assert scores.metrics["chains"] == 24
    curate = by_name["curate"]
    assert "pass_rate.all" in curate.data.metrics
    artifacts = {a.path for a in client.list_artifacts(curate.info.run_id, "curation")}
    assert "curation/hist_intra_entail.png" in artifacts and "curation/rules.json" in artifacts
    reports = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert reports == {"report/pipeline_report.html"}
    # The Delta tables each stage read and wrote, with their versions, as MLflow dataset inputs.
    written = {(d.dataset.name, d.tags[0].value) for d in by_name["scores"].inputs.dataset_inputs}
    assert written == {("steps", "input"), ("contexts", "input"), ("step_scores", "output")}
    assert parent.info.status == "FINISHED" and all(c.info.status == "FINISHED" for c in children)


def test_report_of_the_clean_run_shows_worst_chains_and_quarantine(spark, clean_run):
    """The nightly report (jobs.receval.report) as the pipeline's report stage built it over the clean run."""
    from jobs.receval import report
    from schemas import chain_scores as CS

    settings = clean_run.settings
    summary = clean_run.summary
    page = summary.report_html
    assert page is not None and "chains curated in this run" in page
    lowest = (
        tables.read(spark, settings.table("chain_scores"))
        .orderBy(CS.min_col("intra_entail"), CS.CHAIN_ID).first()[CS.CHAIN_ID]
    )
    section = page.split("<h3>intra_entail</h3>")[1].split("<h3>")[0]
    assert section.index(f"<b>{lowest}</b>") >= 0
    assert section.count('<div class="chain">') == 2  # pipeline.report_worst_n=2
    # One histogram per chain score column (CS.score_columns(), the arithmetic check's arith_valid_min too), the
    # night-over-night chart.
    assert page.count("data:image/png;base64,") == len(CS.score_columns()) + 1 == 6
    # Written next to the lake as well as to MLflow, the same page.
    assert Path(summary.report_file).parent == Path(settings.paths.lake) / "_reports"
    assert Path(summary.report_file).read_text() == page
    # Quarantine by reason: the sample lake's 4 bad rows, all quarantined by this run.
    expected = (
        tables.read(spark, settings.table("quarantine")).groupBy("stage", "reason").count().collect()
    )
    quarantine = page.split("<h2>Quarantine by reason</h2>")[1].split("<h2>")[0]
    assert sum(r["count"] for r in expected) == 4
    for r in expected:
        assert (f"<tr><td>{r['stage']}</td><td>{report.esc(r['reason'])}</td><td class=\"num\">{r['count']}</td>"
                f"<td class=\"num\">{r['count']}</td></tr>") in quarantine


# -- the lake without Spark (README "Reading the lake without Spark") ----------------------------------------
# The tables every night writes; a reader comparison that found fewer would have checked nothing.
NIGHT_TABLES = {"chains", "quarantine", "input_files", "steps", "contexts", "step_scores", "chain_scores",
                "curation", "curated", "rejected"}


def _readable_without_spark(spark, lake: Path, names: list[str]) -> dict[str, tuple]:
    """Tables of `lake`: protocol reader version 1 with no reader features (what delta-rs and polars read,
    README), and the same columns and rows through deltalake (pandas) and polars as through Spark; returns
    Spark's schema and rows per table."""
    spark_read = {}
    for name in names:
        protocol = deltalake.DeltaTable(str(lake / name)).protocol()
        # Deletion vectors and column mapping are reader features (reader versions 2-3): deltalake 1.6.6 refuses
        # the first and reads the second as nulls (README). Nothing the project sets may bring either in.
        assert (protocol.min_reader_version, protocol.reader_features) == (1, None), (name, protocol)
        spark_read[name] = delta_readers.compare_readers(spark, str(lake / name))
        assert spark_read[name][1], name  # every table of a night holds rows: an empty one compares nothing
    return spark_read


def test_every_table_reads_the_same_without_spark(spark, clean_run):
    names = delta_readers.lake_tables(clean_run.lake)
    assert NIGHT_TABLES <= set(names), names  # a comparison that found fewer tables would have checked nothing
    spark_read = _readable_without_spark(spark, clean_run.lake, names)
    # curated and rejected keep a change data feed: through deltalake it holds the night's inserts, every row.
    for name in clean_run.settings.maintain.change_feed:
        schema, rows = spark_read[name]
        feed = delta_readers.change_feed_inserts(clean_run.lake / name, 0)
        assert delta_readers.canonical(feed, schema) == rows, name
        # A reader with nothing new to read is refused, not answered with no rows (docs/OPERATIONS.md guards it).
        latest = deltalake.DeltaTable(str(clean_run.lake / name)).version()
        with pytest.raises(deltalake.exceptions.DeltaError, match="Invalid table version"):
            delta_readers.change_feed_inserts(clean_run.lake / name, latest + 1)


# chain_scores stands for the clustered tables (steps and step_scores get the same layout: liquid clustering by
# config_hash, writer features domainMetadata + clustering), curated for the change-feed ones (rejected). The
# other tables' files and protocol are as before upkeep, already compared above; maintaining and comparing every
# table took 80-100 s on 2 busy cores: the slow test below does.
MAINTAINED = ["chain_scores", "curated"]


def _maintained_copy(spark, clean: CleanRun, tmp_path: Path, names: list[str] | None) -> tuple[Settings, dict]:
    """A copy of the clean run's lake after the upkeep job (OPTIMIZE with clustering, VACUUM of every old file):
    the layout and protocol a week of nights leaves (`names` None: every table, by the job's main); returns the
    version of each table maintained before upkeep."""
    settings = _copy_of_clean(clean, tmp_path, "maintain.retention_hours=0")
    lake = Path(settings.paths.lake)
    maintained = names or delta_readers.lake_tables(lake)
    before = {name: tables.version(spark, settings.table(name)) for name in maintained}
    if names is None:
        argv = [f"--set={key}={value}" for key, value in _clean_overrides(clean.input, lake, tmp_path)]
        maintain.main([*argv, "--set=maintain.retention_hours=0"])
    else:
        maintain.run(spark, settings, names)
    return settings, before


def _check_maintained(spark, settings: Settings, before: dict) -> None:
    lake = Path(settings.paths.lake)
    for name in before:
        assert tables.version(spark, settings.table(name)) > before[name], name  # upkeep did commit
        # The features the test is about are there: liquid clustering (maintain.cluster_by), the change feed.
        features = deltalake.DeltaTable(settings.table(name)).protocol().writer_features or []
        if name in settings.maintain.cluster_by:
            assert "clustering" in features, (name, features)
        if name in settings.maintain.change_feed:
            assert "changeDataFeed" in features, (name, features)
    _readable_without_spark(spark, lake, list(before))
    # Compaction is no change: a feed reader that had read up to the night finds nothing new after upkeep.
    for name in settings.maintain.change_feed:
        if name in before:
            assert delta_readers.change_feed_inserts(lake / name, before[name] + 1) == [], name


def test_clustered_and_change_feed_tables_read_the_same_without_spark_after_upkeep(spark, clean_run, tmp_path):
    settings, before = _maintained_copy(spark, clean_run, tmp_path, MAINTAINED)
    _check_maintained(spark, settings, before)


@pytest.mark.slow  # the upkeep job over all ten tables: 80-100 s on 2 busy cores
def test_every_table_reads_the_same_without_spark_after_the_upkeep_job(spark, clean_run, tmp_path):
    settings, before = _maintained_copy(spark, clean_run, tmp_path, None)
    _check_maintained(spark, settings, before)
