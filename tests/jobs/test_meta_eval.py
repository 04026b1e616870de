from __future__ import annotations

import numpy as np
import pytest
from pyspark.sql import Row
from tolerance import exact

from jobs.infra import tables
from jobs.metaeval import meta_eval as ME
from jobs.metaeval import somers
from schemas import baseline_scores as B
from schemas import chain_scores as CS
from schemas import chains as C
from schemas import meta_eval as M

LONG = "dataset string, label string, metric string, chain_id string, label_value double, score double"


def _transform(spark, scores, chains, baseline, settings):
    return ME.transform(spark, scores, chains, baseline, settings.meta_eval, settings.scoring_hash(),
                        settings.log.progress_seconds)


def _long_rows(seed: int = 0) -> list[tuple]:
    rng = np.random.default_rng(seed)
    rows = [("toy", "HALL", "hand", f"c{i}", float(y), float(s))
            for i, (y, s) in enumerate(zip([1, 1, 1, 0, 0], [3, 2, 2, 2, 1], strict=True))]
    for g, n in (("a", 40), ("b", 75)):
        y = rng.integers(0, 2, n)
        s = rng.integers(0, 6, n) + y  # ties on purpose
        rows += [("toy", "NEG", g, f"{g}{i}", float(y[i]), float(s[i])) for i in range(n)]
    return rows


def test_spark_auc_matches_scipy(spark):
    rows = _long_rows()
    got = {r[M.METRIC]: r for r in ME.spark_auc(spark.createDataFrame(rows, LONG)).collect()}
    assert got["hand"][M.SOMERS_D] == exact(4 / 6)  # hand-computed in tests/jobs/test_somers.py
    assert (got["hand"][M.N], got["hand"][M.N_ERRORS]) == (5, 2)
    for metric in ("a", "b"):
        y = [r[4] for r in rows if r[2] == metric]
        s = [r[5] for r in rows if r[2] == metric]
        assert got[metric][M.SOMERS_D] == exact(somers.somers_d(y, s))  # a ratio of pair counts, both ways
        low, high = somers.bootstrap_ci(y, s, resamples=2000, seed=0)
        # DeLong and the bootstrap estimate the same sampling spread: the intervals roughly coincide (two
        # estimators agreeing statistically, not float rounding: rel 0.35 is no tests/tolerance.py scale).
        assert got[metric][M.CI_LOW] < got[metric][M.SOMERS_D] < got[metric][M.CI_HIGH]
        assert got[metric][M.CI_HIGH] - got[metric][M.CI_LOW] == pytest.approx(high - low, rel=0.35)


def _chain(cid: str, dataset: str, labels: dict) -> dict:
    return {C.CHAIN_ID: cid, C.DATASET: dataset, C.CONTEXT: "x", C.STEPS: ["s."], C.LABELS: labels,
            C.CONTENT_HASH: cid}


def _scores(cid: str, entail: float, api1: bool, config: str) -> dict:
    return {CS.CHAIN_ID: cid, CS.CONFIG_HASH: config, CS.N_STEPS: 1, CS.min_col("intra_entail"): entail,
            CS.api_col(1): api1}


def _frames(spark, config: str):
    chains = [
        _chain("e1", "eb_HALL", {"HALL": 1.0}), _chain("e2", "eb_HALL", {"HALL": 1.0}),
        _chain("e3", "eb_HALL", {"HALL": 0.0}), _chain("e4", "eb_HALL", {"HALL": 0.0}),
        _chain("g1", "gsm", {"QUAL": 5.0, "MATH": 1.0}), _chain("g2", "gsm", {"QUAL": 3.0, "MATH": 0.0}),
        _chain("g3", "gsm", {"QUAL": 1.0, "MATH": 1.0}), _chain("u1", "unlabelled", {}),
    ]
    scores = [
        _scores("e1", 0.9, True, config), _scores("e2", 0.4, True, config),
        _scores("e3", 0.4, False, config), _scores("e4", 0.1, True, config),
        _scores("g1", 0.8, True, config), _scores("g2", 0.5, False, config), _scores("g3", 0.6, True, config),
        _scores("e1", 0.0, False, "other"),  # another configuration: never mixed in
        _scores("u1", 0.5, True, config),
    ]
    baseline = [
        {B.CHAIN_ID: "e1", B.METRIC: "rouge2", B.SCORE: 0.2}, {B.CHAIN_ID: "e3", B.METRIC: "rouge2", B.SCORE: 0.3},
        {B.CHAIN_ID: "e2", B.METRIC: "rouge2", B.SCORE: float("nan")},  # dropped, not ranked
    ]
    as_df = lambda rows, schema: spark.createDataFrame(  # noqa: E731
        [Row(**{f.name: r.get(f.name) for f in schema.fields}) for r in rows], schema)
    return as_df(chains, C.SCHEMA), as_df(scores, CS.SCHEMA), as_df(baseline, B.SCHEMA)


