"""jobs.cot.evaluate follows the official CoT Collection protocol: the config defaults are the official code's
values, and the job conditions each option on what it must (fake model UDFs whose scores depend on the prefix)."""

from __future__ import annotations

import sys

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

from jobs.cot import evaluate as cot_eval
from jobs.cot import storage
from jobs.cot.model_udfs import CotUdfs, generator_options
from jobs.cot.settings import LENIENT_COT, OFFICIAL_COT, CotSettings
from jobs.infra.config_layers import load_settings
from schemas import cot as S

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# ---- config: the defaults are the official code's values ---------------------------------------------------


def test_cot_defaults_are_the_official_values():
    cfg = CotSettings()
    assert cfg.protocol == "official"
    # Written out from kaistAI/CoT-Collection CoT_Finetuning/src (not read from OFFICIAL_COT):
    assert cfg.direct_suffix == "\n[ANSWER] "  # Datasets_end2end.py: mode 'evaluate', prefix
    assert cfg.cot_trigger == "\n\nLet's think step by step.\n"  # mode 'rationale_evaluate', prefix
    assert cfg.answer_join == "\n[ANSWER] "  # evaluation.py: r+"\n[ANSWER] "+o
    assert cfg.indicators == ["[ANSWER]"]  # utils.remain_rationale; rsplit('[ANSWER]',1)
    assert cfg.stop_at_indicator is False and cfg.answer_until == []  # generate, then cut
    assert (cfg.min_new_tokens, cfg.max_new_tokens) == (8, 256)  # rationale generate() for classification
    assert (cfg.generation_min_new_tokens, cfg.generation_max_new_tokens) == (0, 512)  # CoT generation
    assert cfg.direct_max_new_tokens == 512  # Direct generation
    assert (cfg.sample, cfg.top_p, cfg.temperature, cfg.no_repeat_ngram_size) == (True, 0.8, 1.0, 3)
    assert cfg.score_eos is True  # batch_encode_plus default: add_special_tokens=True (T5 </s>)
    assert cfg.score == "sum"  # seq_log_prob = ....sum(dim=-1), argmax
    assert cfg.max_length == 512 and cfg.source_roundtrip is True  # input_length 512, encode/decode round trip
    assert cfg.dtype == "fp32"  # configs/eval/*.json: "fp16": false
    assert cfg.departures() == {}
    assert set(OFFICIAL_COT) <= set(CotSettings.model_fields)
    assert {k: getattr(cfg, k) for k in OFFICIAL_COT} == OFFICIAL_COT


def test_cot_lenient_preset_and_departures_are_named():
    lenient = load_settings(overrides=["cot.protocol=lenient"], environ={}).cot
    assert lenient.indicators == ["[ANSWER]", "So the answer is", "The answer is"]
    assert lenient.departures() == {
        "indicators": (LENIENT_COT["indicators"], ["[ANSWER]"]),
        "stop_at_indicator": (True, False),
        "sample": (False, True),
    }
    # An explicit key wins over the preset, and a departure under `official` is reported, not hidden.
    assert load_settings(overrides=["cot.protocol=lenient", "cot.sample=true"], environ={}).cot.sample is True
    greedy = load_settings(overrides=["cot.sample=false", "cot.max_new_tokens=12"], environ={}).cot
    assert greedy.departures() == {"sample": (False, True), "max_new_tokens": (12, 256)}


def test_generator_options_follow_the_official_generate_calls():
    gens = generator_options(CotSettings())
    common = {"do_sample": True, "top_p": 0.8, "temperature": 1.0, "seed": 0, "no_repeat_ngram_size": 3,
              "clean_up_spaces": True}  # fmt: skip
    assert gens["rationale"] == {**common, "max_new_tokens": 256, "min_new_tokens": 8, "stop_strings": []}
    assert gens["cot_generate"] == {**common, "max_new_tokens": 512, "min_new_tokens": 0, "stop_strings": []}
    assert gens["direct_generate"] == {**common, "max_new_tokens": 512, "min_new_tokens": 0, "stop_strings": []}
    lenient = generator_options(CotSettings(protocol="lenient"))["rationale"]
    assert lenient["stop_strings"] == ["[ANSWER]", "So the answer is", "The answer is"] and not lenient["do_sample"]


# ---- conditioning, with fake model UDFs ---------------------------------------------------------------------

RATIONALE = "  So the answer is <(B)>. \n[ANSWER] <(A)> and more"  # what the fake model "generates"
COT_GEN = {  # example_id -> fake CoT generation for the generation task
    "g1": "Half of 36 is 18. So the answer is 20.\n[ANSWER] 12 [ANSWER]  18 ",
    "g2": "[ANSWER] 18. The answer is 18.",
}


