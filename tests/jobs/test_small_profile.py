"""The `small` profile on the sample lake: the trained NLI model (make models) separates its known-bad chains from
its good ones. Manual: it needs models/nli-small, which CI does not build (about 80 min on 2 cores)."""

from __future__ import annotations

import json
import shutil

import pytest

from jobs.infra.config import PROJECT_ROOT, small_built
from jobs.receval import pipeline

SAMPLE = PROJECT_ROOT / "tests" / "data" / "sample_lake"

pytestmark = [
    pytest.mark.manual,
    pytest.mark.skipif(not small_built(), reason="needs the small profile's NLI model: make models"),
]


def test_sample_lake_bad_chains_score_below_good_ones_with_small(spark, tmp_path):
    from pyspark.sql import functions as F

    shutil.copy(SAMPLE / "gsm8k_sample.jsonl", tmp_path / "input.jsonl")
    summary = pipeline.main([
        f"--set=paths.lake={tmp_path / 'lake'}", f"--set=ingest.input={tmp_path / 'input.jsonl'}",
        f"--set=mlflow.tracking_uri=sqlite:///{tmp_path}/mlruns.db",
        f"--set=mlflow.artifact_location={tmp_path}/mlartifacts", "--set=spark.master=local[2]",
        "--set=spark.shuffle_partitions=2", "--set=models.profile=small", "--set=pipeline.progress=plain",
    ])
    # Known bad: the chains whose final answer is wrong (the sample's verifier_correct label, ROSCOE GSM-8K).
    good = {json.loads(line)["chain_id"]: json.loads(line)["labels"]["verifier_correct"] == 1.0
            for line in (SAMPLE / "gsm8k_sample.jsonl").read_text().splitlines()}
    rows = (spark.read.format("delta").load(str(tmp_path / "lake" / "chain_scores"))
            .where(F.col("config_hash") == summary.config_hash)
            .select("chain_id", "intra_entail_min", "inter_min").collect())
    assert len(rows) == 24
    for metric in ("intra_entail_min", "inter_min"):
        scores = {r["chain_id"]: r[metric] for r in rows}
        ok = [s for c, s in scores.items() if good[c]]
        bad = [s for c, s in scores.items() if not good[c]]
        # Random models give every chain ~0.3306 (issue #16); the trained one spreads them and ranks bad lower.
        assert max(scores.values()) - min(scores.values()) > 0.1, metric
        assert sum(bad) / len(bad) < sum(ok) / len(ok), (metric, sorted(ok), sorted(bad))
