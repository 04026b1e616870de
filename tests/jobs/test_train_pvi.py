"""jobs.training.train_pvi: training pairs from gold chains, and an end-to-end fine-tune of the tiny T5 logged to MLflow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tolerance import loglik_approx

from jobs.infra.config_paths import PROJECT_ROOT, resolve_path
from jobs.training import train_pvi as T

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
        ("Generate entailed sentence:  ->", " She has 3 apples."),  # no premise text: the official empty join
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


def test_corpus_is_every_kinds_strings_once_in_first_seen_order():
    texts = T.corpus([EB_ROW, EB_ROW])
    expected = []
    for kind in T.KINDS:
        for pair in T.chain_pairs(EB_ROW, kind):
            expected += [t for t in pair if t not in expected]
    assert texts == expected
    assert "Generate entailed sentence: None ->" in texts and " the coat helps survival" in texts


SCRATCH = {"d_model": 32, "layers": 1, "heads": 2, "d_ff": 64, "vocab": 400}  # test-sized scratch T5


def test_scratch_base_is_deterministic_and_its_tokenizer_round_trips(tmp_path, settings):
    from transformers import AutoTokenizer

    cfg = settings.train_pvi.model_copy(update={"scratch": settings.train_pvi.scratch.model_copy(update=SCRATCH)})
    texts = T.corpus(T.load_rows(EB_DEV))
    one = T.build_scratch_base(texts, cfg, tmp_path / "one")
    two = T.build_scratch_base(texts, cfg, tmp_path / "two")
    for name in ("tokenizer.json", "model.safetensors"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    config = json.loads((one / "config.json").read_text())
    assert (config["model_type"], config["d_model"], config["num_layers"], config["d_ff"]) == ("t5", 32, 1, 64)
    tok = AutoTokenizer.from_pretrained(one)
    assert tok.vocab_size == 400
    # Byte-level BPE: any text, seen or not, decodes back exactly; EOS closes every target (the model learns to
    # stop; scoring leaves EOS out of meanlogp).
    for text in (texts[0], " a coat keeps warm", "Öl & 水 -> 42%"):
        ids = tok(text)["input_ids"]
        assert ids[-1] == tok.eos_token_id and tok.decode(ids, skip_special_tokens=True) == text


def test_run_from_scratch_gives_every_kind_one_tokenizer(make_settings, tmp_path):
    from transformers import AutoTokenizer

    scratch = [f"train_pvi.scratch.{k}={v}" for k, v in SCRATCH.items()]
    folders = {}
    for kind in T.KINDS:
        settings = make_settings("train_pvi.base_model=scratch", f"train_pvi.kind={kind}", f"train_pvi.train_path={EB_DEV}",
                                 f"train_pvi.dev_path={EB_DEV}", f"train_pvi.output_dir={tmp_path / 'pvi'}",
                                 "train_pvi.epochs=1", "train_pvi.max_steps=2", "train_pvi.max_dev_rows=2",
                                 "train_pvi.eval_max_new_tokens=4", *scratch)
        folders[kind], _ = T.run(settings)
        record = json.loads((folders[kind] / "train_pvi.json").read_text())
        assert record["kind"] == kind and record["settings"]["base_model"] == "scratch"
        assert record["base_model_dir"] == str(tmp_path / "pvi" / "scratch-base")
    # PVI subtracts g' log-likelihoods from g's for the same target tokens: one tokenizer for all three kinds.
    vocabs = {kind: (folder / "tokenizer.json").read_bytes() for kind, folder in folders.items()}
    assert len(set(vocabs.values())) == 1
    target = " a coat keeps warm"
    ids = {kind: AutoTokenizer.from_pretrained(folder)(target)["input_ids"] for kind, folder in folders.items()}
    assert ids["g"] == ids["g_null"] == ids["info_gain"]


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
        scores.append(pvi_scores.transform(steps, ctx, s.pvi, s.models, s.runtime).first())
    assert scores[0].pvi_model == str(out)
    assert scores[0].pvi_g_logp == loglik_approx(scores[1].pvi_g_logp)  # same weights: float32 rounding
    base = make_settings("runtime.device=cpu")
    base_g = pvi_scores.transform(steps, ctx, base.pvi, base.models, base.runtime).first().pvi_g_logp
    assert scores[0].pvi_g_logp != loglik_approx(base_g)  # trained weights, not the base model
    assert resolve_path(str(out)) == out


class ScriptedDev:
    """Dev evaluation whose ROUGE-L per epoch is given (the checkpoint choice must follow it); the dev loss is the
    model's real loss, and a copy of the weights is kept at every evaluation to compare with what was saved."""

    def __init__(self, rouges: list[float], losses: list[float] | None = None) -> None:
        self.rouges, self.losses, self.weights = rouges, losses, []

    def __call__(self, model, tokenizer, pairs, cfg, device):
        import torch

        self.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        with torch.inference_mode():
            loss = float(model(**T._collate(tokenizer, pairs, cfg, device)).loss)
        epoch = len(self.weights) - 1
        return (self.losses[epoch] if self.losses else loss), self.rouges[epoch]


def saved_equals(folder: Path, weights: dict) -> bool:
    import torch
    from safetensors.torch import load_file

    saved = load_file(str(folder / "model.safetensors"))
    return all(torch.equal(saved[k], weights[k]) for k in saved)


