"""jobs/receval/api.py: a DataFrame of chains -> step and chain scores, nothing written and no MLflow run unless
asked. Equality with the pipeline's tables on the sample lake: tests/jobs/test_pipeline_offline.py (slow)."""

from __future__ import annotations

import json

import pytest
from conftest import SAMPLE_LAKE, sqlite_store
from pyspark.testing import assertDataFrameEqual

from jobs.infra import tables
from jobs.receval import aggregate
from jobs.receval.api import score_chains, settings_for

GSM = SAMPLE_LAKE / "gsm8k_sample.jsonl"


def test_overrides_as_a_mapping_are_the_same_set_pairs():
    pairs = settings_for(["runtime.batch_size=8", "localise.metrics=[inter]", "ingest.preset=chat"])
    mapping = settings_for({"runtime.batch_size": 8, "localise.metrics": ["inter"], "ingest.preset": "chat"})
    assert mapping == pairs
    assert (mapping.runtime.batch_size, mapping.localise.metrics, mapping.ingest.preset) == (8, ["inter"], "chat")
    with pytest.raises(TypeError, match="not one string"):
        settings_for("runtime.batch_size=8")


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
    # Written as the pipeline writes: a second call inserts nothing.
    with score_chains(df, overrides, write=True) as again:
        assert again.written["chains"] == 0 and again.written["chain_scores"] == 0


def test_score_chains_quarantines_bad_rows_with_ingests_reasons(spark, tiny_models, tmp_path):
    # Rows as JSON text (spark.read.text's `value`): a line that is not JSON is a row too.
    raw = spark.read.text(str(SAMPLE_LAKE / "bad_rows.jsonl"))
    with score_chains(raw, [f"paths.lake={tmp_path / 'lake'}"], json_column="value", source="notebook") as scores:
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
