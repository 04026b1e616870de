"""jobs/receval/api.py: a DataFrame of chains -> step and chain scores, nothing written and no MLflow run unless
asked; the settings `receval pipeline` resolves, and a write that holds the lake's claim as a night does. Equality
with the pipeline's tables on the sample lake: tests/jobs/test_pipeline_offline.py (slow)."""

from __future__ import annotations

import json
import os
import re

import pytest
from conftest import SAMPLE_LAKE, sqlite_store
from pyspark.testing import assertDataFrameEqual
from test_claim import _plant
from test_model_profiles import build_small

from jobs.infra import claim, cli, stage, tables
from jobs.infra.stage import settings_of, with_built_models
from jobs.receval import aggregate, api, pipeline
from jobs.receval.api import score_chains, settings_for

GSM = SAMPLE_LAKE / "gsm8k_sample.jsonl"


def test_overrides_as_a_mapping_are_the_same_set_pairs():
    pairs = settings_for(["runtime.batch_size=8", "localise.metrics=[inter]", "ingest.preset=chat"])
    mapping = settings_for({"runtime.batch_size": 8, "localise.metrics": ["inter"], "ingest.preset": "chat"})
    assert mapping == pairs
    assert (mapping.runtime.batch_size, mapping.localise.metrics, mapping.ingest.preset) == (8, ["inter"], "chat")
    with pytest.raises(TypeError, match="not one string"):
        settings_for("runtime.batch_size=8")


@pytest.mark.parametrize("built", [True, False], ids=["small-built", "not-built"])
def test_settings_are_the_ones_receval_pipeline_runs_with(built, tmp_path, monkeypatch):
    # Issue 57: settings_for read the layers alone, so after `make models` a notebook scored with the offline models
    # (another config hash) while `receval pipeline` used the small ones. Only the marker files: no training.
    monkeypatch.setenv("RECEVAL_HOME", str(build_small(tmp_path / "home") if built else tmp_path))
    monkeypatch.delenv("RECEVAL__MODELS__PROFILE", raising=False)
    lake = tmp_path / "lake"
    pairs = [f"paths.lake={lake}", f"paths.checkpoints={lake}/_checkpoints", "pipeline.batch_chains=7"]
    argv = [arg for pair in pairs for arg in ("--set", pair)]
    resolved = []  # what `receval pipeline ... --print-config` resolves (its describe sees the settings)
    monkeypatch.setattr(stage, "describe", lambda settings, sources: resolved.append(settings) or "")
    assert cli.main(["pipeline", *argv, "--print-config"]) == 0
    [night] = resolved
    adds_small = with_built_models(argv) != argv
    assert adds_small is built and night.models.profile == ("small" if built else "offline")
    ours = settings_for(pairs)
    assert ours.models.profile == night.models.profile and ours.scoring_hash() == night.scoring_hash()
    assert ours == night
    # run_pipeline hands the pipeline the command line `receval pipeline` would get, profile included.
    handed = []
    monkeypatch.setattr(pipeline, "main", lambda argv: handed.append(argv))
    api.run_pipeline(lake, overrides={"pipeline.batch_chains": 7})
    assert settings_of(handed[0]) == night
    # A profile chosen by the caller, as an override or in a --config file, wins over the built small models.
    config = tmp_path / "mine.yaml"
    config.write_text("models:\n  profile: offline\n")
    assert settings_for([*pairs, "models.profile=offline"]).models.profile == "offline"
    assert settings_for(pairs, config).models.profile == "offline"
    api.run_pipeline(lake, overrides={"pipeline.batch_chains": 7, "models.profile": "offline"})
    assert settings_of(handed[1]).models.profile == "offline"


@pytest.fixture
def two_chains(spark, tmp_path):
    """The sample lake's first two GSM-8K chains, read as a notebook would: spark.read.json (this project's rows)."""
    lines = GSM.read_text().splitlines()[:2]
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return spark.read.json(str(path)), [json.loads(line)["chain_id"] for line in lines]


def test_score_chains_scores_a_frame_and_writes_nothing_unless_asked(spark, tiny_models, two_chains, tmp_path):
    df, ids = two_chains
    lake, store = tmp_path / "lake", tmp_path / "mlruns.db"
    overrides = [f"paths.lake={lake}", f"mlflow.tracking_uri={sqlite_store(store)}", "models.profile=offline"]
    store.unlink()  # sqlite_store lays out a template store: its absence shows no run was opened
    with score_chains(df, overrides) as scores:
        assert sorted(r.chain_id for r in scores.chain_scores.collect()) == sorted(ids)
        assert scores.quarantine.count() == 0
        steps = scores.steps.groupBy("chain_id").count()
        assert steps.count() == 2
        # Every step of both chains scored, under the config hash of these settings.
        assert scores.step_scores.count() == scores.steps.count() > 2
        assert {r.config_hash for r in scores.step_scores.select("config_hash").distinct().collect()} == {
            scores.settings.scoring_hash()} == {scores.config_hash}
        # Chain scores are the aggregate of the step scores returned beside them.
        assertDataFrameEqual(scores.chain_scores.drop("scored_at"),
                             aggregate.transform(scores.step_scores, scores.settings.aggregate).drop("scored_at"))
        assert scores.written == {} and scores.mlflow_run_id is None
    assert not lake.exists() and not store.exists()


