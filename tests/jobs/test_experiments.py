"""jobs.metaeval.experiments: the API_k table (shares with Wilson intervals, gold once per tree) and the ablation
runner (perturb once, each variant scored under its own config hash, one table per metric)."""

from __future__ import annotations

import math

import pytest
from conftest import job_args

from jobs.infra import tables
from jobs.metaeval import experiments as E
from schemas import meta_eval as M


def row(chain_id: str, clean: int | None, a1: bool | None, a2: bool | None, a3: bool | None) -> dict:
    dataset = chain_id.split(":")[0]
    return {"chain_id": chain_id, "dataset": dataset, "clean": clean, "api_1": a1, "api_2": a2, "api_3": a3}


def test_api_k_rows_gold_once_per_tree_perturbed_per_type_nulls_left_out():
    rows = [
        # tree t1 clean under HALL and under RED: one gold chain
        row("eb_challenge_HALL:t1", 1, True, True, False),
        row("eb_challenge_RED:t1", 1, True, True, False),
        row("eb_challenge_RED:t2", 1, False, True, True),
        row("eb_challenge_REP:t3", 1, None, None, None),  # no information gain: in no share
        row("eb_challenge_RED:t4", 0, False, False, False),
        row("eb_challenge_RED:t5", 0, True, False, None),
        row("eb_challenge_REP:t6", 0, True, True, True),
        row("eb_challenge_HALL:t7", 0, False, False, False),  # a type not asked for
        row("other:t8", 0, True, True, True),
    ]
    out = E.api_k_rows(rows, [1, 2, 3], ["REP", "PAR", "RED"], "eb_challenge")
    got = {r["group"]: {k: (r[f"api_{k}"]["hits"], r[f"api_{k}"]["n"]) for k in (1, 2, 3)} for r in out}
    assert [r["group"] for r in out] == ["gold", "REP", "PAR", "RED"]
    assert got == {
        "gold": {1: (1, 2), 2: (2, 2), 3: (1, 2)},  # t1, t2 (t3 has no values)
        "REP": {1: (1, 1), 2: (1, 1), 3: (1, 1)},
        "PAR": {1: (0, 0), 2: (0, 0), 3: (0, 0)},
        "RED": {1: (1, 2), 2: (0, 2), 3: (0, 1)},
    }
    assert out[2]["api_1"]["share"] is None
    table = E.api_k_markdown(out, [1, 2, 3])
    assert "| gold (clean, one per tree) | 0.50 [" in table and "| PAR (perturbed) | - | - | - |" in table


def test_share_is_the_wilson_interval():
    # By hand: p = 3/10, z = 1.959964: centre (p + z^2/2n) / (1 + z^2/n), half-width
    # z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n).
    z, n, p = 1.959963984540054, 10, 0.3
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    s = E.share(3, 10)
    assert s["share"] == pytest.approx(0.3, abs=1e-12)
    assert (s["low"], s["high"]) == (pytest.approx(centre - half, abs=1e-9), pytest.approx(centre + half, abs=1e-9))
    assert E.share(0, 0) == {"share": None, "low": None, "high": None, "n": 0, "hits": 0}


def test_api_k_frame_labels_from_the_type_and_one_config_hash(spark):
    chains = spark.createDataFrame(
        [("eb_challenge_RED:t1", "eb_challenge_RED", {"RED": 0.0}),
         ("eb_challenge_HALL:t1", "eb_challenge_HALL", {"HALL": 1.0}),
         ("gsm:x", "gsm", {"QUAL": 1.0})],
        "chain_id string, dataset string, labels map<string,double>")
    scores = spark.createDataFrame(
        [("eb_challenge_RED:t1", "h", True, False), ("eb_challenge_RED:t1", "other", False, False),
         ("eb_challenge_HALL:t1", "h", None, True), ("gsm:x", "h", True, True)],
        "chain_id string, config_hash string, api_1 boolean, api_2 boolean")
    frame = E.api_k_frame(scores, chains, "h", [1, 2], "eb_challenge")
    got = sorted((r.asDict() for r in frame.collect()), key=lambda d: d["chain_id"])
    assert got == sorted([
        {"chain_id": "eb_challenge_RED:t1", "dataset": "eb_challenge_RED", "clean": 0.0, "api_1": True,
         "api_2": False},
        {"chain_id": "eb_challenge_HALL:t1", "dataset": "eb_challenge_HALL", "clean": 1.0, "api_1": None,
         "api_2": True},
    ], key=lambda d: d["chain_id"])


def meta_row(dataset: str, label: str, metric: str, d: float, config_hash: str) -> dict:
    return {M.DATASET: dataset, M.LABEL: label, M.METRIC: metric, M.SOMERS_D: d, M.CI_LOW: d - 0.1,
            M.CI_HIGH: d + 0.1, M.N: 10, M.N_ERRORS: 5, M.METHOD: "scipy", M.CONFIG_HASH: config_hash,
            M.RUN_ID: None, M.COMPUTED_AT: None}


