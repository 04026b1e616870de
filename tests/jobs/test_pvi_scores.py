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
from udfs import pvi_prompts as PP

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _transform(steps, contexts, settings, scorer=None):
    return P.transform(steps, contexts, settings.pvi, settings.models, settings.runtime, scorer)


def _requests(steps, contexts, settings):
    return P.requests(steps, contexts, settings.pvi, settings.models)


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
    reqs = PP.chain_requests(
        ["Cats purr.", "It is warm, so cats are happy."], [[], ["it is warm"]], ["cats purr", "cats are happy"], "yes"
    )
    got = [(r.step_idx, r.kind, r.source, r.target) for r in reqs]
    assert got == [
        # no premise text: the official empty join (two spaces), not g' own "None ->" (issue #17)
        (0, "g", "Generate entailed sentence:  ->", " cats purr"),
        (0, "null", "Generate entailed sentence: None ->", " cats purr"),
        (0, "ig_prev", " Therefore,", " yes"),
        (0, "ig_cur", " Cats purr. Therefore,", " yes"),
        (1, "g", "Generate entailed sentence: it is warm & cats purr ->", " cats are happy"),
        (1, "null", "Generate entailed sentence: None ->", " cats are happy"),
        (1, "ig_prev", " Cats purr. Therefore,", " yes"),
        (1, "ig_cur", " Cats purr. It is warm, so cats are happy. Therefore,", " yes"),
    ]


def test_chain_requests_seq2seq_prefix_and_history():
    reqs = PP.chain_requests(["A.", "B."], [["p"], ["q"]], ["a", "b"], "z", family="seq2seq", history="none")
    ig = [r.source for r in reqs if r.kind in ("ig_prev", "ig_cur")]
    assert ig == ["Generate final answer: Therefore,", "Generate final answer: A. Therefore,",
                  "Generate final answer: A. Therefore,", "Generate final answer: A. B. Therefore,"]
    assert [r.source for r in reqs if r.kind == "g"] == ["Generate entailed sentence: p ->",
                                                         "Generate entailed sentence: q ->"]
    # the answer is the decoder target, never inside the encoder input
    assert all("z" not in r.source for r in reqs)
    last_one = PP.chain_requests(["A.", "B.", "C."], [[], [], []], ["a", "b", "c"], None, history=1)
    assert [r.source for r in last_one if r.kind == "g"] == [
        "Generate entailed sentence:  ->", "Generate entailed sentence: a ->", "Generate entailed sentence: b ->"]
    assert not [r for r in last_one if r.kind.startswith("ig")]


def test_g_source_without_premises_is_the_official_empty_join_and_none_is_an_option():
    # The official code builds g's input as prefix + " & ".join(premises) + " ->", also for an empty list.
    official = "Generate entailed sentence: " + " & ".join([]) + " ->"
    assert official == "Generate entailed sentence:  ->"
    assert PP.g_source([]) == official != PP.NULL_SOURCE
    assert PP.g_source([], "none") == "Generate entailed sentence: None ->" == PP.NULL_SOURCE
    assert PP.g_source(["a", "b"], "none") == PP.g_source(["a", "b"]) == "Generate entailed sentence: a & b ->"
    none = PP.chain_requests(["Cats purr."], [[]], ["cats purr"], None, empty_premises="none")
    assert [r.source for r in none] == [PP.NULL_SOURCE, PP.NULL_SOURCE]


def test_requests_send_the_configured_empty_premise_source(spark, make_settings):
    # The default (empty_join) reaches the scores in test_transform_hand_computed_scores; here the option does.
    steps_df, ctx = frames(spark, CHAIN, {"c1": None})
    reqs = _requests(steps_df, ctx, make_settings("pvi.empty_premises=none")).where("kind = 'g'").collect()
    assert sorted(r.source for r in reqs) == [PP.NULL_SOURCE, "Generate entailed sentence: it is warm & cats purr ->"]
    assert make_settings().scoring_hash() != make_settings("pvi.empty_premises=none").scoring_hash()


def test_transform_hand_computed_scores(spark, make_settings):
    settings = make_settings()
    steps_df, ctx = frames(spark, [*CHAIN, step("c2", 0, 1, "Dogs bark.", ["dogs"], "dogs bark")],
                           {"c1": "yes", "c2": None})
    got = {(r.chain_id, r.step_idx): r for r in _transform(steps_df, ctx, settings, fake_lm).collect()}
    assert len(got) == 3
    a, b, c = got[("c1", 0)], got[("c1", 1)], got[("c2", 0)]
    # The fake LM's scores are exact rationals; the job's arithmetic on them is float64.
    # g: len("Generate entailed sentence:  ->") = 31; g': len(" cats purr") = 10
    assert (a.pvi_g_logp, a.pvi_null_logp, a.intra_pvi) == exact((-0.31, -1.0, 0.69))
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
    rows = _transform(steps_df, ctx, make_settings(), RecordingLM(log)).collect()
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
    rows = _transform(steps_df.repartition(3), ctx, make_settings("spark.shuffle_partitions=3"), RecordingLM(log))
    assert rows.where("error is null").count() == len(steps)
    calls = [line.split("\t") for line in log.read_text().splitlines()]
    ig = [c for c in calls if c[0] == "info_gain"]
    assert len(ig) == sum(chains.values()) + 1  # L(1..n) per chain, one L(0) for all
    for chain, n in chains.items():
        mine = [c for c in ig if f"Chain {chain} step" in c[1]]
        assert len(mine) == n and len({c[3] for c in mine}) == 1, chain