def _fake_options(rows: pd.DataFrame) -> pd.DataFrame:
    """Option scores that depend on the conditioning: CoT, 1 only after exactly the cut, stripped rationale and
    the join; Direct, 1 only for "(B)" after the official Direct prompt with no prefix. 0 otherwise (a tie goes
    to the first option, "(A)", the wrong one)."""
    out = []
    for prompt, prefix, option in zip(rows["prompt"], rows["prefix"], rows["option"], strict=True):
        if prefix:
            ok = prefix == f"So the answer is <{option}>.\n[ANSWER] "
        else:
            ok = prompt.endswith("?\n[ANSWER] ") and option == "(B)"
        out.append({"sum_logprob": 1.0 if ok else 0.0, "n_tokens": 1, "n_bytes": len(option), "truncated": False,
                    "error": None})  # fmt: skip
    return pd.DataFrame(out)


def _fake_udfs():
    from pyspark.sql.functions import pandas_udf

    from udfs.generate import UDF_FIELDS
    from udfs.options import UDF_FIELDS as OPTION_FIELDS

    @pandas_udf(OPTION_FIELDS)
    def options(prompt: pd.Series, prefix: pd.Series, option: pd.Series) -> pd.DataFrame:
        return _fake_options(pd.DataFrame({"prompt": prompt, "prefix": prefix, "option": option}))

    def fixed(text_of) -> object:
        @pandas_udf(UDF_FIELDS)
        def gen(prompt: pd.Series) -> pd.DataFrame:
            texts = [text_of(p) for p in prompt]
            return pd.DataFrame({"text": texts, "n_tokens": [8] * len(texts), "truncated": [False] * len(texts),
                                 "error": [None] * len(texts)})  # fmt: skip

        return gen

    def cot_text(prompt: str) -> str:
        return COT_GEN["g1"] if prompt.startswith("What is half of 36?") else COT_GEN["g2"]

    return CotUdfs(
        options=options,
        direct_generate=fixed(lambda p: "  18 \n"),
        rationale=fixed(lambda p: RATIONALE),
        cot_generate=fixed(cot_text),
    )


EXAMPLES = [
    {S.DATASET: "t", S.TASK: "cls", S.TEMPLATE: None, S.EXAMPLE_ID: "c1", S.SOURCE: "Which is right?",
     S.OPTIONS: ["(A)", "(B)"], S.GOLD: "(B)"},
    {S.DATASET: "t", S.TASK: "gen", S.TEMPLATE: None, S.EXAMPLE_ID: "g1", S.SOURCE: "What is half of 36?",
     S.OPTIONS: None, S.GOLD: "18"},
    {S.DATASET: "t", S.TASK: "gen", S.TEMPLATE: None, S.EXAMPLE_ID: "g2", S.SOURCE: "What is 6*3?",
     S.OPTIONS: None, S.GOLD: "18"},
]  # fmt: skip


@pytest.fixture(scope="module")
def predictions(spark):
    examples = storage.examples_frame(spark, EXAMPLES)
    udfs, cfg = _fake_udfs(), CotSettings()
    both = [cot_eval.transform(examples, mode, cfg, "fake", udfs, 1)[0] for mode in ("direct", "cot")]
    out: dict[str, dict] = {"direct": {}, "cot": {}}
    for r in both[0].unionByName(both[1]).collect():  # one Spark job: each costs seconds on 2 cores
        out[r[S.MODE]][r[S.EXAMPLE_ID]] = r.asDict()
    assert [len(out[m]) for m in ("direct", "cot")] == [3, 3]  # nothing failed or lost
    return out


def test_direct_scores_options_after_the_direct_prompt(predictions):
    c1 = predictions["direct"]["c1"]
    assert c1[S.PROMPT] == "Which is right?\n[ANSWER] "
    assert c1[S.RATIONALE] is None
    assert (c1[S.PREDICTION], c1[S.CORRECT]) == ("(B)", True)
    assert [s["sum_logprob"] for s in c1[S.OPTION_SCORES]] == [0.0, 1.0]


def test_cot_scores_options_after_rationale_and_join(predictions):
    c1 = predictions["cot"]["c1"]
    assert c1[S.PROMPT] == "Which is right?\n\nLet's think step by step.\n"
    # Cut at the first [ANSWER] only and stripped; the model's own answer sentence stays.
    assert c1[S.RATIONALE] == "So the answer is <(B)>."
    # Only "(B)" after exactly "So the answer is <(B)>.\n[ANSWER] " scores 1: an empty prefix, an uncut or
    # unstripped rationale, or a different join all pick "(A)".
    assert [s["sum_logprob"] for s in c1[S.OPTION_SCORES]] == [0.0, 1.0]
    assert (c1[S.PREDICTION], c1[S.CORRECT]) == ("(B)", True)