def test_train_keeps_the_best_dev_epoch_not_the_last(tmp_path, settings):
    # A real learning rate: the weights differ after every epoch, so the saved file tells which epoch was kept.
    cfg = settings.train_pvi.model_copy(update={"epochs": 4, "patience": 10, "lr": 1e-3, "batch_size": 4})
    pairs = T.build_pairs([EB_ROW], "g")
    dev = ScriptedDev([0.2, 0.6, 0.4, 0.5])  # best: epoch 2
    history = T.train(pairs, pairs, cfg, tmp_path / "m", evaluate_fn=dev)
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    assert [h["kept"] for h in history] == [0.0, 1.0, 0.0, 0.0]
    assert max(range(4), key=lambda e: history[e]["dev_rouge_l"]) == 1
    assert saved_equals(tmp_path / "m", dev.weights[1])
    assert not saved_equals(tmp_path / "m", dev.weights[3])  # the last epoch's weights were not kept
    assert not saved_equals(tmp_path / "m", dev.weights[2])


def test_train_select_on_loss_keeps_the_lowest_dev_loss_epoch(tmp_path, settings):
    # ROUGE-L would keep epoch 1 and stop after epoch 3; on dev loss epoch 3 (the lowest) is kept and epoch 4's
    # rise, then epoch 5's, stop it (patience 2).
    cfg = settings.train_pvi.model_copy(update={"epochs": 6, "patience": 2, "lr": 1e-3, "batch_size": 4,
                                                "select_on": "loss"})
    pairs = T.build_pairs([EB_ROW], "g")
    dev = ScriptedDev([0.9, 0.1, 0.1, 0.1, 0.1, 0.1], losses=[5.0, 4.0, 3.0, 3.5, 3.2, 1.0])
    history = T.train(pairs, pairs, cfg, tmp_path / "m", evaluate_fn=dev)
    assert [(h["epoch"], h["kept"]) for h in history] == [(1, 0.0), (2, 0.0), (3, 1.0), (4, 0.0), (5, 0.0)]
    assert saved_equals(tmp_path / "m", dev.weights[2]) and not saved_equals(tmp_path / "m", dev.weights[0])


def test_train_early_stops_when_dev_rouge_stalls(tmp_path, settings):
    # Dev ROUGE-L never beats epoch 1: patience 1 stops after epoch 2 of 5 and epoch 1's weights stay saved.
    cfg = settings.train_pvi.model_copy(update={"epochs": 5, "patience": 1, "lr": 1e-3, "batch_size": 4})
    pairs = T.build_pairs([EB_ROW], "g")
    dev = ScriptedDev([0.5, 0.5, 0.9, 0.9, 0.9])
    history = T.train(pairs, pairs, cfg, tmp_path / "m", evaluate_fn=dev)
    assert [(h["epoch"], h["kept"]) for h in history] == [(1, 1.0), (2, 0.0)]
    assert saved_equals(tmp_path / "m", dev.weights[0]) and not saved_equals(tmp_path / "m", dev.weights[1])


# --- the split: train on EB task_1 train, early-stop on dev, never read test ---------------------------------


def test_defaults_train_on_eb_task1_train_and_early_stop_on_dev(settings):
    cfg = settings.train_pvi
    tsvs = resolve_path("${paths.data}/receval/entailment_bank/data/processed_data/tsvs/task_1")
    assert resolve_path(cfg.train_path) == tsvs / "train.tsv"
    assert resolve_path(cfg.dev_path) == tsvs / "dev.tsv"
    assert not T.is_eb_test(cfg.train_path, settings) and not T.is_eb_test(cfg.dev_path, settings)
    T.check_split(settings)


EB_TEST_PATHS = [
    "${paths.data}/receval/entailment_bank/data/processed_data/tsvs/task_1/test.tsv",
    "${paths.data}/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_1/test.jsonl",
    "${paths.data}/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_2/test.jsonl",
    str(PROJECT_ROOT / "tests" / "data" / "entailment_bank" / "task_1_test_head.jsonl"),
]


@pytest.mark.parametrize("key", ["train_path", "dev_path"])
@pytest.mark.parametrize("path", EB_TEST_PATHS)
def test_run_refuses_eb_test_trees_before_reading_them(make_settings, key, path):
    settings = make_settings(f"train_pvi.{key}={path}")
    with pytest.raises(ValueError, match=rf"train_pvi\.{key}=.*EntailmentBank test data"):
        T.run(settings)  # raises before any file is opened (the test files need not exist here)


def test_run_refuses_the_perturbation_input_wherever_it_lives(make_settings, tmp_path):
    elsewhere = tmp_path / "trees.jsonl"  # no "test" in the name: refused because the EB-challenge reads it
    settings = make_settings(f"perturb.eb_task1_test={elsewhere}", f"train_pvi.dev_path={elsewhere}")
    with pytest.raises(ValueError, match="EntailmentBank test data"):
        T.run(settings)


@pytest.mark.dataset("entailment_bank")
def test_default_split_files_read_as_eb_trees(settings):
    train = T.load_rows(settings.train_pvi.train_path)
    dev = T.load_rows(settings.train_pvi.dev_path)
    assert (len(train), len(dev)) == (1313, 187)  # EB task_1 train / dev trees
    assert len(T.build_pairs(train, "g")) == sum(r["proof"].count("->") for r in train)
    # The processed dev TSV gives the same training pairs as EB v2's dev jsonl, tree by tree.
    jsonl = T.load_rows(settings.train_pvi.dev_path.replace(
        "processed_data/tsvs/task_1/dev.tsv",
        "public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_1/dev.jsonl"))
    by_hypothesis = {r["hypothesis"]: r for r in jsonl}
    for row in dev:
        for kind in ("g", "info_gain"):
            assert T.chain_pairs(row, kind) == T.chain_pairs(by_hypothesis[row["hypothesis"]], kind), row["id"]