@pytest.mark.slow  # two more scoring passes (137 s on a quiet host); the default set scores once (above)
def test_score_chains_writes_the_lake_and_tracks_when_asked(spark, tiny_models, two_chains, tmp_path):
    from mlflow.tracking import MlflowClient

    df, ids = two_chains
    lake, store = tmp_path / "lake", sqlite_store(tmp_path / "mlruns.db")
    overrides = {"paths.lake": str(lake), "mlflow.tracking_uri": store, "models.profile": "offline"}
    with score_chains(df, overrides, write=True, track=True) as scores:
        assert scores.written["chains"] == 2 and scores.written["chain_scores"] == 2
        assert scores.written["step_scores"] == scores.step_scores.count()
        written = tables.read(spark, str(lake / "chain_scores")).drop("scored_at")
        assertDataFrameEqual(written, scores.chain_scores.drop("scored_at"))
        run = MlflowClient(store).get_run(scores.mlflow_run_id)
    assert run.info.run_name == "score_chains" and run.info.status == "FINISHED"
    assert run.data.metrics["scored_chains"] == 2 and run.data.metrics["written.chains"] == 2
    # The write held the lake's claim under the run's id, as a night does, and gave it back.
    holder = claim.latest(lake / claim.FOLDER)
    assert (holder.job, holder.released) == ("score_chains", True)
    assert run.data.tags["lake_claim.generation"] == str(holder.generation)
    # Written as the pipeline writes: a second call inserts nothing.
    with score_chains(df, overrides, write=True) as again:
        assert again.written["chains"] == 0 and again.written["chain_scores"] == 0


def _files(folder):
    return {path.relative_to(folder): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def _without_age(line: str) -> str:
    return re.sub(r"last heartbeat \d+ \w+ ago", "last heartbeat ... ago", line)


def test_a_write_while_a_night_holds_the_lake_fails_as_the_clis_busy_exit(spark, tiny_models, two_chains,
                                                                          tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    df, _ = two_chains
    lake, store = tmp_path / "lake", sqlite_store(tmp_path / "mlruns.db")
    _plant(tmp_path, 0)  # a night on another host, heartbeat fresh: live (tests/test_claim.py)
    before = _files(lake)
    # The claim is checked before anything is computed: a busy lake costs no scoring.
    monkeypatch.setattr(api, "_score", lambda *args: pytest.fail("scored although the lake was busy"))
    overrides = [f"paths.lake={lake}", f"mlflow.tracking_uri={store}", f"mlflow.artifact_location={tmp_path}/art",
                 "models.profile=offline", "pipeline.claim_ttl=3600"]
    with pytest.raises(claim.LakeBusy) as busy:
        score_chains(df, overrides, write=True)
    assert busy.value.holder.run_id == "run-0" and f"exit {claim.EXIT_BUSY}" in str(busy.value)
    with pytest.raises(claim.LakeBusy):
        score_chains(df, overrides, write=True, track=True)
    # `receval pipeline` on the same lake: exit 75 and the line it prints is the exception's message.
    assert cli.main(["pipeline", *[arg for pair in overrides for arg in ("--set", pair)]]) == claim.EXIT_BUSY
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pipeline: ")]
    assert _without_age(line) == _without_age(f"pipeline: {busy.value}")
    # Both recorded their skipped run as the CLI does; the untracked write opened none.
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("receval").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["pipeline", "score_chains"]
    assert all(r.data.tags["receval.skipped"] == "lake busy" and r.data.tags["lake_claim.holder_run"] == "run-0"
               for r in runs)
    assert _files(lake) == before  # no table, no new claim generation: the night's claim file as planted


def test_a_write_holds_the_claim_while_it_computes_and_gives_it_back_on_error(spark, tiny_models, two_chains,
                                                                             tmp_path, monkeypatch):
    df, _ = two_chains
    lake = tmp_path / "lake"
    seen = []

    def failing(*args):
        seen.append(claim.latest(lake / claim.FOLDER))
        raise RuntimeError("scoring failed")

    monkeypatch.setattr(api, "_score", failing)
    with pytest.raises(RuntimeError, match="scoring failed"):
        score_chains(df, [f"paths.lake={lake}", "models.profile=offline"], write=True)
    [holder] = seen
    assert (holder.job, holder.pid, holder.released) == ("score_chains", os.getpid(), False)
    assert claim.latest(lake / claim.FOLDER).released
    # Without `write` nothing is written, the claim included.
    other = tmp_path / "other"
    with pytest.raises(RuntimeError, match="scoring failed"):
        score_chains(df, [f"paths.lake={other}", "models.profile=offline"])
    assert not other.exists()


def test_score_chains_quarantines_bad_rows_with_ingests_reasons(spark, tiny_models, tmp_path):
    # Rows as JSON text (spark.read.text's `value`): a line that is not JSON is a row too.
    raw = spark.read.text(str(SAMPLE_LAKE / "bad_rows.jsonl"))
    overrides = [f"paths.lake={tmp_path / 'lake'}", "models.profile=offline"]  # the tiny models, built or not small
    with score_chains(raw, overrides, json_column="value", source="notebook") as scores:
        assert scores.chain_scores.count() == 0 and scores.step_scores.count() == 0
        got = {(r.reason, r.raw) for r in scores.quarantine.select("reason", "raw").collect()}
        sources = {r.source for r in scores.quarantine.select("source").collect()}
    # tests/data/sample_lake/bad_rows.jsonl, line by line: no context; a blank chain; steps not a list; not JSON.
    lines = (SAMPLE_LAKE / "bad_rows.jsonl").read_text().splitlines()
    assert got == {("missing_context", lines[0]), ("empty_chain", lines[1]), ("wrong_type", lines[2]),
                   ("not_json", lines[3])}
    assert sources == {"notebook"}
    assert not (tmp_path / "lake").exists()


def test_a_missing_model_fails_before_any_spark_job(spark, two_chains, tmp_path):
    from udfs.runtime import ModelUnavailable

    df, _ = two_chains
    with pytest.raises(ModelUnavailable, match=r"models\.nli\.path"):
        score_chains(df, [f"models.nli.path={tmp_path / 'nowhere'}", f"paths.lake={tmp_path / 'lake'}"])
