"""jobs.receval.train_pvi: training pairs from gold chains, and an end-to-end fine-tune of the tiny T5 logged to MLflow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tolerance import loglik_approx

from jobs.infra.config import PROJECT_ROOT, resolve_path
from jobs.receval import train_pvi as T

# The first 20 EB task_1 dev trees (tests/data/README.md): enough for the pair counts and a smoke training.
EB_DEV = str(PROJECT_ROOT / "tests" / "data" / "entailment_bank" / "task_1_dev_head.jsonl")

# A two-step EB tree written by hand: sent1 & sent2 -> int1; int1 & sent3 -> hypothesis.
EB_ROW = {
    "id": "q1",
    "question": "Why?",
    "hypothesis": "the coat helps survival",
    "proof": "sent1 & sent2 -> int1: a coat keeps warm; int1 & sent3 -> hypothesis; ",
    "meta": {
        "triples": {"sent1": "fur is thick", "sent2": "thick fur keeps warm", "sent3": "warmth helps survival"},
        "intermediate_conclusions": {"int1": "a coat keeps warm"},
    },
}


def test_chain_pairs_eb_tree_all_kinds():
    assert T.chain_pairs(EB_ROW, "g") == [
        ("Generate entailed sentence: fur is thick & thick fur keeps warm ->", " a coat keeps warm"),
        # int1 is an earlier conclusion: it comes once, after the step's own facts
        ("Generate entailed sentence: warmth helps survival & a coat keeps warm ->", " the coat helps survival"),
    ]
    assert T.chain_pairs(EB_ROW, "g_null") == [
        ("Generate entailed sentence: None ->", " a coat keeps warm"),
        ("Generate entailed sentence: None ->", " the coat helps survival"),
    ]
    assert T.chain_pairs(EB_ROW, "info_gain") == [
        ("Generate final answer: Therefore,", " the coat helps survival"),
        ("Generate final answer: fur is thick and thick fur keeps warm, so a coat keeps warm. Therefore,",
         " the coat helps survival"),
        ("Generate final answer: fur is thick and thick fur keeps warm, so a coat keeps warm. warmth helps "
         "survival, so the coat helps survival. Therefore,", " the coat helps survival"),
    ]


def test_chain_pairs_generic_step_list():
    row = {"steps": ["She has 3 apples.", "She eats 1, so 2 are left."], "answer": "2"}
    assert T.chain_pairs(row, "g") == [
        ("Generate entailed sentence: None ->", " She has 3 apples."),
        ("Generate entailed sentence: She has 3 apples. ->", " She eats 1, so 2 are left."),
    ]
    assert len(T.chain_pairs(row, "info_gain")) == 3  # L(0..2)
    with pytest.raises(ValueError, match="proof"):
        T.chain_pairs({"x": 1}, "g")


def test_build_pairs_real_eb_dev_counts_one_g_pair_per_proof_step():
    rows = T.load_rows(EB_DEV, limit=20)
    pairs = T.build_pairs(rows, "g")
    assert len(pairs) == sum(r["proof"].count("->") for r in rows)
    assert all(s.startswith("Generate entailed sentence: ") and s.endswith(" ->") for s, _ in pairs)


@pytest.mark.slow
def test_main_trains_logs_model_and_scoring_loads_it(make_settings, tmp_path, spark):
    import mlflow
    from mlflow.tracking import MlflowClient

    from jobs.infra.tracking import tracking_uri
    from jobs.receval import pvi_scores

    overrides = [
        "train_pvi.kind=g", f"train_pvi.output_dir={tmp_path}/pvi", f"train_pvi.train_path={EB_DEV}",
        f"train_pvi.dev_path={EB_DEV}", "train_pvi.max_train_rows=48", "train_pvi.max_dev_rows=8",
        "train_pvi.epochs=4", "train_pvi.patience=10", "train_pvi.lr=0.003", "train_pvi.batch_size=16",
        "train_pvi.eval_max_new_tokens=8", "runtime.device=cpu",
    ]
    settings = make_settings(*overrides)
    base = [f"--set={o}" for o in overrides] + [f"--set=mlflow.tracking_uri={settings.mlflow.tracking_uri}",
                                                 f"--set=mlflow.artifact_location={settings.mlflow.artifact_location}"]
    uri = T.main(base)
    out = Path(tmp_path) / "pvi" / "g"
    history = json.loads((out / "train_pvi.json").read_text())["history"]
    assert len(history) == 4
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert history[-1]["dev_loss"] < history[0]["dev_loss"]

    run_id = uri.split("/")[1]
    client = MlflowClient(tracking_uri(settings))
    assert [m.step for m in client.get_metric_history(run_id, "train_loss")] == [1, 2, 3, 4]
    assert client.get_run(run_id).data.params["train_pvi.lr"] == "0.003"
    local = Path(
        mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "dl"), tracking_uri=tracking_uri(settings))
    )
    assert (local / "model.safetensors").exists() and (local / "config.json").exists()

    # The scoring job loads the trained model by the path the job wrote (and the MLflow copy equally).
    from schemas import steps as ST

    steps = spark.createDataFrame(
        [("c", "h", 0, 1, "Fur is thick, so a coat keeps warm.", ["fur is thick"], "a coat keeps warm",
          "sentence", "position", "x")], ST.SCHEMA)
    ctx = spark.createDataFrame([("c", "h", [], "warm", "given")], ST.CONTEXTS_SCHEMA)
    scores = []
    for path in (out, local):
        s = make_settings(f"models.pvi_g.path={path}", "runtime.device=cpu")
        scores.append(pvi_scores.transform(steps, ctx, s).first())
    assert scores[0].pvi_model == str(out)
    assert scores[0].pvi_g_logp == loglik_approx(scores[1].pvi_g_logp)  # same weights: float32 rounding
    base_g = pvi_scores.transform(steps, ctx, make_settings("runtime.device=cpu")).first().pvi_g_logp
    assert scores[0].pvi_g_logp != loglik_approx(base_g)  # trained weights, not the base model
    assert resolve_path(str(out)) == out


def test_train_early_stops_when_dev_rouge_stalls(tmp_path, settings):
    # lr ~ 0: dev ROUGE-L cannot improve after epoch 1, so patience 1 stops after epoch 2 of 5.
    cfg = settings.train_pvi.model_copy(update={"epochs": 5, "patience": 1, "lr": 1e-12, "batch_size": 4,
                                                 "eval_max_new_tokens": 4})
    pairs = T.build_pairs([EB_ROW], "g")
    history = T.train(pairs, pairs, cfg, tmp_path / "m")
    assert [h["epoch"] for h in history] == [1, 2]
    assert (tmp_path / "m" / "model.safetensors").exists()  # the best (first) epoch was saved
