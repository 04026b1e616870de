"""The localisation meta-evaluation: thresholds from the calibration subset only (pure), and one run of the job on
hand-written step_scores / chains / step_labels tables checked row by row against hand-computed figures."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import folder_settings, job_args
from tolerance import exact

from jobs.infra import tables
from jobs.metaeval import localise
from jobs.metaeval import localise_maths as L
from jobs.metaeval.settings import LocaliseSettings
from schemas import chains as C
from schemas import localisation as LO
from schemas import quarantine as Q
from schemas import step_labels as SL
from schemas import step_scores as SS

CAL, OTHER = "pb_cal", "pb_other"
# Calibration chains (tests/jobs/test_localise_maths.py: F1-best threshold 0.4, every chain right there).
CAL_CHAINS = {"A": ([0.9, 0.2, 0.8], 1), "B": ([0.7, 0.6], -1), "C": ([0.3, 0.9], 0), "D": ([0.8, 0.5, 0.4], -1)}
# At 0.4: E flagged at step 0 (label 1), F right, G right, H flagged at step 1 (all correct).
OTHER_CHAINS = {"E": ([0.35, 0.1], 1), "F": ([0.5, 0.45], -1), "G": ([0.2], 0), "H": ([0.6, 0.15], -1)}


def _items(other_scale: float = 1.0) -> list[localise.Item]:
    out = []
    for dataset, chains, scale in ((CAL, CAL_CHAINS, 1.0), (OTHER, OTHER_CHAINS, other_scale)):
        for cid, (scores, label) in chains.items():
            s = np.array(scores) * scale
            out.append(localise.Item(cid, dataset, label, len(s), {"m": s, "k": 1 - s}))
    return out


def test_threshold_and_combination_come_from_the_calibration_subset_only():
    cfg = LocaliseSettings(calibration=CAL, bootstrap_resamples=0)
    items = _items()
    localise.with_combination(items, ["m", "k"], CAL)
    base = localise.evaluate(items, ["m", "k", LO.COMBINED], cfg)
    changed = _items(other_scale=0.5)  # the other subset's scores all halved
    localise.with_combination(changed, ["m", "k"], CAL)
    again = localise.evaluate(changed, ["m", "k", LO.COMBINED], cfg)
    assert base.thresholds == again.thresholds and base.thresholds["m"] == 0.4
    assert [r for r in base.results if r[LO.DATASET] == CAL] == [r for r in again.results if r[LO.DATASET] == CAL]
    other = {r[LO.METRIC]: r for r in base.results if r[LO.DATASET] == OTHER}
    assert other["m"][LO.F1] == exact(1 / 2)  # E and H wrong at 0.4
    halved = {r[LO.METRIC]: r for r in again.results if r[LO.DATASET] == OTHER}
    assert halved["m"][LO.F1] == exact(0.0)  # halved, every step of F and H falls below 0.4
    with pytest.raises(ValueError, match="no scored, labelled chain of 'gsm'"):
        localise.evaluate(items, ["m"], LocaliseSettings(calibration="gsm"))


def test_checks_come_first_then_each_metric_at_its_own_threshold():
    """localise.check_first {a: 1.0}: a step scoring below 1 under `a` is flagged before m's prediction, even where
    m flags an earlier step (E); a chain `a` did not score (NaN) falls back to m."""
    items = _items()
    nan = math.nan
    checks = {"A": [nan, 0.5, nan], "C": [1.0, 0.0], "D": [1.0, 1.0, 1.0], "E": [nan, 0.0]}
    for it in items:
        if it.chain_id in checks:
            it.scores["a"] = np.array(checks[it.chain_id])
    cfg = LocaliseSettings(calibration=CAL, bootstrap_resamples=0, check_first={"a": 1.0})
    out = localise.evaluate(items, ["m", "k"], cfg)
    assert "a" not in out.thresholds  # the check's threshold is given, not chosen
    rows = {(r[LO.DATASET], r[LO.METRIC]): r for r in out.results}
    assert set(rows) == {(d, m) for d in (CAL, OTHER) for m in ("m", "k", LO.CHECKS, "checks_then_m", "checks_then_k")}
    predicted = {(p[LO.METRIC], p[LO.CHAIN_ID]): p[LO.PREDICTED] for p in out.predictions}
    # m alone at 0.4: A 1, B -1, C 0, D -1, E 0, F -1, G 0, H 1. The check flags A at 1, C at 1, E at 1.
    assert {c: predicted[("checks_then_m", c)] for c in "ABCDEFGH"} == {
        "A": 1, "B": -1, "C": 1, "D": -1, "E": 1, "F": -1, "G": 0, "H": 1}
    assert {c: predicted[(LO.CHECKS, c)] for c in "ABCDEFGH"} == {
        "A": 1, "B": -1, "C": 1, "D": -1, "E": 1, "F": -1, "G": -1, "H": -1}
    # Labels A 1, B -1, C 0, D -1 | E 1, F -1, G 0, H -1.
    figs = lambda key: tuple(rows[key][k] for k in (LO.ACC_ERROR, LO.ACC_CORRECT, LO.F1))  # noqa: E731
    assert figs((CAL, "checks_then_m")) == exact((0.5, 1.0, 2 / 3))  # C's check flag at step 1 is wrong
    assert figs((OTHER, "checks_then_m")) == exact((1.0, 0.5, 2 / 3))  # E now right; H still flagged by m
    assert figs((OTHER, LO.CHECKS)) == exact((0.5, 1.0, 2 / 3))  # G's error has no wrong check
    assert (rows[(OTHER, "checks_then_m")][LO.THRESHOLD], rows[(OTHER, LO.CHECKS)][LO.THRESHOLD]) == (0.4, 1.0)
    assert rows[(OTHER, LO.CHECKS)][LO.AUROC] is None and rows[(OTHER, LO.CHECKS)][LO.HIT_RATE] is None


def _row(schema, **values) -> dict:
    return {f.name: None for f in schema.fields} | values


@pytest.fixture(scope="module")
def localised(spark, tmp_path_factory):
    """One `python -m jobs.metaeval.localise` over hand-written tables, with a per-step baseline table."""
    folder = tmp_path_factory.mktemp("localise")
    pairs = [f"localise.calibration={CAL}", "localise.metrics=[intra_entail,inter]",
             "localise.combine=[intra_entail,inter]", "localise.bootstrap_resamples=50",
             "localise.step_baselines=step_baselines", "localise.check_first={arith_valid: 1.0}"]
    settings = folder_settings(folder, *pairs)
    h = settings.scoring_hash()
    chains, scores, labels, baseline = [], [], [], []
    every = {**CAL_CHAINS, **OTHER_CHAINS, "Q1": ([0.5, 0.5], 5), "Q2": ([0.5, 0.5], 0),
             "Q3": ([0.5, 0.5], 0.5), "Q4": ([0.5, 0.5], 1), "N1": ([0.5], -1)}
    for cid, (steps, label) in every.items():
        dataset = CAL if cid in CAL_CHAINS else OTHER
        # H is labelled by its step_labels rows alone.
        chain_labels = {} if cid == "H" else {SL.FIRST_ERROR_INDEX: float(label)}
        chains.append(_row(C.SCHEMA, **{C.CHAIN_ID: cid, C.DATASET: dataset, C.CONTENT_HASH: cid, C.LABELS: chain_labels,
                                        C.STEPS: [f"step {i}" for i in range(len(steps))]}))
        if cid != "N1":  # N1 is not scored under this config hash
            for i, s in enumerate(steps):
                # A wrong equation in C's step 1 and E's step 1 (arith_valid is read for the check only).
                arith = 0.0 if (cid, i) in {("C", 1), ("E", 1)} else None
                scores.append(_row(SS.SCHEMA, **{SS.CHAIN_ID: cid, SS.STEP_IDX: i, SS.CONFIG_HASH: h,
                                                 SS.INTRA_ENTAIL: s, SS.INTER: 0.5, SS.ARITH_VALID: arith}))
                baseline.append((cid, i, "roscoe_step", s))
    scores.append(_row(SS.SCHEMA, **{SS.CHAIN_ID: "E", SS.STEP_IDX: 0, SS.CONFIG_HASH: "other", SS.INTRA_ENTAIL: 0.0}))
    for cid, values in {"A": [1.0, 0.0], "B": [1.0, 1.0], "H": [1.0, 1.0], "Q2": [1.0, 0.0], "Q4": [0.0, 0.0]}.items():
        labels += [(cid, i, SL.FIRST_ERROR, v, None) for i, v in enumerate(values)]
    # Plain writes: the job reads tables, however they were made (a MERGE each would cost ~1 s more).
    for name, rows, schema in (("chains", chains, C.SCHEMA), ("step_scores", scores, SS.SCHEMA),
                               ("step_labels", labels, SL.SCHEMA), ("step_baselines", baseline, localise.LONG_SCHEMA)):
        spark.createDataFrame(rows, schema).write.format("delta").save(settings.table(name))
    out = localise.main(job_args(settings, *pairs))
    return settings, out


def test_job_rows_by_hand(spark, localised):
    settings, out = localised
    got = {(r[LO.DATASET], r[LO.METRIC]): r.asDict() for r in tables.read(spark, settings.table("localisation")).collect()}
    metrics = ("intra_entail", "inter", "roscoe_step", LO.COMBINED)
    assert set(got) == {(d, m) for d in (CAL, OTHER) for m in (*metrics, LO.CHECKS, *(f"checks_then_{m}" for m in metrics))}
    cal, other = got[(CAL, "intra_entail")], got[(OTHER, "intra_entail")]
    assert (cal[LO.THRESHOLD], other[LO.THRESHOLD], cal[LO.CALIBRATION]) == (0.4, 0.4, CAL)
    # Calibration: all four right; AUROC: the errors (0.2, 0.3) score below all six steps before or without one.
    assert [cal[k] for k in (LO.N, LO.N_ERROR, LO.N_CORRECT, LO.ACC_ERROR, LO.ACC_CORRECT, LO.F1, LO.AUROC,
                             LO.N_POSITIVE, LO.N_NEGATIVE, LO.HIT_RATE)] == [4, 2, 2, 1.0, 1.0, 1.0, 1.0, 2, 6, 1.0]
    assert cal[LO.RANDOM_HIT_RATE] == exact((1 / 3 + 1 / 2) / 2)
    # Other (E, F, G, H; Q1-Q4 quarantined, N1 not scored; E's score under another hash ignored): E and H wrong.
    # AUROC: 0.1 below all five negatives, 0.2 below four (H's 0.15 is lower): 9/10.
    assert [other[k] for k in (LO.N, LO.N_ERROR, LO.N_CORRECT, LO.ACC_ERROR, LO.ACC_CORRECT)] == [4, 2, 2, 0.5, 0.5]
    assert (other[LO.F1], other[LO.AUROC], other[LO.HIT_RATE], other[LO.RANDOM_HIT_RATE]) == exact(
        (0.5, 0.9, 1.0, 0.75))
    assert other[LO.AUROC_LOW] <= 0.9 <= other[LO.AUROC_HIGH]
    # A constant inter flags either every step or none: no threshold beats F1 0; the lowest (-inf) is kept.
    assert (got[(CAL, "inter")][LO.THRESHOLD], got[(CAL, "inter")][LO.F1]) == (-math.inf, 0.0)
    # The baseline table's scores are intra_entail's: the same figures under its own name.
    strip = lambda r: {k: v for k, v in r.items() if k not in (LO.METRIC, LO.COMPUTED_AT)}  # noqa: E731
    assert strip(got[(OTHER, "roscoe_step")]) == strip(other)
    assert out.combined_from == ["intra_entail", "inter"]
    # The checks first: C's wrong equation (step 1) replaces its right prediction 0, E's replaces the wrong 0.
    checked = lambda d: tuple(got[(d, "checks_then_intra_entail")][k] for k in (LO.ACC_ERROR, LO.ACC_CORRECT))  # noqa: E731
    assert (checked(CAL), checked(OTHER)) == ((0.5, 1.0), (1.0, 0.5))
    assert out.counts == {"read": 13, "evaluated": 8, "quarantined": 4, "not_scored": 1}


def test_job_predictions_recompute_the_official_figures(spark, localised):
    settings, _ = localised
    predictions = [r.asDict() for r in tables.read(spark, settings.table("localisation_predictions")).collect()]
    assert len(predictions) == 8 * 9  # four metrics, the checks alone, the checks then each metric
    mine = {r[LO.CHAIN_ID]: (r[LO.PREDICTED], r[LO.LABEL]) for r in predictions if r[LO.METRIC] == "intra_entail"}
    assert mine == {"A": (1, 1), "B": (-1, -1), "C": (0, 0), "D": (-1, -1), "E": (0, 1), "F": (-1, -1),
                    "G": (0, 0), "H": (1, -1)}
    for r in tables.read(spark, settings.table("localisation")).collect():
        group = [p for p in predictions if (p[LO.DATASET], p[LO.METRIC]) == (r[LO.DATASET], r[LO.METRIC])]
        fig = L.figures([p[LO.PREDICTED] for p in group], [p[LO.LABEL] for p in group])
        assert (fig.acc_error, fig.acc_correct, fig.f1) == (r[LO.ACC_ERROR], r[LO.ACC_CORRECT], r[LO.F1])
        assert {p[LO.THRESHOLD] for p in group} == {r[LO.THRESHOLD]}


def test_job_quarantines_unusable_labels(spark, localised):
    settings, _ = localised
    rows = tables.read(spark, settings.table("quarantine")).where(f"{Q.STAGE} = 'localise'")
    assert sorted((r[Q.CHAIN_ID], r[Q.REASON]) for r in rows.collect()) == [
        ("Q1", "first_error_outside_steps"), ("Q2", "first_error_disagrees"), ("Q3", "first_error_not_integer"),
        ("Q4", "several_first_errors")]
    detail = {r[Q.CHAIN_ID]: r[Q.DETAIL] for r in rows.collect()}
    assert detail["Q2"] == "first_error_index 0.0, from step_labels 1.0, 2 steps"


def test_markdown_table_prints_percent_and_marks_the_calibration_subset(localised):
    _, out = localised
    table = localise.markdown_table(out.evaluation.results)
    assert f"### {CAL} (calibration subset: in-sample)" in table and f"### {OTHER}\n" in table
    assert "| intra_entail | 0.4 | 50.0 | 50.0 | 50.0 | 0.900 [" in table
    assert replace(out.evaluation, results=[]).results == []