def test_transform_quarantine_mode_marks_failing_step(spark, make_settings):
    steps_df, ctx = frames(spark, [*CHAIN, step("c3", 0, 1, "A boom.", [], "boom")], {"c1": "yes", "c3": "no"})
    rows = {(r.chain_id, r.step_idx): r for r in _transform(steps_df, ctx, make_settings(), fake_lm).collect()}
    assert rows[("c1", 0)].error is None and rows[("c1", 1)].intra_pvi == exact(0.97)
    bad = rows[("c3", 0)]
    assert "boom in the input" in bad.error and bad.intra_pvi is None


def test_transform_fail_mode_raises(spark, make_settings):
    steps_df, ctx = frames(spark, [step("c3", 0, 1, "A boom.", [], "boom")], {"c3": "no"})
    with pytest.raises(Exception, match="boom in the input"):
        _transform(steps_df, ctx, make_settings("runtime.on_row_error=fail"), fake_lm).collect()


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


@pytest.fixture(scope="module")
def real_scores(spark, tiny_models, tmp_path_factory) -> dict[tuple[str, int], object]:
    """One transform with the real tiny models over CHAIN and the long chains below (one Spark run: the model
    workers start once for both tests that read it)."""
    from jobs.infra.config_layers import load_settings

    lake = tmp_path_factory.mktemp("pvi-real")
    settings = load_settings(overrides=[f"paths.lake={lake}", "runtime.device=cpu", "spark.master=local[2]",
                                        "spark.shuffle_partitions=2"], environ={})
    assert settings.runtime.max_length == 512  # the NLI cap; it must not cut the LMs' inputs
    long_steps, answers = long_chain_rows()
    steps_df, ctx = frames(spark, [*CHAIN, *long_steps], {"c1": "yes", **answers})
    return {(r.chain_id, r.step_idx): r for r in _transform(steps_df, ctx, settings).collect()}


def test_transform_real_tiny_models_match_direct_scores(real_scores, tiny_models):
    from udfs import runtime

    rows = {i: r for (c, i), r in real_scores.items() if c == "c1"}
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


# --- long chains: every pass scored whole up to the model's own limit, equal to an unbatched reference ----------

EB_DEV = Path(__file__).resolve().parents[1] / "data" / "entailment_bank" / "task_1_dev_head.jsonl"
# Long chains built from EB dev trees: one step per tree (its steps rendered as the official code does; premises
# its facts, conclusion its hypothesis), trees repeated. "whole" runs past 512 tiny-GPT-2 tokens at L(n) but fits
# its 1,024 positions; "over" runs past them from its 4th step on. Few long steps keep the test fast.
LONG_CHAINS = {"whole": [3, 5, 1], "over": [5, 4, 5, 3, 7]}
OFFICIAL_REL = 1e-5  # issue #17: step scores equal the official logic within 1e-5 relative


def long_chain_rows(h: str = "h") -> tuple[list[tuple], dict[str, str]]:
    from jobs.metaeval import entailment_bank as eb
    from jobs.training import train_pvi

    trees = eb.load_jsonl(EB_DEV)
    steps, answers = [], {}
    for chain, picks in LONG_CHAINS.items():
        for i, t in enumerate(picks):
            rendered, premises, _, hypothesis = train_pvi._eb_chain(trees[t])
            facts = [p for ps in premises for p in ps]
            # step 1 has no premise text (g reads the official empty join); the last step's premises repeat the
            # facts three times, so its g source runs past 512 T5 tokens
            facts = [] if i == 1 else facts * 3 if i == len(picks) - 1 else facts
            steps.append(step(chain, i, len(picks), " ".join(rendered), facts, hypothesis, h))
        answers[chain] = train_pvi._eb_chain(trees[picks[-1]])[3]
    return steps, answers


