"""jobs.training.train_nli: pair files read and checked before training, refusal of evaluation data, a tiny
fine-tune that moves predictions toward the labels, distillation toward a teacher, the card and the MLflow run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from jobs.training import nli_pairs as P
from jobs.training import train_nli as T
from jobs.training.settings import TrainNliSettings
from udfs import nli

# Pairs a tiny model can learn in a few dozen steps: the hypothesis's last word decides the label.
WORDS = ["sun", "star", "coat", "warm", "fur", "earth", "clips", "animal"]
LABELLED = [
    (f"the {w} is here and {v} stays", f"{h} {w}", lab)
    for w, v in zip(WORDS, reversed(WORDS), strict=True)
    for h, lab in (("yes", "ENT"), ("maybe", "NEU"), ("no", "CON"))
]


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from a second thread, and on a busy 2-core machine its spin-waits cost seconds."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_tsv(path: Path, rows: list[tuple[str, ...]], header: tuple[str, ...] = ("s1", "s2", "gold", "part")) -> Path:
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


def toy_source(path: Path, **extra) -> dict:
    return {"path": str(path), "premise": "s1", "hypothesis": "s2", "label": "gold",
            "labels": {"ENT": "entailment", "NEU": "neutral", "CON": "contradiction"}, **extra}


def settings_for(make_settings, sources: dict, tmp_path: Path, *extra: str):
    yaml_sources = json.dumps(sources)  # JSON is YAML: one --set carries the whole mapping
    return make_settings(f"train_nli.sources={yaml_sources}", f"train_nli.use={json.dumps(list(sources))}",
                         f"train_nli.output_dir={tmp_path / 'nli-out'}", "runtime.device=cpu", *extra)


# --- reading, label mapping and bad input -------------------------------------------------------------------------


def test_load_source_maps_labels_by_name_and_keeps_the_test_split_apart(tmp_path, make_settings):
    rows = [("a cat sits", "an animal sits", "ENT", "TRAIN"), ("a cat sits", "a dog sits", "NEU", "TRIAL"),
            ("a cat sits", "no cat sits", "CON", "TEST"), ("x", "y", "ENT", "OTHER")]
    path = write_tsv(tmp_path / "toy.tsv", rows)
    s = settings_for(make_settings, {"toy": toy_source(path, split_field="part", train_values=["TRAIN", "TRIAL"],
                                                       test_values=["TEST"])}, tmp_path)
    train, test = P.load_source("toy", s.train_nli.sources["toy"], s)
    assert train.premises == ["a cat sits", "a cat sits"] and train.hypotheses == ["an animal sits", "a dog sits"]
    assert [T.NLI_LABELS[y] for y in train.labels] == ["entailment", "neutral"]
    assert test.source == "toy:test" and [T.NLI_LABELS[y] for y in test.labels] == ["contradiction"]
    # built-in sources stay beside a source given in config
    assert {"sick", "anli_r1", "toy"} <= set(s.train_nli.sources)


def test_split_is_seeded_and_per_source():
    pairs = P.Pairs("p", [str(i) for i in range(50)], [str(i) for i in range(50)], [0] * 50)
    kept, out = P.split(pairs, 0.1, seed=0)
    again = P.split(pairs, 0.1, seed=0)[1]
    assert len(out) == 5 and len(kept) == 45 and out.premises == again.premises
    assert set(out.premises).isdisjoint(kept.premises)
    assert P.split(pairs, 0.1, seed=1)[1].premises != out.premises


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "no rows"),
        ("s1\ts2\tgold\na\tb\tENT\n", None),  # fine: the control case
        ("s1\ts2\n a\tb\n", r"lacks column\(s\) \['gold'\]"),
        ("s1\ts2\tgold\na\tb\tENT\na\tc\tMAYBE\n", r"label\(s\) not in .*'MAYBE': 1"),
        ("s1\ts2\tgold\na\t\tENT\n", r"empty premise or hypothesis in row\(s\) \[1\]"),
    ],
)
def test_bad_input_fails_before_training_naming_file_and_problem(tmp_path, make_settings, monkeypatch, content,
                                                                 problem):
    path = tmp_path / "pairs.tsv"
    path.write_text(content, encoding="utf-8")
    s = settings_for(make_settings, {"toy": toy_source(path)}, tmp_path, "train_nli.holdout=0")

    def trained(*args, **kwargs):
        raise AssertionError("trained")

    monkeypatch.setattr(T, "train", trained)
    if problem is None:
        with pytest.raises(AssertionError, match="trained"):
            T.run(s)
        return
    with pytest.raises(P.BadTrainingInput, match=problem) as err:
        T.run(s)
    assert str(path) in str(err.value)
    assert not (tmp_path / "nli-out").exists()


def test_missing_file_says_how_to_fetch_and_unlabelled_needs_a_teacher(tmp_path, make_settings):
    s = settings_for(make_settings, {"toy": toy_source(tmp_path / "nope.tsv", dataset="sick")}, tmp_path)
    with pytest.raises(P.BadTrainingInput, match=r"nope.tsv: source 'toy' file not found \(python -m jobs.infra.data "
                                                 r"fetch sick\)"):
        P.load_all(s)
    path = write_tsv(tmp_path / "unlabelled.tsv", [("a", "b", "", "")])
    s = settings_for(make_settings, {"toy": toy_source(path, label=None)}, tmp_path)
    with pytest.raises(P.BadTrainingInput, match="unlabelled pairs need train_nli.teacher"):
        P.load_all(s)


@pytest.mark.parametrize("where", ["data/receval/entailment_bank/task_1/train.jsonl", "data/roscoe/annotated/x.csv",
                                   "copies/EntailmentBank-dev.tsv", "perturb"])
def test_refuses_entailment_bank_and_roscoe_before_any_run(tmp_path, make_settings, where):
    if where == "perturb":  # the EB-challenge's configured input, wherever it lives and whatever its name
        path, extra = tmp_path / "plain" / "trees.tsv", [f"perturb.eb_task1_test={tmp_path / 'plain' / 'trees.tsv'}"]
    else:
        path, extra = tmp_path / where, []
    path.parent.mkdir(parents=True, exist_ok=True)
    write_tsv(path, [("a", "b", "ENT", "")])
    s = settings_for(make_settings, {"toy": toy_source(path)}, tmp_path, *extra)
    with pytest.raises(P.BadTrainingInput, match="refused, this is EntailmentBank or ROSCOE data"):
        P.load_all(s)
    overrides = [f"train_nli.sources={json.dumps({'toy': toy_source(path)})}", "train_nli.use=[toy]",
                 f"mlflow.tracking_uri=sqlite:///{tmp_path}/refused.db", *extra]
    with pytest.raises(P.BadTrainingInput, match="refused"):
        T.main([f"--set={o}" for o in overrides])
    assert not (tmp_path / "refused.db").exists()  # refused before an MLflow run was opened


# --- training (tiny models) ---------------------------------------------------------------------------------------


def gold_probability(folder: Path, pairs: P.Pairs) -> float:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(folder, use_safetensors=True)
    probs = T.predict(model, AutoTokenizer.from_pretrained(folder), pairs, 64, 64)
    return float(probs[np.arange(len(pairs)), pairs.labels].mean())


def test_training_moves_predictions_toward_the_labels(tiny_models, tmp_path):
    pairs = P.Pairs("toy", [p for p, _, _ in LABELLED], [h for _, h, _ in LABELLED],
                    [P.LABEL2ID[{"ENT": "entailment", "NEU": "neutral", "CON": "contradiction"}[y]] for *_, y in LABELLED])
    base = tiny_models["tiny-nli"]  # label2id {"NEUTRAL": 0, "Contradiction": 1, "entailment": 2}: kept, read by name
    cfg = TrainNliSettings(base_model=str(base), epochs=15, batch_size=8, lr=3e-3, warmup=0, max_length=64)
    out = tmp_path / "trained"
    history = T.train(pairs, cfg, out, log_every=60)
    before, after = gold_probability(base, pairs), gold_probability(out, pairs)
    assert before == pytest.approx(1 / 3, abs=0.05)  # a random tiny model: about a third for every label
    assert after > before + 0.2, (before, after)
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    config = json.loads((out / "config.json").read_text())
    assert config["label2id"] == {"NEUTRAL": 0, "Contradiction": 1, "entailment": 2}
    assert (out / "model.safetensors").exists()


def test_plain_encoder_gets_named_labels(tiny_models, tmp_path):
    from transformers import AutoConfig, AutoTokenizer, BertModel

    config = AutoConfig.from_pretrained(tiny_models["tiny-nli"])
    config.label2id, config.id2label, config.num_labels = {"LABEL_0": 0, "LABEL_1": 1}, {0: "LABEL_0", 1: "LABEL_1"}, 2
    config.architectures = ["BertModel"]
    encoder = tmp_path / "encoder"
    BertModel(config).save_pretrained(encoder, safe_serialization=True)
    AutoTokenizer.from_pretrained(tiny_models["tiny-nli"]).save_pretrained(encoder)
    model, _, indices = T.load_student(str(encoder), seed=0)
    assert model.config.label2id == {"entailment": 0, "neutral": 1, "contradiction": 2}
    assert indices == (0, 1, 2) == nli.label_indices(model.config.label2id)


def test_distillation_moves_the_student_toward_the_teacher(tiny_models, spread_nli, tmp_path):
    from udfs.runtime import load_model

    # Unlabelled pairs (any pair file): only the teacher's probabilities teach.
    pairs = P.Pairs("lake", [p for p, _, _ in LABELLED], [h for _, h, _ in LABELLED], [P.NO_LABEL] * len(LABELLED))
    cfg = TrainNliSettings(base_model=str(tiny_models["tiny-nli"]), teacher=str(spread_nli), epochs=15, batch_size=8,
                           lr=3e-3, warmup=0, max_length=64)
    soft = T.teacher_probs(cfg, pairs, "cpu")
    assert soft.max() > 0.6  # the spread teacher is confident somewhere: there is something to learn

    def distance(folder: Path) -> float:
        model, tok = load_model(str(folder), "nli")
        return nli.mean_kl(soft, T.predict(model, tok, pairs, 64, 64))

    before = distance(tiny_models["tiny-nli"])
    T.train(pairs, cfg, tmp_path / "student", soft=soft, log_every=60)
    after = distance(tmp_path / "student")
    assert after < 0.5 * before, (before, after)


def test_main_writes_card_and_logs_metrics_and_model(tiny_models, tmp_path, make_settings):
    from mlflow.tracking import MlflowClient

    from jobs.infra.tracking import tracking_uri

    rows = [(p, h, y, "TRAIN") for p, h, y in LABELLED] + [(p, h, y, "TEST") for p, h, y in LABELLED[:6]]
    path = write_tsv(tmp_path / "toy.tsv", rows)
    sources = {"toy": toy_source(path, split_field="part", train_values=["TRAIN"], test_values=["TEST"])}
    overrides = [f"train_nli.sources={json.dumps(sources)}", "train_nli.use=[toy]",
                 f"train_nli.output_dir={tmp_path / 'nli-out'}", f"train_nli.base_model={tiny_models['tiny-nli']}",
                 "train_nli.max_steps=4", "train_nli.batch_size=8", "train_nli.max_length=64", "runtime.device=cpu"]
    settings = make_settings(*overrides)
    argv = [f"--set={o}" for o in overrides] + [f"--set=mlflow.tracking_uri={settings.mlflow.tracking_uri}",
                                                f"--set=mlflow.artifact_location={settings.mlflow.artifact_location}"]
    uri = T.main(argv)
    out = tmp_path / "nli-out"
    summary = json.loads((out / "train_nli.json").read_text())
    assert summary["optimizer_steps"] == 4 and summary["train_pairs"] == 22  # 24 minus the seeded 10% (2)
    assert set(summary["heldout"]) == {"toy", "toy:test", "all_holdout"}
    assert summary["heldout"]["toy:test"]["pairs"] == 6
    card = (out / "README.md").read_text()
    assert "| toy:test | 6 |" in card and "4 optimizer steps" in card and "toy.tsv" in card
    run = MlflowClient(tracking_uri(settings)).get_run(uri.split("/")[1])
    assert run.data.metrics["heldout_accuracy_toy_test"] == pytest.approx(summary["heldout"]["toy:test"]["accuracy"])
    assert run.data.params["train_nli.max_steps"] == "4"
    artifacts = {a.path for a in MlflowClient(tracking_uri(settings)).list_artifacts(run.info.run_id, "model")}
    assert "model/model.safetensors" in artifacts and "model/README.md" in artifacts


# --- the NLI mirror's sources and 2-way held-out accuracy ---------------------------------------------------------


def test_two_way_accuracy_counts_entailment_against_the_rest():
    # labels: entailment 0, neutral 1, contradiction 2; a 2-way source's negatives are read as neutral
    probs = np.array([[0.8, 0.1, 0.1], [0.1, 0.1, 0.8], [0.2, 0.7, 0.1], [0.1, 0.8, 0.1]])
    pairs = P.Pairs("scitail", ["p"] * 4, ["h"] * 4, [0, 1, 1, 0])
    # 3-way: right on rows 0 and 2 only; 2-way: a contradiction predicted for a not-entailment gold is right too
    assert T.accuracy(probs, pairs) == pytest.approx(2 / 4)
    assert T.accuracy(probs, pairs, two_way=True) == pytest.approx(3 / 4)


@pytest.mark.dataset("sick", "p3_heldout", "mnli_dev_matched", "snli_dev", "joci", "scitail", "cf_snli")
def test_every_registered_source_reads_with_its_labels(make_settings):
    """Each built-in source reads in full from the files its dataset places: counts and label mixes as the mirror's
    README states them (SciTail 2-way, its not_entailment read as neutral; SICK's TEST rows a test set)."""
    s = make_settings()
    expected = {  # name -> (pairs read incl. a test split, {label: count})
        "mnli_m": (9815, None), "snli_dev": (9831, {"entailment": 3325, "neutral": 3231, "contradiction": 3275}),
        "joci": (8412, {"entailment": 1580, "neutral": 3638, "contradiction": 3194}),
        "scitail": (2126, {"entailment": 842, "neutral": 1284}), "cf_snli": (8330, None), "cf_snli_dev": (1000, None),
        "sick": (9840, None),
    }
    for name, (rows, mix) in expected.items():
        train, test = P.load_source(name, s.train_nli.sources[name], s)
        assert len(train) + len(test) == rows, name
        if mix is not None:
            got = {T.NLI_LABELS[y]: n for y, n in zip(*np.unique(train.labels, return_counts=True), strict=True)}
            assert got == mix, name
    assert s.train_nli.sources["scitail"].two_way and not s.train_nli.sources["mnli_m"].two_way


def test_the_logged_mlflow_model_sizes_its_calls_as_scoring(make_settings):
    # The nli section reaches the MLflow model's predict (jobs.infra.mlflow_models); unset, runtime's sizes.
    assert T.mlflow_config(make_settings("nli.batch_size=7", "nli.max_length=99")) == {"batch_size": 7,
                                                                                       "max_length": 99}
    settings = make_settings("runtime.batch_size=3", "runtime.max_length=64")
    assert T.mlflow_config(settings) == {"batch_size": 3, "max_length": 64}
