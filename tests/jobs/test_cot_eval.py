"""jobs.cot.evaluate: metrics maths by hand, and the job end to end on BBH, MGSM, P3 and a custom JSONL."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from conftest import sqlite_store
from pyspark.sql import functions as F
from tolerance import EXACT_ABS, exact, loglik_approx

from jobs.cot import evaluate as cot_eval
from jobs.cot import metrics as cot_metrics
from jobs.cot.model_udfs import generator_options
from schemas import cot as S
from schemas import quarantine as Q
from udfs import cot_text

# ---- metrics ----------------------------------------------------------------------------------------------


def _pred(dataset, task, template, correct, numeric=None):
    return [
        {S.DATASET: dataset, S.TASK: task, S.TEMPLATE: template, S.MODE: "direct", S.MODEL: "m", S.CORRECT: c,
         S.NUMERIC_CORRECT: numeric, S.CORRECT_PER_TOKEN: c, S.CORRECT_PER_BYTE: None}
        for c in correct
    ]  # fmt: skip


@pytest.fixture(scope="module")
def metrics():
    rows = (
        _pred("bbh", "a", None, [True, False, True, True])
        + _pred("bbh", "b", None, [False, True])
        + _pred("p3", "t", "x", [True, True, False, False])
        + _pred("p3", "t", "y", [True, True, True, False])
        + _pred("p3", "t", "z", [False, False, False, False])
        + _pred("p3", "u", "x", [True, False])
    )
    frame = pd.DataFrame(rows)
    return cot_metrics.compute_metrics(frame, resamples=200, confidence=0.95, seed=0)


def _value(metrics, dataset, aggregate, group, metric="accuracy"):
    row = metrics[(metrics[S.DATASET] == dataset) & (metrics[S.AGGREGATE] == aggregate) & (metrics[S.GROUP] == group)
                  & (metrics[S.METRIC_NAME] == metric)]  # fmt: skip
    assert len(row) == 1, (dataset, aggregate, group, metric)
    return row.iloc[0]


# Metrics of hand-made 0/1 predictions are exact rationals, computed in float64.
def test_compute_metrics_task_macro_micro(metrics):
    assert _value(metrics, "bbh", "task", "a")[S.VALUE] == 0.75
    assert _value(metrics, "bbh", "task", "b")[S.VALUE] == 0.5
    assert _value(metrics, "bbh", "macro", "*")[S.VALUE] == exact(0.625)  # mean of task means
    assert _value(metrics, "bbh", "micro", "*")[S.VALUE] == exact(4 / 6)  # mean of rows
    assert _value(metrics, "bbh", "micro", "*")[S.N] == 6


def test_compute_metrics_templates_median(metrics):
    assert _value(metrics, "p3", "template", "t/x")[S.VALUE] == 0.5
    assert _value(metrics, "p3", "template", "t/y")[S.VALUE] == 0.75
    assert _value(metrics, "p3", "template", "t/z")[S.VALUE] == 0.0
    assert _value(metrics, "p3", "median_template", "t")[S.VALUE] == 0.5
    assert _value(metrics, "p3", "task", "t")[S.VALUE] == exact(5 / 12)  # all rows of the task
    # macro: task t counts with its median over templates (0.5), task u with its one template (0.5).
    assert _value(metrics, "p3", "macro", "*")[S.VALUE] == exact(0.5)
    assert _value(metrics, "p3", "micro", "*")[S.VALUE] == exact(6 / 14)


def test_compute_metrics_only_where_defined(metrics):
    names = set(metrics[S.METRIC_NAME])
    assert names == {"accuracy", "acc_norm_token"}  # numeric / per-byte columns are all null here
    assert set(metrics[S.AGGREGATE]) == set(S.AGGREGATES)


def test_compute_metrics_bootstrap_ci(metrics):
    from scipy.stats import bootstrap

    row = _value(metrics, "bbh", "task", "a")
    data = np.array([1.0, 0.0, 1.0, 1.0])
    want = bootstrap((data,), np.mean, n_resamples=200, confidence_level=0.95, method="percentile",
                     rng=np.random.default_rng(0)).confidence_interval  # fmt: skip
    assert (row[S.CI_LOW], row[S.CI_HIGH]) == exact((want.low, want.high))  # the same float64 resampling
    for _, r in metrics.iterrows():
        if r[S.CI_LOW] is not None and not pd.isna(r[S.CI_LOW]):
            inside = r[S.CI_LOW] - EXACT_ABS <= r[S.VALUE] <= r[S.CI_HIGH] + EXACT_ABS
            assert inside or r[S.AGGREGATE] == "median_template"
    z = _value(metrics, "p3", "template", "t/z")
    assert (z[S.CI_LOW], z[S.CI_HIGH]) == (0.0, 0.0)  # no spread


def test_bootstrap_needs_two_rows():
    assert cot_metrics._bootstrap([np.array([1.0])], [0], 100, 0.95, 0) == (None, None)


# ---- end to end -------------------------------------------------------------------------------------------


def _check_predictions(pdf: pd.DataFrame, tokenizer) -> None:
    """Row-level protocol checks that hold for any model."""
    from udfs.cot_prompt import official_prompts

    for _, r in pdf.iterrows():
        if r[S.OPTIONS] is not None:
            options = list(r[S.OPTIONS])
            scores = list(r[S.OPTION_SCORES])
            assert [s["option"] for s in scores] == options
            best = cot_text.pick_option(options, [s["sum_logprob"] for s in scores])
            assert r[S.PREDICTION] == options[best]
            assert r[S.CORRECT] == cot_text.exact_match(options[best], r[S.GOLD])
            assert r[S.NUMERIC_CORRECT] is None or pd.isna(r[S.NUMERIC_CORRECT])
        else:
            assert r[S.OPTION_SCORES] is None
            assert r[S.CORRECT] == cot_text.exact_match(r[S.PREDICTION], r[S.GOLD])
        suffix = "\n[ANSWER] " if r[S.MODE] == "direct" else "\n\nLet's think step by step.\n"
        assert r[S.PROMPT] == official_prompts(tokenizer, [r[S.SOURCE]], suffix, 512)[0][0]
        if r[S.RATIONALE] is not None and r[S.OPTIONS] is not None:
            assert "[ANSWER]" not in r[S.RATIONALE] and r[S.RATIONALE] == r[S.RATIONALE].strip()


def _overrides(base, model: str, family: str) -> list[str]:
    return [
        f"paths.lake={base}/lake",
        f"mlflow.tracking_uri={sqlite_store(base / 'mlruns.db')}",
        f"mlflow.artifact_location={base}/mlartifacts",
        "spark.master=local[2]",
        "spark.shuffle_partitions=1",
        f"models.cot.path={model}",
        f"models.cot.family={family}",
        "cot.max_examples_per_task=1",
        "cot.max_new_tokens=12",
        "cot.generation_max_new_tokens=12",
        "cot.direct_max_new_tokens=6",
        "cot.sample=false",  # greedy: a rationale can be generated again outside Spark and compared
        "cot.bootstrap_resamples=50",
        "cot.custom_path=tests/data/cot_custom.jsonl",
    ]


@pytest.fixture(scope="module")
def e2e(spark, tiny_models, tmp_path_factory):
    """All 27 BBH tasks, 11 MGSM languages, every P3 template and a custom JSONL, 1 example each, tiny T5."""
    from jobs.infra.config_layers import load_settings

    overrides = _overrides(tmp_path_factory.mktemp("cot"), tiny_models["tiny-t5"], "seq2seq")
    started = time.time()
    result = cot_eval.main([arg for pair in overrides for arg in ("--set", pair)])  # through the CLI, as a user
    seconds = time.time() - started
    settings = load_settings(overrides=overrides, environ={})
    pred = spark.read.format("delta").load(settings.table("cot_predictions"))
    return settings, result, pred, seconds, overrides


@pytest.mark.dataset("bbh", "mgsm", "p3_heldout")
def test_cot_eval_end_to_end_every_dataset(e2e, spark):
    settings, result, pred, _, _ = e2e
    n = result["examples"]
    # 27 BBH + 11 MGSM + 112 P3 templates + 3 custom rows (the 4th, a bad one, is quarantined).
    assert n == 27 + 11 + 112 + 3
    for mode in ("direct", "cot"):
        assert result[f"{mode}_predictions"] + result[f"{mode}_quarantined"] == n
        assert result[f"{mode}_reconciled"] == 1
    assert pred.count() == 2 * n
    tasks = {(r[0], r[1]) for r in pred.select(S.DATASET, S.TASK).distinct().collect()}
    assert len({t for d, t in tasks if d == "bbh"}) == 27
    assert {t for d, t in tasks if d == "mgsm"} == {"bn", "de", "en", "es", "fr", "ja", "ru", "sw", "te", "th", "zh"}
    assert {t for d, t in tasks if d == "p3"} == {"anli_r1", "anli_r2", "anli_r3", "cb", "copa", "rte", "wic", "wsc",
                                                 "winogrande", "story_cloze"}  # fmt: skip
    assert {t for d, t in tasks if d == "my_eval"} == {"capitals", "sums", "yesno"}
    from transformers import AutoTokenizer

    _check_predictions(pred.toPandas(), AutoTokenizer.from_pretrained(settings.models.cot.path))
    q = spark.read.format("delta").load(settings.table("quarantine")).where(F.col(Q.STAGE) == "cot_load")
    assert [r[Q.REASON] for r in q.collect()] == ["invalid_example"]


@pytest.mark.dataset("bbh", "mgsm", "p3_heldout")
def test_cot_eval_direct_scores_equal_option_scorer(e2e, tiny_models):
    """The numbers in the table are the udfs.options numbers: the Spark plumbing changes nothing."""
    from udfs.options import score_options
    from udfs.runtime import load_model

    _, _, pred, _, _ = e2e
    rows = pred.where((F.col(S.MODE) == "direct") & F.col(S.OPTIONS).isNotNull()).orderBy(S.TASK).limit(12).collect()
    model, tok = load_model(str(tiny_models["tiny-t5"]), "seq2seq")
    want = score_options(model, tok, "seq2seq", [r[S.PROMPT] for r in rows], [list(r[S.OPTIONS]) for r in rows],
                         eos=True)  # fmt: skip
    for r, w in zip(rows, want, strict=True):
        # Other batch neighbours in Spark: float32 rounding of ~200-nat sums (random tiny heads), relative to
        # each sum; per_byte is a sum over a byte count, so it keeps the sum's relative error.
        got = [s["sum_logprob"] for s in r[S.OPTION_SCORES]]
        assert got == loglik_approx([x.sum_logprob for x in w])
        assert [s["per_byte"] for s in r[S.OPTION_SCORES]] == loglik_approx([x.per_byte for x in w])


@pytest.mark.dataset("bbh", "mgsm", "p3_heldout")
def test_cot_eval_rationale_is_the_cut_generation(e2e, tiny_models):
    """The stored rationale is the model's greedy generation for the prompt, cut at [ANSWER] and stripped."""
    from udfs.generate import generate
    from udfs.runtime import load_model

    settings, _, pred, _, _ = e2e
    rows = pred.where((F.col(S.MODE) == "cot") & F.col(S.OPTIONS).isNotNull()).orderBy(S.TASK).limit(8).collect()
    model, tok = load_model(str(tiny_models["tiny-t5"]), "seq2seq")
    opts = generator_options(settings.cot)["rationale"]
    gens = generate(model, tok, "seq2seq", [r[S.PROMPT] for r in rows], max_length=512, **opts)
    assert all(g.n_tokens >= 8 for g in gens)
    assert [r[S.RATIONALE] for r in rows] == [cot_text.rationale_of(g.text) for g in gens]


