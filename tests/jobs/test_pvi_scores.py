"""jobs.receval.pvi_scores: exact request strings, hand-computed intra_pvi / info_gain with a fake LM, n+1 passes."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from tolerance import exact, loglik_approx

from jobs.receval import pvi_scores as P
from schemas import step_scores as SS
from schemas import steps as ST
from udfs import loglik

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def fake_lm(role: str, sources, targets):
    """meanlogp is a known function of the strings: g -len(source)/100, g' -len(target)/10, L -len(source)/10."""
    out = []
    for s, t in zip(sources, targets, strict=True):
        if "boom" in s or "boom" in t:
            raise ValueError("boom in the input")
        mean = {"pvi_g": -len(s) / 100, "pvi_null": -len(t) / 10, "info_gain": -len(s) / 10}[role]
        out.append(loglik.TargetScore(mean * len(t), len(t), mean))
    return out


class RecordingLM:
    """fake_lm that also appends every pair it scores to a file (executors are other processes)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __call__(self, role, sources, targets):
        call = uuid.uuid4().hex  # which pairs reached the scorer together
        with open(self.path, "a") as f:
            for s, t in zip(sources, targets, strict=True):
                f.write(f"{role}\t{s}\t{t}\t{call}\n")
        return fake_lm(role, sources, targets)


def step(chain: str, idx: int, n: int, text: str, premises: list[str], conclusion: str, h: str = "h") -> tuple:
    return (chain, h, idx, n, text, premises, conclusion, "sentence", "position", "spacy:test")


def frames(spark, steps: list[tuple], answers: dict[str, str | None], h: str = "h"):
    steps_df = spark.createDataFrame(steps, ST.SCHEMA)
    ctx = spark.createDataFrame([(c, h, ["x."], a, "given") for c, a in answers.items()], ST.CONTEXTS_SCHEMA)
    return steps_df, ctx


CHAIN = [
    step("c1", 0, 2, "Cats purr.", [], "cats purr"),
    step("c1", 1, 2, "It is warm, so cats are happy.", ["it is warm"], "cats are happy"),
]


def test_chain_requests_exact_strings():
    reqs = P.chain_requests(
        ["Cats purr.", "It is warm, so cats are happy."], [[], ["it is warm"]], ["cats purr", "cats are happy"], "yes"
    )
    got = [(r.step_idx, r.kind, r.source, r.target) for r in reqs]
    assert got == [
        (0, "g", "Generate entailed sentence: None ->", " cats purr"),
        (0, "null", "Generate entailed sentence: None ->", " cats purr"),
        (0, "ig_prev", " Therefore,", " yes"),
        (0, "ig_cur", " Cats purr. Therefore,", " yes"),
        (1, "g", "Generate entailed sentence: it is warm & cats purr ->", " cats are happy"),
        (1, "null", "Generate entailed sentence: None ->", " cats are happy"),
        (1, "ig_prev", " Cats purr. Therefore,", " yes"),
        (1, "ig_cur", " Cats purr. It is warm, so cats are happy. Therefore,", " yes"),
    ]


def test_chain_requests_seq2seq_prefix_and_history():
    reqs = P.chain_requests(["A.", "B."], [["p"], ["q"]], ["a", "b"], "z", family="seq2seq", history="none")
    ig = [r.source for r in reqs if r.kind in ("ig_prev", "ig_cur")]
    assert ig == ["Generate final answer: Therefore,", "Generate final answer: A. Therefore,",
                  "Generate final answer: A. Therefore,", "Generate final answer: A. B. Therefore,"]
    assert [r.source for r in reqs if r.kind == "g"] == ["Generate entailed sentence: p ->",
                                                         "Generate entailed sentence: q ->"]
    # the answer is the decoder target, never inside the encoder input
    assert all("z" not in r.source for r in reqs)
    last_one = P.chain_requests(["A.", "B.", "C."], [[], [], []], ["a", "b", "c"], None, history=1)
    assert [r.source for r in last_one if r.kind == "g"] == [
        "Generate entailed sentence: None ->", "Generate entailed sentence: a ->", "Generate entailed sentence: b ->"]
    assert not [r for r in last_one if r.kind.startswith("ig")]


def test_transform_hand_computed_scores(spark, make_settings):
    settings = make_settings()
    steps_df, ctx = frames(spark, [*CHAIN, step("c2", 0, 1, "Dogs bark.", ["dogs"], "dogs bark")],
                           {"c1": "yes", "c2": None})
    got = {(r.chain_id, r.step_idx): r for r in P.transform(steps_df, ctx, settings, fake_lm).collect()}
    assert len(got) == 3
    a, b, c = got[("c1", 0)], got[("c1", 1)], got[("c2", 0)]
    # The fake LM's scores are exact rationals; the job's arithmetic on them is float64.
    # g: len("Generate entailed sentence: None ->") = 35; g': len(" cats purr") = 10
    assert (a.pvi_g_logp, a.pvi_null_logp, a.intra_pvi) == exact((-0.35, -1.0, 0.65))
    # g: len("Generate entailed sentence: it is warm & cats purr ->") = 53; g': len(" cats are happy") = 15
    assert (b.pvi_g_logp, b.pvi_null_logp, b.intra_pvi) == exact((-0.53, -1.5, 0.97))
    # L(0) = -len(" Therefore,")/10 = -1.1; L(1) = -len(" Cats purr. Therefore,")/10 = -2.2;
    # L(2) = -len(" Cats purr. It is warm, so cats are happy. Therefore,")/10 = -5.3
    assert (a.ig_l_prev, a.ig_l, a.info_gain) == exact((-1.1, -2.2, -1.1))
    assert (b.ig_l_prev, b.ig_l, b.info_gain) == exact((-2.2, -5.3, -3.1))
    # no answer: no information gain, the PVI still there; g: len("Generate entailed sentence: dogs ->") = 35
    assert c.info_gain is None and c.ig_l is None and c.intra_pvi == exact(-0.35 + 1.0)
    assert {r.error for r in got.values()} == {None}
    assert a.config_hash == "h" and a.pvi_model == settings.models.pvi_g.path
    assert a.ig_model == settings.models.info_gain.path


def test_transform_n_plus_one_info_gain_passes_and_one_null_pass_per_conclusion(spark, make_settings, tmp_path):
    n = 5
    conclusions = ["a", "b", "a", "b", "c"]  # three distinct conclusions
    steps = [step("c5", i, n, f"Step number {i}.", [f"p{i}"], conclusions[i]) for i in range(n)]
    steps_df, ctx = frames(spark, steps, {"c5": "42"})
    log = tmp_path / "calls.tsv"
    rows = P.transform(steps_df, ctx, make_settings(), RecordingLM(log)).collect()
    assert len(rows) == n
    calls = [line.split("\t") for line in log.read_text().splitlines()]
    ig = [c for c in calls if c[0] == "info_gain"]
    assert len(ig) == n + 1  # L(0..n), not 2n
    assert len({c[1] for c in ig}) == n + 1
    assert sorted(c[2] for c in calls if c[0] == "pvi_null") == [" a", " b", " c"]
    assert len([c for c in calls if c[0] == "pvi_g"]) == n
    # info gains telescope: their sum is L(n) - L(0) (the fake's float64 values: exact)
    by_idx = {r.step_idx: r for r in rows}
    assert sum(r.info_gain for r in rows) == exact(by_idx[n - 1].ig_l - by_idx[0].ig_l_prev)


def test_transform_gives_the_scorer_each_chains_info_gain_passes_together(spark, make_settings, tmp_path):
    # Prefix sharing needs a chain's L(k) passes in one scorer call; deduplication must not scatter them.
    chains = {f"k{c}": 2 + c % 3 for c in range(8)}
    steps = [step(c, i, n, f"Chain {c} step {i}.", [], f"{c} {i}") for c, n in chains.items() for i in range(n)]
    steps_df, ctx = frames(spark, steps, {c: "same answer" for c in chains})  # L(0) is shared by all chains
    log = tmp_path / "calls.tsv"
    rows = P.transform(steps_df.repartition(3), ctx, make_settings("spark.shuffle_partitions=3"), RecordingLM(log))
    assert rows.where("error is null").count() == len(steps)
    calls = [line.split("\t") for line in log.read_text().splitlines()]
    ig = [c for c in calls if c[0] == "info_gain"]
    assert len(ig) == sum(chains.values()) + 1  # L(1..n) per chain, one L(0) for all
    for chain, n in chains.items():
        mine = [c for c in ig if f"Chain {chain} step" in c[1]]
        assert len(mine) == n and len({c[3] for c in mine}) == 1, chain


def test_transform_quarantine_mode_marks_failing_step(spark, make_settings):
    steps_df, ctx = frames(spark, [*CHAIN, step("c3", 0, 1, "A boom.", [], "boom")], {"c1": "yes", "c3": "no"})
    rows = {(r.chain_id, r.step_idx): r for r in P.transform(steps_df, ctx, make_settings(), fake_lm).collect()}
    assert rows[("c1", 0)].error is None and rows[("c1", 1)].intra_pvi == exact(0.97)
    bad = rows[("c3", 0)]
    assert "boom in the input" in bad.error and bad.intra_pvi is None


def test_transform_fail_mode_raises(spark, make_settings):
    steps_df, ctx = frames(spark, [step("c3", 0, 1, "A boom.", [], "boom")], {"c3": "no"})
    with pytest.raises(Exception, match="boom in the input"):
        P.transform(steps_df, ctx, make_settings("runtime.on_row_error=fail"), fake_lm).collect()


@pytest.mark.slow
def test_run_writes_step_scores_and_quarantine(spark, make_settings):
    from jobs.infra import tables
    settings = make_settings()
    h = settings.scoring_hash()
    steps = [
        step("c1", 0, 2, "Cats purr.", [], "cats purr", h),
        step("c1", 1, 2, "It is warm, so cats are happy.", ["it is warm"], "cats are happy", h),
        step("c3", 0, 1, "A boom.", [], "boom", h),
        step("old", 0, 1, "Other config.", [], "other", "not-this-hash"),
    ]
    steps_df, ctx = frames(spark, steps, {"c1": "yes", "c3": "no"}, h)
    steps_df.write.format("delta").save(settings.table("steps"))
    ctx.write.format("delta").save(settings.table("contexts"))
    counts = P.run(spark, settings, scorer=fake_lm)
    assert counts == {"steps_in": 3, "steps_scored": 2, "steps_quarantined": 1, "steps_truncated": 0}
    out = tables.read(spark, settings.table("step_scores")).orderBy(SS.STEP_IDX).collect()
    assert [(r.chain_id, r.step_idx, r.config_hash) for r in out] == [("c1", 0, h), ("c1", 1, h)]
    assert out[1].info_gain == exact(-3.1) and out[1].intra_pvi == exact(0.97)
    assert out[0].intra_entail is None  # NLI columns are another job's
    q = tables.read(spark, settings.table("quarantine")).where(F.col("stage") == "pvi").collect()
    assert [(r.chain_id, r.reason) for r in q] == [("c3", "scoring_error")]
    # a rerun skips chains already scored and rewrites nothing
    again = P.run(spark, settings, scorer=fake_lm)
    assert again["steps_in"] == 1 and again["steps_scored"] == 0


def test_transform_real_tiny_models_match_direct_scores(spark, make_settings, tiny_models):
    from udfs import runtime

    settings = make_settings("runtime.device=cpu")
    steps_df, ctx = frames(spark, CHAIN, {"c1": "yes"})
    rows = {r.step_idx: r for r in P.transform(steps_df, ctx, settings).collect()}
    t5, t5_tok = runtime.load_model(str(tiny_models["tiny-t5"]), "seq2seq")
    gpt, gpt_tok = runtime.load_model(str(tiny_models["tiny-gpt2"]), "causal")
    g = loglik.score(t5, t5_tok, "seq2seq", ["Generate entailed sentence: it is warm & cats purr ->"],
                     [" cats are happy"])[0].mean_logprob
    null = loglik.score(t5, t5_tok, "seq2seq", ["Generate entailed sentence: None ->"], [" cats are happy"])[0]
    ls = loglik.score(gpt, gpt_tok, "causal", [" Cats purr. Therefore,",
                                               " Cats purr. It is warm, so cats are happy. Therefore,"], [" yes"] * 2)
    # Differences of float32 log-likelihoods (other batches in the job): tolerance scaled by both terms.
    assert rows[1].intra_pvi == loglik_approx(g - null.mean_logprob, g, null.mean_logprob)
    l0, l1 = (x.mean_logprob for x in ls)
    assert rows[1].info_gain == loglik_approx(l1 - l0, l1, l0)
    assert rows[1].pvi_g_logp == loglik_approx(g) and rows[1].ig_l == loglik_approx(l1)