def reference_scores(t5, t5_tok, gpt, gpt_tok, steps: list[tuple], answer: str, limit: int) -> list[dict]:
    """The official scoring logic, one step at a time, plain transformers calls, no batching, no padding.

    g source: "Generate entailed sentence: " + " & ".join(premises + all earlier conclusions) + " ->";
    g' source: "Generate entailed sentence: None ->"; L(k): " " + " ".join(s(1..k)) + " Therefore," (L(0): "
    Therefore,"); targets " " + text; meanlogp = mean natural-log probability of the target tokens, no EOS.
    A causal row longer than `limit` positions keeps the last `limit - len(target)` source tokens (the documented
    cut) and is reported as truncated.
    """
    import torch

    def seq2seq(source: str, tgt: str) -> float:
        src = t5_tok(source)["input_ids"]  # with </s>, as T5 encodes its inputs
        ids = t5_tok(tgt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = t5(input_ids=torch.tensor([src]), labels=torch.tensor([ids])).logits[0]
        logp = torch.log_softmax(logits.double(), -1)
        return sum(float(logp[j, t]) for j, t in enumerate(ids)) / len(ids)

    def causal(source: str, tgt: str) -> tuple[float, bool]:
        src = gpt_tok(source, add_special_tokens=False)["input_ids"]
        ids = gpt_tok(tgt, add_special_tokens=False)["input_ids"]
        cut = len(src) + len(ids) > limit
        if cut:
            src = src[len(src) - (limit - len(ids)) :]
        with torch.no_grad():
            logits = gpt(torch.tensor([src + ids])).logits[0]
        logp = torch.log_softmax(logits.double(), -1)
        return sum(float(logp[len(src) - 1 + j, t]) for j, t in enumerate(ids)) / len(ids), cut

    def l_source(k: int) -> str:
        return (" " + " ".join(s[4] for s in steps[:k]) if k else "") + " Therefore,"

    out = []
    for i, s in enumerate(steps):
        premises = [*s[5], *(e[6] for e in steps[:i])]
        g = seq2seq("Generate entailed sentence: " + " & ".join(premises) + " ->", " " + s[6])
        null = seq2seq("Generate entailed sentence: None ->", " " + s[6])
        (prev, cut_prev), (cur, cut_cur) = causal(l_source(i), " " + answer), causal(l_source(i + 1), " " + answer)
        out.append({"pvi_g_logp": g, "pvi_null_logp": null, "intra_pvi": g - null, "ig_l_prev": prev, "ig_l": cur,
                    "info_gain": cur - prev, "pvi_truncated": cut_prev or cut_cur})
    return out


def test_long_chains_equal_unbatched_official_reference(real_scores, tiny_models):
    from udfs import runtime

    t5, t5_tok = runtime.load_model(str(tiny_models["tiny-t5"]), "seq2seq")
    gpt, gpt_tok = runtime.load_model(str(tiny_models["tiny-gpt2"]), "causal")
    limit = gpt.config.n_positions
    assert limit == 1024 and loglik.position_limit(gpt, gpt_tok) == 1024
    assert loglik.position_limit(t5, t5_tok) is None  # relative positions, tokenizer without a limit: no cut
    steps, answers = long_chain_rows()
    got = {key: r for key, r in real_scores.items() if key[0] in LONG_CHAINS}
    assert len(got) == len(steps) and {r.error for r in got.values()} == {None}

    worst, lengths = 0.0, {}
    for chain in LONG_CHAINS:
        mine = [s for s in steps if s[0] == chain]
        l_tokens = len(gpt_tok(" " + " ".join(s[4] for s in mine) + " Therefore,")["input_ids"])
        g_tokens = len(t5_tok("Generate entailed sentence: " + " & ".join([*mine[-1][5], *(s[6] for s in mine[:-1])])
                              + " ->")["input_ids"])
        lengths[chain] = (l_tokens, g_tokens)
        for i, want in enumerate(reference_scores(t5, t5_tok, gpt, gpt_tok, mine, answers[chain], limit)):
            row = got[(chain, i)]
            assert row.pvi_truncated == want["pvi_truncated"], (chain, i)
            for col in ("pvi_g_logp", "pvi_null_logp", "ig_l_prev", "ig_l"):
                assert getattr(row, col) == pytest.approx(want[col], rel=OFFICIAL_REL, abs=0), (chain, i, col)
            for col, (a, b) in (("intra_pvi", ("pvi_g_logp", "pvi_null_logp")), ("info_gain", ("ig_l", "ig_l_prev"))):
                # a difference of two float32 log-likelihoods: relative to its terms (tests/tolerance.py)
                tol = OFFICIAL_REL * (abs(want[a]) + abs(want[b]))
                assert abs(getattr(row, col) - want[col]) <= tol, (chain, i, col, getattr(row, col), want[col])
                worst = max(worst, abs(getattr(row, col) - want[col]) / (abs(want[a]) + abs(want[b])))
    print(f"max |got - reference| / (|a| + |b|) over {len(steps)} steps: {worst:.2e}; tokens (L(n), last g): {lengths}")
    # The chains are long where it matters: past the old fixed 512 cut, and the last one past GPT-2's 1,024.
    assert 512 < lengths["whole"][0] <= limit - 8
    assert lengths["over"][0] > limit and min(g for _, g in lengths.values()) > 512
    flagged = {(c, i) for (c, i), r in got.items() if r.pvi_truncated}
    assert flagged and all(c == "over" for c, _ in flagged)


# --- the paper profile never scores PVI with untrained models ------------------------------------------------


def trained_folder(tiny_models, path: Path, kind: str | None) -> Path:
    """A T5 folder as train_pvi leaves it (weights + train_pvi.json of `kind`); kind None: a plain model."""
    import shutil

    shutil.copytree(tiny_models["tiny-t5"], path)
    if kind is not None:
        (path / "train_pvi.json").write_text(f'{{"kind": "{kind}", "best_epoch": 1, "history": []}}')
    return path


def test_paper_profile_refuses_missing_or_untrained_pvi_models_before_any_table(spark, make_settings, tmp_path,
                                                                                tiny_models):
    from jobs.infra import tables
    from jobs.receval import pipeline
    from udfs.runtime import ModelUnavailable

    paper = make_settings("models.profile=paper")
    assert paper.models.require_trained_pvi
    assert (paper.models.pvi_g.path, paper.models.pvi_null.path) == ("models/pvi/g", "models/pvi/g_null")
    assert paper.train_pvi.base_model == "t5-large"  # the command in the message trains the paper's model
    missing = make_settings("models.profile=paper", f"models.pvi_g.path={tmp_path}/no-g")
    for check in (lambda: P.run(spark, missing), lambda: pipeline.prepare(missing)):
        with pytest.raises(ModelUnavailable) as err:
            check()
        message = str(err.value)
        assert "models.pvi_g" in message and "never scored with an untrained model" in message
        assert "python -m jobs.training.train_pvi --set models.profile=paper --set train_pvi.kind=g" in message
    for name in ("step_scores", "quarantine", "steps"):
        assert not tables.exists(spark, missing.table(name))

    # A plain (untrained) T5 folder is refused as well, and a g checkpoint cannot stand in for g'.
    plain = trained_folder(tiny_models, tmp_path / "plain", None)
    g = trained_folder(tiny_models, tmp_path / "g", "g")
    with pytest.raises(ModelUnavailable, match="not a trained PVI checkpoint"):
        P.check_trained(make_settings("models.profile=paper", f"models.pvi_g.path={plain}"))
    with pytest.raises(ModelUnavailable, match=r"models\.pvi_null: .* kind 'g', not 'g_null'.*train_pvi.kind=g_null"):
        P.check_trained(make_settings("models.profile=paper", f"models.pvi_g.path={g}", f"models.pvi_null.path={g}"))
    null = trained_folder(tiny_models, tmp_path / "g_null", "g_null")
    P.check_trained(make_settings("models.profile=paper", f"models.pvi_g.path={g}", f"models.pvi_null.path={null}"))
    P.check_trained(make_settings())  # offline profile: tiny random models are allowed (they prove the plumbing)


def test_small_profile_requires_a_trained_seq2seq_info_gain_model_too(make_settings, tmp_path, tiny_models):
    """The small profile's own L(k) model is the pretrained causal gemma3-270m; its scratch seq2seq option
    (models.info_gain family seq2seq) is train_pvi's "Generate final answer:" task, so it must be trained."""
    from udfs.runtime import ModelUnavailable

    g = trained_folder(tiny_models, tmp_path / "g", "g")
    null = trained_folder(tiny_models, tmp_path / "g_null", "g_null")
    trained = ("models.profile=small", f"models.pvi_g.path={g}", f"models.pvi_null.path={null}")
    seq2seq = ("models.info_gain.family=seq2seq", "pvi.info_gain_family=seq2seq")
    plain = trained_folder(tiny_models, tmp_path / "plain", None)
    with pytest.raises(ModelUnavailable) as err:
        P.check_trained(make_settings(*trained, *seq2seq, f"models.info_gain.path={plain}"))
    assert "models.info_gain" in str(err.value)
    assert "python -m jobs.training.train_pvi --set models.profile=small --set train_pvi.kind=info_gain" in str(err.value)
    info_gain = trained_folder(tiny_models, tmp_path / "info_gain", "info_gain")
    P.check_trained(make_settings(*trained, *seq2seq, f"models.info_gain.path={info_gain}"))
    # A causal L(k) model is a plain LM, as in the official code (the paper profile's GPT-2 XL, the small
    # profile's gemma3-270m): not checked.
    P.check_trained(make_settings(*trained, f"models.info_gain.path={tiny_models['tiny-gpt2']}",
                                  "models.info_gain.family=causal", "pvi.info_gain_family=causal"))