@pytest.mark.dataset("bbh", "mgsm", "p3_heldout")
def test_cot_eval_metrics_match_predictions(e2e, spark):
    settings, _, pred, _, _ = e2e
    metrics = spark.read.format("delta").load(settings.table("cot_metrics"))
    for dataset in ("bbh", "mgsm", "p3", "my_eval"):
        for mode in ("direct", "cot"):
            rows = pred.where((F.col(S.DATASET) == dataset) & (F.col(S.MODE) == mode))
            micro = rows.agg(F.avg(F.col(S.CORRECT).cast("double"))).first()[0]
            got = metrics.where(
                (F.col(S.DATASET) == dataset) & (F.col(S.MODE) == mode) & (F.col(S.AGGREGATE) == "micro")
                & (F.col(S.METRIC_NAME) == "accuracy")
            ).collect()  # fmt: skip
            assert len(got) == 1 and got[0][S.VALUE] == exact(micro) and got[0][S.N] == rows.count()
    mgsm = metrics.where((F.col(S.DATASET) == "mgsm") & (F.col(S.METRIC_NAME) == "numeric_match")).count()
    assert mgsm > 0
    medians = metrics.where((F.col(S.DATASET) == "p3") & (F.col(S.AGGREGATE) == "median_template")).count()
    assert medians == 10 * 2 * 4  # 10 tasks x 2 modes x (accuracy, acc_norm_token, acc_norm_byte, random_guess)