def test_run_ablation_perturbs_once_and_reads_each_variants_own_rows(spark, make_settings, monkeypatch):
    """The runner's plumbing with eb_challenge.run (and the meta_eval table) replaced: stages, the variant's
    overrides on top of the job's, and the table built from the meta_eval rows of each variant's config hash only
    (the end-to-end test below reads the real table)."""
    base = make_settings()
    argv = [f"paths.lake={base.paths.lake}", "mlflow.enabled=false", "perturb.types=[HALL,RED]",
            "meta_eval.metrics=[intra_entail_min]"]
    calls, written = [], []

    def fake_run(spark, settings, tracked, stages):
        calls.append((tuple(stages), settings.steps.boundary, settings.scoring_hash()))
        if "meta_eval" in stages:  # D depends on the variant, so a mix-up of config hashes shows
            d = 0.5 if settings.steps.boundary == "whole" else 0.9
            written.extend(meta_row(f"eb_challenge_{t}", t, "intra_entail_min", d, settings.scoring_hash())
                           for t in ("HALL", "RED"))
        return {"table": ""}

    def fake_read(spark, path, schema):  # the meta_eval table as the fake runs left it (every variant's rows)
        assert path == base.table("meta_eval") and schema == M.SCHEMA
        return spark.createDataFrame(written, M.SCHEMA)

    monkeypatch.setattr(E.eb_challenge, "run", fake_run)
    monkeypatch.setattr(E.tables, "read", fake_read)
    from jobs.infra.tracking import job_run

    first = E.variant_settings(argv, [])
    with job_run(first, "experiments_boundary") as tracked:
        results, table = E.run_ablation(spark, "boundary", argv, None, tracked)
    assert [c[:2] for c in calls] == [(("perturb",), "sentence"), (("score", "meta_eval"), "sentence"),
                                      (("score", "meta_eval"), "whole")]
    assert calls[1][2] != calls[2][2]  # each variant has its own config hash
    assert list(results) == list(E.ABLATIONS["boundary"])
    assert {r[M.SOMERS_D] for r in results["whole chain as one step"]} == {0.5}
    assert table.splitlines()[:5] == [
        "#### intra_entail_min", "", "| variant | HALL | RED |", "|---|---|---|",
        "| one step per proof step (default) | 0.90 [0.80, 1.00] (10) | 0.90 [0.80, 1.00] (10) |",
    ]
    assert "| whole chain as one step | 0.50 [0.40, 0.60] (10) | 0.50 [0.40, 0.60] (10) |" in table


def test_ablation_variants_are_valid_overrides_and_start_with_the_defaults():
    from jobs.infra.config_layers import load_settings

    defaults = load_settings(environ={})
    for name, variants in E.ABLATIONS.items():
        hashes = [load_settings(overrides=o, environ={}).scoring_hash() for o in variants.values()]
        assert hashes[0] == defaults.scoring_hash(), name
        assert len(set(hashes)) == len(hashes), name  # every variant scores differently


# Manual: 84-123 s of CI's slow set. In CI: the ablation perturbs once and reads each variant's own rows
# (test_run_ablation_perturbs_once_and_reads_each_variants_own_rows, with the scoring stubbed), its variants are
# valid overrides, and the EB challenge end to end with the tiny models (test_eb_challenge.py).
@pytest.mark.manual
@pytest.mark.dataset("entailment_bank")
def test_boundary_ablation_end_to_end_tiny(spark, make_settings, tiny_models, tmp_path):
    """One command: 4 trees per type perturbed once, scored under both boundary variants with the tiny models;
    the `whole` variant's chains are one step each, the default's are the proof steps."""
    from pyspark.sql import functions as F

    from schemas import steps as S

    settings = make_settings()
    sets = job_args(settings, "perturb.max_rows=4", "perturb.types=[HALL,NEG]", "meta_eval.bootstrap_resamples=20",
                    "meta_eval.metrics=[intra_entail_min,inter_min]", "pipeline.progress=plain")
    table = E.main(["boundary", "--out", str(tmp_path / "out"), *sets])
    assert (tmp_path / "out" / "boundary.md").read_text() == table
    lines = table.splitlines()
    for metric in ("intra_entail_min", "inter_min"):
        at = lines.index(f"#### {metric}")
        assert lines[at + 2] == "| variant | HALL | NEG |"
        body = lines[at + 4 : at + 6]
        assert [b.split(" | ")[0] for b in body] == ["| " + v for v in E.ABLATIONS["boundary"]]
        assert all(b.count("(4)") == 2 for b in body), body  # every cell: D over the type's 4 chains
    hashes = {v: E.variant_settings(sets[1::2], o).scoring_hash() for v, o in E.ABLATIONS["boundary"].items()}
    steps = tables.read(spark, settings.table("steps"))
    per_chain = {v: [r["n"] for r in steps.where(F.col(S.CONFIG_HASH) == h).groupBy(S.CHAIN_ID)
                     .agg(F.count(F.lit(1)).alias("n")).collect()] for v, h in hashes.items()}
    assert len(per_chain["whole chain as one step"]) == 8 and set(per_chain["whole chain as one step"]) == {1}
    assert len(per_chain["one step per proof step (default)"]) == 8
    assert min(per_chain["one step per proof step (default)"]) >= 2  # trees kept have >= 2 proof steps