def test_cot_generation_answer_is_after_the_last_marker(predictions):
    g1, g2 = predictions["cot"]["g1"], predictions["cot"]["g2"]
    assert g1[S.RATIONALE] == COT_GEN["g1"]  # the whole generation is kept
    assert (g1[S.PREDICTION], g1[S.CORRECT], g1[S.NUMERIC_CORRECT]) == ("18", True, True)
    # Official: everything after the last [ANSWER] (the lenient indicators would have kept "18.").
    assert g2[S.PREDICTION] == "18. The answer is 18."
    assert (g2[S.CORRECT], g2[S.NUMERIC_CORRECT]) == (False, True)


def test_direct_generation_is_the_stripped_output(predictions):
    for key in ("g1", "g2"):
        assert predictions["direct"][key][S.PREDICTION] == "18"
        assert predictions["direct"][key][S.CORRECT] is True


@pytest.mark.slow  # ~45 s on 2 shared cores (a Python worker imports transformers); the maths is in tests/udfs
def test_cot_prompt_is_the_official_round_trip(spark, tiny_models):
    """With the real prompt builder (tiny T5's tokenizer): stripped source, suffix appended, a long source cut
    from the right and flagged truncated."""
    from udfs.cot_prompt import prompt_udf

    long = {**EXAMPLES[0], S.EXAMPLE_ID: "c2", S.SOURCE: "  " + " ".join(f"w{i}" for i in range(600)) + "? "}
    examples = storage.examples_frame(spark, [{**EXAMPLES[0], S.SOURCE: "  Which is right?\n"}, long])
    udfs = CotUdfs(**{**_fake_udfs().__dict__, "prompt": lambda suffix: prompt_udf(
        str(tiny_models["tiny-t5"]), suffix, 512)})  # fmt: skip
    pred, _ = cot_eval.transform(examples, "direct", CotSettings(), "fake", udfs, 1)
    rows = {r[S.EXAMPLE_ID]: r for r in pred.select(S.EXAMPLE_ID, S.PROMPT, S.TRUNCATED).collect()}
    assert rows["c1"][S.PROMPT] == "Which is right?\n[ANSWER] " and rows["c1"][S.TRUNCATED] is False
    assert rows["c2"][S.PROMPT].startswith("w0 w1 ") and rows["c2"][S.PROMPT].endswith("\n[ANSWER] ")
    assert "w599" not in rows["c2"][S.PROMPT] and rows["c2"][S.TRUNCATED] is True
    assert pred.where(F.col(S.MODE) != "direct").count() == 0


# ---- resume: a killed run is continued, not redone -------------------------------------------------------------


def _marked_udfs(marker: float, fail_on: str | None = None):
    """Fakes whose option scores carry `marker` (which run made a row); generation fails on a prompt containing
    `fail_on`, as a killed or crashed run would stop there."""
    from pyspark.sql.functions import pandas_udf

    from udfs.generate import UDF_FIELDS
    from udfs.options import UDF_FIELDS as OPTION_FIELDS

    @pandas_udf(OPTION_FIELDS)
    def options(prompt: pd.Series, prefix: pd.Series, option: pd.Series) -> pd.DataFrame:
        n = len(option)
        return pd.DataFrame({"sum_logprob": [marker] * n, "n_tokens": [1] * n, "n_bytes": [1] * n,
                             "truncated": [False] * n, "error": [None] * n})  # fmt: skip

    @pandas_udf(UDF_FIELDS)
    def gen(prompt: pd.Series) -> pd.DataFrame:
        if fail_on is not None and any(fail_on in p for p in prompt):
            raise RuntimeError("killed")
        n = len(prompt)
        return pd.DataFrame({"text": ["18"] * n, "n_tokens": [8] * n, "truncated": [False] * n, "error": [None] * n})

    return CotUdfs(options=options, direct_generate=gen, rationale=gen, cot_generate=gen)