@pytest.mark.dataset("bbh", "mgsm", "p3_heldout")
def test_cot_eval_rerun_is_idempotent(e2e, spark):
    from jobs.infra.config_layers import load_settings

    settings, _, pred, _, overrides = e2e
    before = pred.count()
    again = load_settings(overrides=[*overrides, "cot.datasets=[]", "cot.modes=[direct]"], environ={})
    result = cot_eval.run(spark, again, "rerun")
    assert result["direct_predictions"] == 3  # the custom rows again
    after = spark.read.format("delta").load(settings.table("cot_predictions"))
    assert after.count() == before  # rows with a null template match themselves: no duplicates


@pytest.mark.slow
@pytest.mark.dataset("bbh", "mgsm")
def test_cot_eval_end_to_end_causal_lm(spark, tiny_models, make_settings):
    settings = make_settings(
        f"models.cot.path={tiny_models['tiny-gpt2']}",
        "models.cot.family=causal",
        "cot.datasets=[bbh,mgsm]",
        "cot.bbh_tasks=[snarks,ruin_names,object_counting,web_of_lies]",
        "cot.mgsm_languages=[en,ja]",
        "cot.max_examples_per_task=2",
        "cot.max_new_tokens=12",
        "cot.generation_max_new_tokens=12",
        "cot.direct_max_new_tokens=6",
        "cot.bootstrap_resamples=50",
        "cot.custom_path=tests/data/cot_custom.jsonl",
    )
    result = cot_eval.run(spark, settings, "gpt2")
    # 4 BBH tasks x 2 + 2 MGSM languages x 2 + custom (capitals 2, sums 2, yesno 1; one row rejected).
    assert result["direct_predictions"] == result["cot_predictions"] == 8 + 4 + 5
    from transformers import AutoTokenizer

    pred = spark.read.format("delta").load(settings.table("cot_predictions")).toPandas()
    _check_predictions(pred, AutoTokenizer.from_pretrained(settings.models.cot.path))