def test_transform_hand_computed(spark, make_settings):
    settings = make_settings("meta_eval.config_hash=h1", "meta_eval.metrics=[intra_entail_min,api_1]",
                             "meta_eval.bootstrap_resamples=50")
    chains, scores, baseline = _frames(spark, "h1")
    got = {(r[M.DATASET], r[M.LABEL], r[M.METRIC]): r
           for r in _transform(spark, scores, chains, baseline, settings).collect()}
    assert set(got) == {
        ("eb_HALL", "HALL", "intra_entail_min"), ("eb_HALL", "HALL", "api_1"), ("eb_HALL", "HALL", "rouge2"),
        ("gsm", "QUAL", "intra_entail_min"), ("gsm", "QUAL", "api_1"),
        ("gsm", "MATH", "intra_entail_min"), ("gsm", "MATH", "api_1"),
    }
    # HALL: clean {0.9, 0.4} vs error {0.4, 0.1}: pairs +,+,tie,+ -> (3 - 0) / 4.
    hall = got[("eb_HALL", "HALL", "intra_entail_min")]
    assert (hall[M.SOMERS_D], hall[M.N], hall[M.N_ERRORS], hall[M.METHOD]) == (0.75, 4, 2, "scipy")
    assert hall[M.CONFIG_HASH] == "h1"
    # API_1 as 0/1: clean {1, 1} vs error {0, 1}: +, tie, +, tie -> 2 / 4.
    assert got[("eb_HALL", "HALL", "api_1")][M.SOMERS_D] == exact(0.5)
    # rouge2: e1 (clean) 0.2 < e3 (error) 0.3, e2's NaN dropped: D = -1 over n = 2.
    rouge = got[("eb_HALL", "HALL", "rouge2")]
    assert (rouge[M.SOMERS_D], rouge[M.N]) == (-1.0, 2)
    # QUAL ordinal 5/3/1 with scores 0.8/0.5/0.6: pairs (5,3)+ (5,1)+ (3,1)- -> 1/3; n_errors = below the top.
    qual = got[("gsm", "QUAL", "intra_entail_min")]
    assert qual[M.SOMERS_D] == exact(1 / 3) and qual[M.N_ERRORS] == 2
    assert got[("gsm", "MATH", "intra_entail_min")][M.SOMERS_D] == exact(1.0)


def test_transform_driver_and_spark_paths_agree(spark, make_settings):
    chains, scores, baseline = _frames(spark, "h1")
    common = ["meta_eval.config_hash=h1", "meta_eval.metrics=[intra_entail_min,api_1]",
              "meta_eval.bootstrap_resamples=20"]
    small = _transform(spark, scores, chains, baseline, make_settings(*common)).collect()
    big = _transform(spark, scores, chains, baseline, make_settings(*common, "meta_eval.spark_threshold=0"))
    big = {(r[M.DATASET], r[M.LABEL], r[M.METRIC]): r for r in big.collect()}
    for r in small:
        other = big[(r[M.DATASET], r[M.LABEL], r[M.METRIC])]
        assert other[M.SOMERS_D] == exact(r[M.SOMERS_D])  # the same ratio of pair counts
        # Ordinal labels never take the AUC path.
        assert other[M.METHOD] == ("scipy" if r[M.LABEL] == "QUAL" else "spark_auc")