@pytest.mark.slow  # three job runs of a few chunks each: ~1-2 min on 2 shared cores
def test_killed_run_resumes_where_it_stopped(spark, make_settings):
    base = ["cot.datasets=[]", "cot.custom_path=tests/data/cot_custom.jsonl", "cot.modes=[direct]",
            "cot.chunk_examples=2", "cot.source_roundtrip=false", "cot.bootstrap_resamples=10"]  # fmt: skip
    settings = make_settings(*base)
    # capitals 1-2 (chunk 1), sums 1-2 (chunk 2: dies on "1,000 + 1,125"), yesno 1: only chunk 1 is committed.
    with pytest.raises(Exception, match="killed"):
        cot_eval.run(spark, settings, "first", _marked_udfs(-1.0, fail_on="1,000 + 1,125"))
    table = settings.table("cot_predictions")
    first = {r[S.EXAMPLE_ID] + r[S.TASK] for r in spark.read.format("delta").load(table).collect()}
    assert first == {"1capitals", "2capitals"}

    result = cot_eval.run(spark, settings, "second", _marked_udfs(-2.0))
    assert (result["direct_resumed"], result["direct_predictions"], result["direct_reconciled"]) == (2, 5, 1)
    rows = spark.read.format("delta").load(table).collect()
    marker = {(r[S.TASK], r[S.EXAMPLE_ID]): (r[S.OPTION_SCORES][0]["sum_logprob"] if r[S.OPTION_SCORES] else None)
              for r in rows}  # fmt: skip
    # Resumed rows keep the first run's scores (not redone); the rest are the second run's.
    assert marker == {("capitals", "1"): -1.0, ("capitals", "2"): -1.0, ("sums", "1"): None, ("sums", "2"): None,
                      ("yesno", "1"): -2.0}  # fmt: skip
    assert len({r[S.PROTOCOL_HASH] for r in rows}) == 1
    # The metrics count every example of the run, resumed or new.
    micro = result["metrics"]
    assert int(micro[(micro[S.AGGREGATE] == "micro") & (micro[S.METRIC_NAME] == "accuracy")][S.N].iloc[0]) == 5

    # Another protocol (greedy) reuses nothing: its rows sit beside the first protocol's.
    greedy = make_settings(*base, "cot.sample=false")
    assert storage.protocol_hash(greedy) != storage.protocol_hash(settings)
    again = cot_eval.run(spark, greedy, "third", _marked_udfs(-3.0))
    assert (again["direct_resumed"], again["direct_predictions"]) == (0, 5)
    assert spark.read.format("delta").load(table).count() == 10


# ---- few-shot (cot.fewshot): an option beside the zero-shot protocol ---------------------------------------------
FEWSHOT = {("t", "cls"): ("Pick the right one.\n\nQ: Is A right?\nA: Let's think step by step. No. So the answer is "
                          "(B).\n\nQ: ", "\nA: Let's think step by step.\n")}  # fmt: skip


def test_fewshot_cot_prompts_carry_the_exemplars_and_the_rest_stay_zero_shot(spark):
    examples = storage.examples_frame(spark, EXAMPLES)
    udfs, cfg = _fake_udfs(), CotSettings(fewshot=1)
    runs = [cot_eval.transform(examples, mode, cfg, "fake", udfs, 1, fewshot=FEWSHOT)[0] for mode in ("direct", "cot")]
    got = {(r[S.MODE], r[S.EXAMPLE_ID]): r.asDict() for r in runs[0].unionByName(runs[1]).collect()}
    assert len(got) == 6
    c1 = got[("cot", "c1")]
    assert c1[S.PROMPT] == (
        "Pick the right one.\n\nQ: Is A right?\nA: Let's think step by step. No. So the answer is (B).\n\n"
        "Q: Which is right?\nA: Let's think step by step.\n"
    )
    assert c1[S.TRUNCATED] is False and (c1[S.PREDICTION], c1[S.CORRECT]) == ("(B)", True)
    # A task without exemplars keeps its zero-shot CoT prompt; Direct prompts are never few-shot.
    assert got[("cot", "g1")][S.PROMPT] == "What is half of 36?\n\nLet's think step by step.\n"
    assert got[("direct", "c1")][S.PROMPT] == "Which is right?\n[ANSWER] "


def test_protocol_hash_tells_few_shot_from_zero_shot_and_keeps_the_zero_shot_one():
    def fingerprint(*overrides: str) -> str:
        return storage.protocol_hash(load_settings(overrides=list(overrides), environ={}))

    zero = fingerprint()
    # Zero-shot ignores mgsm_exemplars, so fingerprints stored before few-shot existed still resume.
    assert fingerprint("cot.mgsm_exemplars=english") == zero
    three, english = fingerprint("cot.fewshot=3"), fingerprint("cot.fewshot=3", "cot.mgsm_exemplars=english")
    assert len({zero, three, english, fingerprint("cot.fewshot=1")}) == 4
    assert "fewshot=3 (official 0)" in cot_eval.protocol_line(CotSettings(fewshot=3))