@pytest.mark.full
@pytest.mark.dataset("bbh", "mgsm", "p3_heldout")
def test_cot_eval_full_run(spark, tiny_models, make_settings):
    """Every example of every dataset, both modes, tiny T5 (85k examples per mode): documents the time."""
    settings = make_settings(
        f"models.cot.path={tiny_models['tiny-t5']}", "models.cot.family=seq2seq", "cot.max_new_tokens=16",
        "cot.generation_max_new_tokens=16", "cot.direct_max_new_tokens=16", "cot.bootstrap_resamples=100",
    )  # fmt: skip
    started = time.time()
    result = cot_eval.run(spark, settings, "full")
    print(f"full CoT evaluation run: {time.time() - started:.0f} s, {result['examples']} examples per mode "
          f"(Direct {result['direct_seconds']:.0f} s, CoT {result['cot_seconds']:.0f} s)")
    assert result["direct_reconciled"] == result["cot_reconciled"] == 1


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.mark.slow
def test_cot_eval_chat_template_causal_lm(spark, tiny_models, make_settings, tmp_path):
    """An instruct-style causal LM: the source is the user turn, the suffix opens the assistant turn, the rationale
    is that turn (cut before [ANSWER]) and the options continue it after "[ANSWER] "; every number equals an
    independent computation outside Spark."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from udfs.cot_prompt import chat_prompts
    from udfs.generate import generate
    from udfs.options import score_options

    folder = tmp_path / "chat-gpt2"
    model = AutoModelForCausalLM.from_pretrained(tiny_models["tiny-gpt2"])
    tok = AutoTokenizer.from_pretrained(tiny_models["tiny-gpt2"])
    tok.chat_template = CHAT_TEMPLATE
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    settings = make_settings(
        f"models.cot.path={folder}", "models.cot.family=causal", "cot.datasets=[]", "cot.chat_template=true",
        "cot.custom_path=tests/data/cot_custom.jsonl", "cot.sample=false", "cot.max_new_tokens=12",
        "cot.generation_max_new_tokens=12", "cot.direct_max_new_tokens=512", "cot.bootstrap_resamples=50",
    )  # fmt: skip
    result = cot_eval.run(spark, settings, "chat")
    assert result["direct_predictions"] == result["cot_predictions"] == 5
    assert settings.cot.departures()["chat_template"] == (True, False)
    pred = spark.read.format("delta").load(settings.table("cot_predictions")).toPandas()
    tok = AutoTokenizer.from_pretrained(folder)
    # cot.max_length (512) is the prompt's length: 512 new tokens come on top of it, never out of the prompt.
    assert not pred[S.TRUNCATED].any()
    for _, r in pred.iterrows():
        suffix = "\n[ANSWER] " if r[S.MODE] == "direct" else "\n\nLet's think step by step.\n"
        assert r[S.PROMPT] == chat_prompts(tok, [r[S.SOURCE]], suffix, 512)[0][0]
        assert r[S.PROMPT].endswith("<|assistant|>" + suffix.lstrip("\n"))
    cls = pred[pred[S.OPTIONS].notna()].sort_values([S.MODE, S.TASK, S.EXAMPLE_ID])
    opts = generator_options(settings.cot)["rationale"]
    for _, r in cls.iterrows():
        prefix = ""
        if r[S.MODE] == "cot":
            [gen] = generate(model.eval(), tok, "causal", [r[S.PROMPT]], max_length=512 + opts["max_new_tokens"], **opts)
            assert r[S.RATIONALE] == cot_text.rationale_of(gen.text)
            prefix = r[S.RATIONALE] + "\n[ANSWER] "
        [want] = score_options(model, tok, "causal", [r[S.PROMPT]], [list(r[S.OPTIONS])], prefixes=[prefix],
                               move_space=True)  # fmt: skip
        assert [s["sum_logprob"] for s in r[S.OPTION_SCORES]] == loglik_approx([w.sum_logprob for w in want])
