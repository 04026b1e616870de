"""The `small` profile on the sample lake: the trained NLI model (make models) gives chains different correctness
scores, where the random models give every chain ~0.3306. Manual: it needs models/nli-small, which CI does not
build (42 min on a fresh 2-core clone); one pipeline run (~20 min on a busy 2-core machine) is shared by the tests."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import SAMPLE_LAKE, sqlite_store

from jobs.receval import night_summary, pipeline
from udfs.model_paths import small_built

pytestmark = [
    pytest.mark.manual,
    pytest.mark.skipif(not small_built(), reason="needs the small profile's NLI model: make models"),
]


METRICS = ("intra_entail_min", "inter_min", "intra_pvi_min", "info_gain_min")


@pytest.fixture(scope="module")
def scored(spark, tmp_path_factory) -> tuple[dict[str, bool], list, night_summary.Summary]:
    """(GSM-8K chain id -> right final answer, chain_scores rows, the run's summary) of the whole sample lake
    (GSM-8K and EntailmentBank parts) scored with the small profile, as `make run` scores it."""
    from pyspark.sql import functions as F

    tmp = tmp_path_factory.mktemp("small")
    shutil.copytree(SAMPLE_LAKE, tmp / "input")
    summary = pipeline.main([
        f"--set=paths.lake={tmp / 'lake'}", f"--set=ingest.input={tmp / 'input'}",
        f"--set=mlflow.tracking_uri={sqlite_store(tmp / 'mlruns.db')}", f"--set=mlflow.artifact_location={tmp}/mlartifacts",
        "--set=spark.master=local[2]", "--set=spark.shuffle_partitions=2", "--set=models.profile=small",
        "--set=pipeline.progress=plain",
    ])
    # Known bad: the chains whose final answer is wrong (the sample's verifier_correct label, ROSCOE GSM-8K).
    good = {json.loads(line)["chain_id"]: json.loads(line)["labels"]["verifier_correct"] == 1.0
            for line in (SAMPLE_LAKE / "gsm8k_sample.jsonl").read_text().splitlines()}
    rows = (spark.read.format("delta").load(str(tmp / "lake" / "chain_scores"))
            .where(F.col("config_hash") == summary.config_hash)
            .select("chain_id", *METRICS).collect())
    assert len(rows) == 48  # 24 GSM-8K chains, 8 EntailmentBank trees x (gold, NEG, HALL)
    return good, rows, summary


def test_small_profile_scores_differ_between_chains(scored):
    _, rows, _ = scored
    scores = [r["intra_entail_min"] for r in rows]
    # Random models: 0.33058-0.33060 for every chain (issue #16). Measured with the small model: 0.05-0.32.
    assert max(scores) - min(scores) > 0.1


def test_sample_lake_known_bad_chains_score_below_gold_ones_with_small(scored):
    """The EntailmentBank part: each tree's gold chain (labels NEG = HALL = 1) and its copies with one known error
    (NEG = 0: a conclusion negated; HALL = 0: a conclusion replaced by a distractor). As the run's summary prints
    them (scores by label), the chains with the error score lower on the correctness metric that is made to catch
    it: intra-step entailment for both, inter-step contradiction for the negation (a negated conclusion
    contradicts what came before; a distractor is mostly unrelated, not contradicting: EB-challenge HALL inter_min
    D ~0.06, docs/META_EVAL.md)."""
    _, _, summary = scored
    by = {(r["dataset"], r["label"], r["value"]): r for r in summary.label_scores}
    for kind, metrics in (("NEG", ("intra_entail_min", "inter_min")), ("HALL", ("intra_entail_min",))):
        gold, bad = by[("entailment_bank", kind, 1.0)], by[("entailment_bank", kind, 0.0)]
        assert gold["chains"] == bad["chains"] == 8
        for metric in metrics:
            assert bad[metric] < gold[metric], (kind, metric, bad[metric], gold[metric])


# Measured on 2026-12-01 (docs/META_EVAL.md "The small NLI model"): the 12 wrong-answer chains average 0.201
# intra_entail_min, the 12 right ones 0.174. Their errors are arithmetic slips inside fluent steps, which an NLI
# model trained on SICK and ANLI does not check; strict, so a model that does rank them lower is noticed.
# Since issue 30's every-source NLI model intra_entail_min does (0.069 vs 0.137 on 2026-12-04); inter_min still
# does not (0.466 vs 0.402), so both together still fail. Fresh clone, make models' own models, 2026-12-05:
# intra_entail_min 0.090 vs 0.149, inter_min 0.538 vs 0.395.
@pytest.mark.xfail(strict=True, reason="inter_min does not rank GSM-8K wrong-answer chains lower")
def test_sample_lake_gsm8k_wrong_answers_score_below_right_ones_with_small(scored):
    good, rows, _ = scored
    rows = [r for r in rows if r["chain_id"] in good]
    for metric in ("intra_entail_min", "inter_min"):
        ok = [r[metric] for r in rows if good[r["chain_id"]]]
        bad = [r[metric] for r in rows if not good[r["chain_id"]]]
        assert sum(bad) / len(bad) < sum(ok) / len(ok), (metric, sorted(ok), sorted(bad))


def test_sample_lake_gsm8k_wrong_answers_score_below_right_ones_on_some_metric(scored):
    """Issue 30's acceptance: with the small profile (every-source NLI model, g and g', Gemma 3 270M information
    gain) GSM-8K's wrong-answer chains score below the right ones on at least one metric, on average."""
    good, rows, _ = scored
    rows = [r for r in rows if r["chain_id"] in good]
    lower = {}
    for metric in METRICS:
        ok = [r[metric] for r in rows if good[r["chain_id"]] and r[metric] is not None]
        bad = [r[metric] for r in rows if not good[r["chain_id"]] and r[metric] is not None]
        lower[metric] = (round(sum(bad) / len(bad), 3), round(sum(ok) / len(ok), 3))
    print("GSM-8K mean (wrong, right):", lower)
    assert any(b < o for b, o in lower.values()), lower