def test_reports_render(spark, make_settings):
    chains, scores, baseline = _frames(spark, "h1")
    settings = make_settings("meta_eval.config_hash=h1", "meta_eval.bootstrap_resamples=20")
    rows = [r.asDict() for r in _transform(spark, scores, chains, baseline, settings).collect()]
    table = ME.markdown_table(rows)
    assert "### eb_HALL" in table and "| intra_entail_min | 0.75 [" in table
    assert "HALL (n=4, err=2)" in table
    png = ME.heatmap_png(rows)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_writes_table_and_mlflow_artifacts(spark, make_settings, tmp_path):
    from mlflow.tracking import MlflowClient

    settings = make_settings("meta_eval.config_hash=h1", "meta_eval.bootstrap_resamples=20")
    chains, scores, baseline = _frames(spark, "h1")
    tables.insert_new(spark, chains, settings.table("chains"), C.SCHEMA, [C.CHAIN_ID])
    tables.upsert(spark, scores, settings.table("chain_scores"), CS.SCHEMA, [CS.CHAIN_ID, CS.CONFIG_HASH])
    tables.upsert(spark, baseline, settings.table("baseline_scores"), B.SCHEMA, [B.CHAIN_ID, B.METRIC])
    argv = [f"--set=paths.lake={settings.paths.lake}", f"--set=mlflow.tracking_uri={settings.mlflow.tracking_uri}",
            f"--set=mlflow.artifact_location={settings.mlflow.artifact_location}", "--set=meta_eval.config_hash=h1",
            "--set=meta_eval.bootstrap_resamples=20", "--set=spark.master=local[2]",
            "--set=spark.shuffle_partitions=1"]
    argv = [a.replace("--set=", "--set ", 1).split(" ", 1) for a in argv]
    rows = ME.main([x for pair in argv for x in pair])
    rows_again = ME.main([x for pair in argv for x in pair])
    assert len(rows) == len(rows_again) == 7
    assert tables.read(spark, settings.table("meta_eval")).count() == 7  # upsert: a rerun replaces
    client = MlflowClient(settings.mlflow.tracking_uri)
    exp = client.get_experiment_by_name(settings.mlflow.experiment)
    run = client.search_runs([exp.experiment_id], "tags.job = 'meta_eval'")[0]
    names = {a.path for a in client.list_artifacts(run.info.run_id, "meta_eval")}
    assert names == {"meta_eval/correlations.md", "meta_eval/heatmap.png"}


def test_markdown_table_single_label_datasets_side_by_side():
    def row(dataset, label, metric, d, n=10, err=5):
        return {M.DATASET: dataset, M.LABEL: label, M.METRIC: metric, M.SOMERS_D: d, M.CI_LOW: d - 0.1,
                M.CI_HIGH: d + 0.1, M.N: n, M.N_ERRORS: err}

    rows = [row("eb_HALL", "HALL", "inter_min", 0.5), row("eb_NEG", "NEG", "inter_min", 0.25),
            row("eb_HALL", "HALL", "roscoe_ss_repetition_step", 0.1),
            row("eb_HALL", "HALL", "roscoe_sa_repetition_token", 0.3),
            row("gsm", "QUAL", "inter_min", -0.5, 20, 12), row("gsm", "MATH", "inter_min", 0.0, 20, 2)]
    table = ME.markdown_table(rows)
    assert "### single-label datasets" in table and "### gsm" in table
    assert "| inter_min | 0.50 [0.40, 0.60] | 0.25 [0.15, 0.35] |" in table
    # Best of the ROSCOE-REP family per column; a family without rows in a column leaves it empty.
    assert "| **ROSCOE-REP** (best) | 0.30 (repetition_token) |  |" in table
    assert "QUAL (n=20, err=12)" in table


def test_long_frame_leaves_out_the_earliest_error_index(spark):
    from schemas import step_labels as SL

    chains = spark.createDataFrame(
        [{C.CHAIN_ID: "c", C.DATASET: "pb", C.CONTENT_HASH: "h",
          C.LABELS: {SL.FIRST_ERROR_INDEX: 2.0, SL.FINAL_ANSWER_CORRECT: 0.0}}], C.SCHEMA)
    scores = spark.createDataFrame([("c", "inter_min", 0.5)], "chain_id string, metric string, score double")
    got = [tuple(r) for r in ME.long_frame(scores, chains).collect()]
    assert got == [("pb", SL.FINAL_ANSWER_CORRECT, "inter_min", "c", 0.0, 0.5)]
