from __future__ import annotations

import pytest
from conftest import job_args

from jobs.infra import tables
from jobs.metaeval import eb_challenge
from schemas import meta_eval as M


@pytest.mark.slow
@pytest.mark.dataset("entailment_bank")
def test_main_end_to_end_small(spark, make_settings, tiny_models, tmp_path):
    settings = make_settings()
    argv = job_args(settings, "perturb.max_rows=6", "human_labels.max_rows=12", "meta_eval.bootstrap_resamples=50",
                    "perturb.paraphrase_max_new_tokens=8", "pipeline.progress=plain")
    report = eb_challenge.main([*argv, "--out", str(tmp_path / "out")])
    assert {k: v for k, v in report["perturb"].items() if k in ("trees", "rows")} == {"trees": 6, "rows": 42}
    assert all(report["perturb"][t] == 3 for t in ("HALL", "NEG", "SWAP", "REP", "PAR", "RED", "REMOVE"))
    rows = tables.read(spark, settings.table("meta_eval")).collect()
    datasets = {r[M.DATASET] for r in rows}
    assert {f"eb_challenge_{t}" for t in ("HALL", "NEG", "SWAP", "REP", "PAR", "RED", "REMOVE")} <= datasets
    assert "gsm8k_roscoe" in datasets
    metrics = {r[M.METRIC] for r in rows}
    assert {"intra_entail_min", "inter_min", "roscoe_sa_faithfulness_step", "roscoe_li_source_consistency",
            "rouge2"} <= metrics
    assert (tmp_path / "out" / "heatmap.png").read_bytes()[:4] == b"\x89PNG"
    table = (tmp_path / "out" / "correlations.md").read_text()
    assert "### single-label datasets" in table and "eb_challenge_HALL:HALL (n=6, err=3)" in table
