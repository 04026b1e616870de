"""jobs.receval.nli_scores: pair generation per history option, dedup, step scores, quarantine, the job end to end."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual
from tolerance import EXACT_ABS, EXACT_REL, exact, prob_approx

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.config_paths import PROJECT_ROOT, resolve_path
from jobs.metaeval.settings import PerturbSettings
from jobs.receval import nli_scores
from schemas import quarantine as Q
from schemas import step_scores as SS
from schemas import steps as S
from udfs.model_paths import SMALL_NLI, small_built
from udfs.runtime import ModelUnavailable

# The fake NLI below runs in Spark's Python workers, which cannot import this test module by name.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

EB_TEST = resolve_path(PerturbSettings().eb_task1_test)  # the whole set: @pytest.mark.dataset("entailment_bank")
EB_HEAD = PROJECT_ROOT / "tests" / "data" / "entailment_bank" / "task_1_test_head.jsonl"  # its first 8 trees


# -- a deterministic fake NLI: probabilities are a known function of the pair --------------------------
def fake_probs(premise: str, hypothesis: str) -> tuple[float, float, float]:
    """(entail, neutral, contradiction) = (len(p), len(h), 10) / (len(p) + len(h) + 10)."""
    total = len(premise) + len(hypothesis) + 10
    return len(premise) / total, len(hypothesis) / total, 10 / total


def _fake_factory(log: str | None = None):
    def predict(premises: list[str], hypotheses: list[str]) -> np.ndarray:
        if any("POISON" in p for p in premises):
            raise ValueError("poisoned premise")
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write("".join(f"{p}\t{h}\n" for p, h in zip(premises, hypotheses, strict=True)))
        return np.array([fake_probs(p, h) for p, h in zip(premises, hypotheses, strict=True)])

    return predict


def logging_fake(path: Path):
    return functools.partial(_fake_factory, str(path))


# -- building input frames in the steps/contexts schemas --------------------------------------------------
Chain = tuple[str, list[str] | None, list[tuple[list[str], str]]]  # id, context sentences (None: no row), steps


def frames(spark: SparkSession, chains: list[Chain], config_hash: str) -> tuple[DataFrame, DataFrame]:
    step_rows, ctx_rows = [], []
    for chain_id, context, steps in chains:
        for i, (premise_rcus, conclusion) in enumerate(steps):
            text = f"{' and '.join(premise_rcus)}, so {conclusion}."
            step_rows.append(
                (chain_id, config_hash, i, len(steps), text, premise_rcus, conclusion, "given", "position", "test")
            )
        if context is not None:
            ctx_rows.append((chain_id, config_hash, context, None, "last_conclusion"))
    return spark.createDataFrame(step_rows, S.SCHEMA), spark.createDataFrame(ctx_rows, S.CONTEXTS_SCHEMA)


def reference(chains: list[Chain], intra_history: str | int, inter_history: str | int) -> list[tuple]:
    """The ReCEval formulas as plain loops (the official code's order: premise RCUs, then earlier conclusions)."""

    def history(earlier: list[tuple[int, str]], option: str | int) -> list[tuple[int, str]]:
        if option == "all":
            return earlier
        if option == "none":
            return []
        return earlier[-int(option) :]

    rows = []
    for chain_id, context, steps in chains:
        sentences = [s for s in context or [] if s.strip()]
        for i, (premise_rcus, conclusion) in enumerate(steps):
            earlier = [(j, steps[j][1]) for j in range(i) if steps[j][1].strip()]
            parts = [p for p in premise_rcus + [c for _, c in history(earlier, intra_history)] if p.strip()]
            premise = " and ".join(parts) if parts else None
            entail = fake_probs(premise, conclusion)[0] if premise else 1.0
            candidates = [(s, "context") for s in sentences]
            candidates += [(c, f"step:{j}") for j, c in history(earlier, inter_history)]
            worst = None
            for text, source in candidates:  # strict >: ties keep the earliest candidate
                contra = fake_probs(text, conclusion)[2]
                if worst is None or contra > worst[0]:
                    worst = (contra, text, source)
            inter = 1.0 - worst[0] if worst else 1.0
            rows.append(
                (chain_id, i, "h", entail, premise, inter, *(worst if worst else (None, None, None)), None)
            )
    return rows


ONE = ("one", ["ab", "  "], [(["p"], "q")])
TWO = ("two", ["wxyz1"], [([], "c0c0"), (["pp"], "c1")])
FIVE = (
    "five",
    None,  # no contexts row at all: the inter set holds only earlier conclusions
    [(["a0", "b0"], "k0"), (["a11"], "k11"), ([], "k222"), (["a3333", ""], "k3"), (["a4"], "k44444")],
)
CHAINS = [ONE, TWO, FIVE]


def _sorted(df: DataFrame) -> list:
    return sorted(df.collect(), key=lambda r: (r[S.CHAIN_ID], r[S.STEP_IDX]))


@pytest.mark.parametrize(
    ("intra_history", "inter_history"), [("all", "all"), ("none", 1), (2, 2)], ids=["all-all", "none-1", "2-2"]
)
def test_transform_exact_values_per_history_option(spark, make_settings, intra_history, inter_history):
    settings = make_settings(f"nli.intra_history={intra_history}", f"nli.inter_history={inter_history}")
    steps, contexts = frames(spark, CHAINS, "h")
    result = nli_scores.transform(steps, contexts, settings.nli, settings.models.nli, settings.runtime,
                                  predict=_fake_factory)
    assertSchemaEqual(result.schema, nli_scores.OUTPUT_SCHEMA)
    rows = _sorted(result)  # one Spark job: the machine is shared
    expected = [Row(**dict(zip(nli_scores.OUTPUT_SCHEMA.names, r, strict=True))) for r in reference(CHAINS, intra_history, inter_history)]
    # The fake's probabilities are exact rationals: the job's float64 arithmetic on them keeps them exact.
    assertDataFrameEqual(rows, expected, rtol=EXACT_REL, atol=EXACT_ABS)

    got = {(r[S.CHAIN_ID], r[S.STEP_IDX]): r for r in rows}
    # Hand-computed: fake (entail, neutral, contradiction) = (len p, len h, 10) / (len p + len h + 10).
    assert got[("one", 0)][SS.INTRA_ENTAIL] == exact(1 / 12)  # "p" -> "q"
    assert got[("one", 0)][SS.INTER] == exact(3 / 13)  # "ab" -> "q"; the blank sentence is skipped
    assert got[("two", 0)][SS.INTRA_ENTAIL] == 1.0 and got[("two", 0)][SS.INTRA_PREMISE] is None
    assert got[("two", 0)][SS.INTER] == exact(9 / 19)  # "wxyz1" -> "c0c0"
    assert got[("five", 0)][SS.INTER] == 1.0 and got[("five", 0)][SS.INTER_WORST_SOURCE] is None
    two_1, five_4 = got[("two", 1)], got[("five", 4)]
    if intra_history == "none":
        assert two_1[SS.INTRA_PREMISE] == "pp" and two_1[SS.INTRA_ENTAIL] == exact(2 / 14)
        assert five_4[SS.INTRA_PREMISE] == "a4"
        assert got[("five", 2)][SS.INTRA_ENTAIL] == 1.0  # no premise RCUs and no history: no premise text
    else:
        assert two_1[SS.INTRA_PREMISE] == "pp and c0c0" and two_1[SS.INTRA_ENTAIL] == exact(11 / 23)
        assert five_4[SS.INTRA_PREMISE] == (
            "a4 and k0 and k11 and k222 and k3" if intra_history == "all" else "a4 and k222 and k3"
        )
    # step 1 of "two": "c0c0" (10/16) contradicts more than "wxyz1" (10/17) whenever step 0 is in the history.
    assert two_1[SS.INTER] == exact(6 / 16)
    assert (two_1[SS.INTER_WORST_PREMISE], two_1[SS.INTER_WORST_SOURCE]) == ("c0c0", "step:0")
    if inter_history == "all":  # "k0" and "k3" tie (length 2): the earlier one is reported
        assert (five_4[SS.INTER_WORST_PREMISE], five_4[SS.INTER_WORST_SOURCE]) == ("k0", "step:0")
    else:
        assert (five_4[SS.INTER_WORST_PREMISE], five_4[SS.INTER_WORST_SOURCE]) == ("k3", "step:3")
    assert five_4[SS.INTER] == exact(8 / 18)


SHARED = ["the shared first sentence", "the shared second sentence", "the shared first sentence"]
TWINS = [
    ("twin-a", SHARED, [(["p"], "c0"), (["p"], "c1")]),
    ("twin-b", SHARED, [(["p"], "c0"), (["p"], "c1")]),
]


def test_transform_sends_each_distinct_pair_once(spark, make_settings, tmp_path):
    log = tmp_path / "pairs.tsv"
    steps, contexts = frames(spark, TWINS, "h")
    settings = make_settings()
    result = nli_scores.transform(steps, contexts, settings.nli, settings.models.nli, settings.runtime,
                                  predict=logging_fake(log))
    rows = result.collect()
    sent = log.read_text(encoding="utf-8").splitlines()
    # Per chain: step 0 = 1 intra + 3 context pairs, step 1 = 1 intra + 3 context + 1 earlier: 18 pairs.
    # Distinct: (p,c0), (S1,c0), (S2,c0), (p and c0,c1), (S1,c1), (S2,c1), (c0,c1) = 7.
    assert len(sent) == 7
    assert sorted(sent) == sorted(
        [
            "p\tc0",
            "p and c0\tc1",
            "c0\tc1",
            *[f"{s}\t{c}" for s in SHARED[:2] for c in ("c0", "c1")],
        ]
    )
    assert len(rows) == 4 and all(r[nli_scores.ERROR] is None for r in rows)


def _write_inputs(spark: SparkSession, settings: Settings, chains: list[Chain]) -> None:
    steps, contexts = frames(spark, chains, settings.scoring_hash())
    tables.insert_new(spark, steps, settings.table("steps"), S.SCHEMA, [S.CHAIN_ID, S.CONFIG_HASH, S.STEP_IDX])
    tables.insert_new(spark, contexts, settings.table("contexts"), S.CONTEXTS_SCHEMA, [S.CHAIN_ID, S.CONFIG_HASH])


def test_run_counts_pairs_sent_and_writes_step_scores(spark, make_settings, tmp_path):
    settings = make_settings()
    _write_inputs(spark, settings, TWINS + [ONE])
    counts = nli_scores.run(spark, settings, predict=logging_fake(tmp_path / "pairs.tsv"))
    assert counts["pairs"] == 18 + 2  # ONE: 1 intra + 1 context pair
    assert counts["pairs_distinct"] == counts["pairs_sent"] == 7 + 2
    assert counts["steps"] == counts["steps_scored"] == 5 and counts["steps_quarantined"] == 0
    assert counts["reconciled"] == 1 and counts["pairs_truncated"] == 0
    table = tables.read(spark, settings.table("step_scores"))
    assertSchemaEqual(table.schema, SS.SCHEMA)
    one = table.where(F.col(SS.CHAIN_ID) == "one").collect()[0]
    assert one[SS.INTRA_ENTAIL] == exact(1 / 12) and one[SS.INTER] == exact(3 / 13)
    assert one[SS.CONFIG_HASH] == settings.scoring_hash()
    assert one[SS.NLI_MODEL] == settings.models.nli.path and one[SS.NLI_REVISION].startswith("sha256:")
    assert one[SS.INTRA_PVI] is None  # other stages' columns untouched
    # Idempotent: a rerun rewrites the same rows.
    nli_scores.run(spark, settings, predict=_fake_factory)
    assert tables.read(spark, settings.table("step_scores")).count() == 5


POISONED = [
    ("clean", ["ctx"], [(["p"], "c0"), (["q"], "c1")]),
    ("bad", ["ctx"], [(["p"], "c0"), (["POISON rcu"], "c1"), (["r"], "c2")]),
]


def test_run_quarantines_a_step_whose_scoring_raises(spark, make_settings):
    settings = make_settings("runtime.on_row_error=quarantine")
    _write_inputs(spark, settings, POISONED)
    counts = nli_scores.run(spark, settings, run_id="r1", predict=_fake_factory)
    assert (counts["steps"], counts["steps_scored"], counts["steps_quarantined"]) == (5, 4, 1)
    assert counts["reconciled"] == 1
    q = tables.read(spark, settings.table("quarantine")).collect()
    assert [(r[Q.STAGE], r[Q.REASON], r[Q.CHAIN_ID], r[Q.RUN_ID]) for r in q] == [("nli", "scoring_error", "bad", "r1")]
    assert "poisoned premise" in q[0][Q.DETAIL] and '"step_idx":1' in q[0][Q.RAW]
    scored = tables.read(spark, settings.table("step_scores"))
    assert sorted((r[SS.CHAIN_ID], r[SS.STEP_IDX]) for r in scored.collect()) == [
        ("bad", 0), ("bad", 2), ("clean", 0), ("clean", 1)
    ]
    bad_2 = scored.where((F.col(SS.CHAIN_ID) == "bad") & (F.col(SS.STEP_IDX) == 2)).collect()[0]
    assert bad_2[SS.INTRA_PREMISE] == "r and c0 and c1"  # later steps see the conclusion, not the poisoned RCU


def test_run_fail_fast_raises_and_writes_nothing(spark, make_settings):
    settings = make_settings("runtime.on_row_error=fail")
    _write_inputs(spark, settings, POISONED)
    with pytest.raises(Exception, match="poisoned premise"):
        nli_scores.run(spark, settings, predict=_fake_factory)
    assert not tables.exists(spark, settings.table("step_scores"))


def test_run_missing_paper_model_names_it_and_writes_nothing(spark, make_settings):
    settings = make_settings("models.profile=paper")
    assert settings.models.nli.path == "MoritzLaurer/DeBERTa-v3-large-mnli-fever-anli-ling-wanli"
    with pytest.raises(ModelUnavailable) as err:
        nli_scores.run(spark, settings)
    message = str(err.value)
    assert "MoritzLaurer/DeBERTa-v3-large-mnli-fever-anli-ling-wanli" in message
    assert "--set models.nli.path=" in message
    assert not tables.exists(spark, settings.table("step_scores"))
    assert not tables.exists(spark, settings.table("quarantine"))


# -- the tiny model: invariance and the EB test set end to end ---------------------------------------------
def eb_chains(path: Path, limit: int | None = None) -> list[Chain]:
    """EB task_1 test trees as chains: premise RCUs = parents not yet mentioned, conclusion = the child."""
    from jobs.metaeval import entailment_bank as eb

    rows = eb.load_jsonl(path)[:limit]
    chains: list[Chain] = []
    for row, chain_id in zip(rows, eb.chain_ids(rows), strict=True):
        steps = eb.fresh_steps(eb.parse_proof(row["proof"]), eb.node_texts(row))
        sentences = [*(row["meta"]["triples"] or {}).values(), row["question"]]
        chains.append((chain_id, sentences, steps))
    return chains


# The trained model of the `small` profile (models/nli-small, `make models`: 42 min, so CI has none) runs the same
# checks by hand (make test-manual): a real 22M-parameter cross-encoder through the same UDF path (issue #16).
SMALL_NLI_PARAM = pytest.param(
    "small", id="small-trained",
    marks=[pytest.mark.manual, pytest.mark.skipif(not small_built(), reason="needs models/nli-small: make models")],
)


@pytest.mark.parametrize("model", ["spread", SMALL_NLI_PARAM])
def test_transform_nli_model_invariant_to_batch_size_and_partitions(spark, make_settings, request, model):
    path = request.getfixturevalue("spread_nli") if model == "spread" else PROJECT_ROOT / SMALL_NLI
    chains = eb_chains(EB_HEAD, 8)
    steps, contexts = frames(spark, chains, "h")
    before = spark.conf.get("spark.sql.shuffle.partitions")
    results = {}
    try:
        # One row a batch; an odd batch over three partitions; the whole input at once (the base).
        for batch, parts in [(1, 1), (7, 3), (64, 1)]:
            spark.conf.set("spark.sql.shuffle.partitions", str(parts))
            settings = make_settings(f"models.nli.path={path}", f"nli.batch_size={batch}", "nli.max_length=48")
            out = nli_scores.transform(steps.repartition(parts), contexts.repartition(parts), settings.nli,
                                       settings.models.nli, settings.runtime)
            results[(batch, parts)] = _sorted(out)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    base = results[(64, 1)]
    inter = [r[SS.INTER] for r in base]
    assert len(base) == sum(len(c[2]) for c in chains)
    assert all(r[nli_scores.ERROR] is None for r in base)
    assert max(inter) - min(inter) > 0.05  # scores differ between steps, so a mix-up would show
    for key, rows in results.items():
        for a, b in zip(rows, base, strict=True):
            assert (a[S.CHAIN_ID], a[S.STEP_IDX], a[SS.INTER_WORST_PREMISE]) == (
                b[S.CHAIN_ID], b[S.STEP_IDX], b[SS.INTER_WORST_PREMISE]
            ), key
            for col in (SS.INTRA_ENTAIL, SS.INTER, SS.INTER_MAX_CONTRADICTION):
                assert a[col] == prob_approx(b[col]), (key, col)  # float32 softmax probabilities


@pytest.mark.slow
@pytest.mark.dataset("entailment_bank")
def test_main_eb_test_chains_end_to_end_with_tiny_model(spark, make_settings, tiny_models):
    settings = make_settings("nli.max_length=64")
    chains = eb_chains(EB_TEST)
    assert len(chains) == 340
    _write_inputs(spark, settings, chains)
    overrides = [f"--set={k}" for k in ("nli.max_length=64",)]
    lake = settings.paths.lake
    argv = [
        f"--set=paths.lake={lake}",
        f"--set=mlflow.tracking_uri={settings.mlflow.tracking_uri}",
        f"--set=mlflow.artifact_location={settings.mlflow.artifact_location}",
        *overrides,
    ]
    counts = nli_scores.main(argv)
    n_steps = sum(len(c[2]) for c in chains)
    assert counts["steps"] == counts["steps_scored"] == n_steps and counts["steps_quarantined"] == 0
    assert counts["pairs_sent"] == counts["pairs_distinct"] < counts["pairs"]
    assert counts["pairs_truncated"] > 0  # some EB premises exceed 64 tokens: counted, and still scored
    table = tables.read(spark, settings.table("step_scores"))
    assert table.count() == n_steps
    stats = table.agg(
        F.min(SS.INTRA_ENTAIL), F.max(SS.INTRA_ENTAIL), F.min(SS.INTER), F.max(SS.INTER),
        F.count(F.when(F.col(SS.INTER_WORST_SOURCE).isNull(), 1)),
    ).first()
    assert 0.0 <= stats[0] <= stats[1] <= 1.0 and 0.0 <= stats[2] <= stats[3] <= 1.0
    assert stats[4] == 0  # every EB step has context sentences to check against
