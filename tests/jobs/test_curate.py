"""Curation rules on a hand-built chain_scores table: exact split, listed reasons, pass rates, label agreement."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import delta_readers
import pytest
from conftest import folder_settings
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual
from tolerance import exact

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.receval import curate
from schemas import chain_scores as CS
from schemas import chains as C
from schemas import curation as CU
from schemas import step_scores as SS

RULES = [
    "curation.thresholds={intra_entail: 0.5}",
    "curation.quantiles={inter: 0.5}",
    "curation.require_api_k=2",
    "curation.max_steps=10",
]
# Night one's rules (and those of the tests going on from its lake): RULES plus step thresholds, a label beside
# the rules (the split, counts and pass rates are RULES' own).
NIGHT = [*RULES, "curation.step_thresholds={intra_entail: 0.3, inter: 0.5}"]
T, Q, A, M = "threshold:intra_entail_min>=0.5", "quantile:inter_min>=q0.5", "api_k:api_2", "max_steps:n_steps<=10"
# chain -> (intra_entail_min, inter_min, api_2, n_steps). inter_min's median over the five is 0.7.
SCORES = {
    "c1": (0.9, 0.8, True, 3),
    "c2": (0.2, 0.7, True, 3),
    "c3": (0.9, 0.1, False, 3),
    "c4": (0.6, 0.6, True, 12),
    "c5": (None, 0.9, None, 2),
}
EXPECTED_FAILED = {"c1": [], "c2": [T], "c3": [Q, A], "c4": [Q, M], "c5": [T, A]}
# chain -> its steps' (intra_entail, inter); c5 has none. Step thresholds intra_entail 0.3, inter 0.5.
STEPS = {
    "c1": [(0.9, 0.8), (0.8, 0.4), (0.1, 0.9)],  # inter flags step 1 before intra_entail flags step 2
    "c2": [(0.2, 0.3)],  # both below at step 0: the first in name order, inter
    "c3": [(0.9, 0.9), (None, 0.6)],  # a null score flags nothing: none flagged (-1)
    "c4": [(0.5, 0.9), (0.25, 0.7)],
}
EXPECTED_FLAGS = {"c1": (1, "inter"), "c2": (0, "inter"), "c3": (-1, None), "c4": (1, "intra_entail"),
                  "c5": (None, None)}


def _scores(spark, config_hash: str, scores=SCORES):
    rows = []
    for cid, (ie, inter, api2, n) in scores.items():
        row = {f.name: None for f in CS.SCHEMA.fields}
        row.update({CS.CHAIN_ID: cid, CS.CONFIG_HASH: config_hash, CS.N_STEPS: n, CS.min_col("intra_entail"): ie,
                    CS.min_col("inter"): inter, CS.api_col(2): api2, CS.min_col("intra_pvi"): 0.1 * n,
                    CS.min_col("info_gain"): -0.5 + 0.1 * n})
        rows.append(row)
    return spark.createDataFrame(rows, CS.SCHEMA)


def _chains(spark):
    labels = {"c1": {"clean": 1.0, "QUAL": 3.0}, "c2": {"clean": 1.0}, "c3": {"clean": 0.0}, "c4": {"clean": 0.0},
              "c5": {"clean": 1.0, "QUAL": 5.0}}
    rows = [{**{f.name: None for f in C.SCHEMA.fields}, C.CHAIN_ID: cid, C.CONTENT_HASH: cid, C.LABELS: lab}
            for cid, lab in labels.items()]
    return spark.createDataFrame(rows, C.SCHEMA)


def test_rules_fixed_order_and_ids(make_settings):
    cfg = make_settings(*RULES).curation
    got = curate.rules(cfg, {"inter": 0.7})
    assert [r.id for r in got] == [T, Q, A, M]
    assert [r.bound for r in got] == [0.5, 0.7, None, 10.0]


def test_rules_unknown_metric_is_a_clear_error(make_settings):
    cfg = make_settings("curation.thresholds={intra_entailment: 0.5}").curation
    with pytest.raises(ValueError, match="intra_entailment"):
        curate.rules(cfg)


def test_quantile_bounds_exact_over_reference(spark, make_settings):
    cfg = make_settings(*RULES).curation
    assert curate.quantile_bounds(_scores(spark, "h"), cfg) == {"inter": exact(0.7)}  # a hand-built score


def test_transform_hand_built_scores_exact_split_with_reasons(spark, make_settings):
    cfg = make_settings(*RULES).curation
    curated, rejected = curate.transform(_scores(spark, "h"), cfg, {"inter": 0.7}, run_id="r1")
    assertDataFrameEqual(curated.select(CU.CHAIN_ID), spark.createDataFrame([("c1",)], "chain_id string"))
    expected = [(cid, reasons) for cid, reasons in EXPECTED_FAILED.items() if reasons]
    assertDataFrameEqual(
        rejected.select(CU.CHAIN_ID, CU.FAILED_RULES),
        spark.createDataFrame(expected, "chain_id string, failed_rules array<string>"),
    )
    assertSchemaEqual(rejected.schema, CU.REJECTED_SCHEMA)
    assertSchemaEqual(curated.schema, CU.CURATED_SCHEMA)
    assert {r[CU.RULES_HASH] for r in rejected.collect()} == {cfg.rules_hash()}


def test_transform_no_rules_passes_everything(spark, make_settings):
    curated, rejected = curate.transform(_scores(spark, "h"), make_settings().curation)
    assert curated.count() == 5 and rejected.count() == 0


def test_histogram_equal_width_counts(spark):
    df = spark.createDataFrame([(0.0,), (0.1,), (0.5,), (1.0,), (None,)], "v double")
    assert curate.histograms(df, ["v"], 2) == {"v": ([0.0, 0.5, 1.0], [2, 2])}


def test_histograms_of_several_columns_in_two_jobs(spark):
    df = spark.createDataFrame(
        [(0.0, 2.0, None), (0.1, 2.0, None), (0.5, 2.0, None), (1.0, 2.0, None), (None, 2.0, None)],
        "a double, b double, c double")
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    got = curate.histograms(df, ["a", "b", "c"], 2)
    # a: width 0.5, 1.0 falls in the last bin; b: one value, width 1 from it; c: no value at all.
    assert got == {"a": ([0.0, 0.5, 1.0], [2, 2]), "b": ([2.0, 3.0, 4.0], [5, 0]), "c": ([], [])}
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) - jobs_before == 2


def _setup(spark, settings, scores=SCORES):
    tables.insert_new(spark, _scores(spark, settings.scoring_hash(), scores), settings.table("chain_scores"),
                      CS.SCHEMA, [CS.CHAIN_ID, CS.CONFIG_HASH])
    tables.insert_new(spark, _chains(spark), settings.table("chains"), C.SCHEMA, [C.CHAIN_ID])


def _split(spark, settings):
    curated = tables.read(spark, settings.table("curated")).select(CU.CHAIN_ID)
    rejected = tables.read(spark, settings.table("rejected")).select(CU.CHAIN_ID, CU.FAILED_RULES)
    return curated, rejected


def _expected(spark):
    return (
        spark.createDataFrame([("c1",)], "chain_id string"),
        spark.createDataFrame([(c, r) for c, r in EXPECTED_FAILED.items() if r], "chain_id string, failed_rules array<string>"),
    )


@dataclass(frozen=True)
class NightOne:
    settings: Settings
    result: curate.CurationResult

    @property
    def lake(self) -> Path:
        return Path(self.settings.paths.lake)


@pytest.fixture(scope="module")
def scored(spark, tmp_path_factory) -> Path:
    """A lake holding the hand-built chain_scores and chains only (`_setup`; curation settings do not enter the
    scoring hash): the curate runs below start from copies of it."""
    folder = tmp_path_factory.mktemp("scored")
    settings = folder_settings(folder)
    _setup(spark, settings)
    steps = [{**{f.name: None for f in SS.SCHEMA.fields}, SS.CHAIN_ID: cid, SS.STEP_IDX: i,
              SS.CONFIG_HASH: settings.scoring_hash(), SS.INTRA_ENTAIL: ie, SS.INTER: inter}
             for cid, rows in STEPS.items() for i, (ie, inter) in enumerate(rows)]
    steps.append({**steps[0], SS.CONFIG_HASH: "other", SS.INTER: 0.0})  # another configuration's: never read
    spark.createDataFrame(steps, SS.SCHEMA).write.format("delta").save(settings.table("step_scores"))
    return folder / "lake"


@pytest.fixture(scope="module")
def night_one(spark, scored, tmp_path_factory) -> NightOne:
    """One curate run (NIGHT) over the hand-built scores; tests read it, or copy its lake and go on from it."""
    folder = tmp_path_factory.mktemp("curate")
    shutil.copytree(scored, folder / "lake")
    settings = folder_settings(folder, *NIGHT)
    return NightOne(settings, curate.run(spark, settings, run_id="run-1"))


def _copy_of(source: Path, lake: Path, make_settings, *overrides: str):
    """Settings over an independent copy of a module fixture's lake (a Delta table is its folder)."""
    shutil.copytree(source, lake)
    return make_settings(*overrides)


def test_run_tables_counts_pass_rates_and_labels(spark, night_one):
    result = night_one.result
    curated, rejected = _split(spark, night_one.settings)
    exp_curated, exp_rejected = _expected(spark)
    assertDataFrameEqual(curated, exp_curated)
    assertDataFrameEqual(rejected, exp_rejected)
    assert result.counts == {"batch": 5, "decided": 5, "curated": 1, "rejected": 4, "run_passed": 1,
                             "run_failed": 4, "reconciled": 1}
    # Rates are counts over 5 chains and bounds hand-built scores: exact in float64.
    assert result.pass_rates == exact({"all": 0.2, T: 0.6, Q: 0.6, A: 0.6, M: 0.8})
    # clean is binary: passed = {c1}; clean = {c1, c2, c5}. QUAL is ordinal: no precision/recall.
    assert result.labels == {"clean": {"precision": 1.0, "recall": exact(1 / 3), "n": 5.0}}
    assert [r["id"] for r in result.rules] == [T, Q, A, M] and result.rules[1]["bound"] == exact(0.7)
    assert set(result.histograms) == {"intra_entail", "intra_pvi", "inter", "info_gain", "arith_valid"}
    assert all(png.startswith(b"\x89PNG") for png in result.histograms.values())


def test_run_first_flagged_step_in_every_table(spark, night_one):
    for name in ("curation", "curated", "rejected"):
        rows = tables.read(spark, night_one.settings.table(name)).collect()
        assert {r[CU.CHAIN_ID]: (r[CU.FIRST_FLAGGED_STEP], r[CU.FIRST_FLAGGED_METRIC]) for r in rows} == {
            c: f for c, f in EXPECTED_FLAGS.items() if name == "curation" or (c == "c1") == (name == "curated")}


def test_step_thresholds_unset_keep_the_rules_hash_and_unknown_metrics_fail(make_settings):
    # The hashes of the rules before step thresholds existed (main at 02221db): chains decided then stay decided.
    assert make_settings().curation.rules_hash() == "7569bb4a30709919"
    assert make_settings(*RULES[:1], *RULES[3:4]).curation.rules_hash() == "b1d0fcff78416a2c"
    assert make_settings(*RULES[:1], *RULES[3:4], NIGHT[-1]).curation.rules_hash() != "b1d0fcff78416a2c"
    # reject_arith_errors (issue 45) left off keeps them too; on, it is a new rule set.
    assert make_settings("curation.reject_arith_errors=false").curation.rules_hash() == "7569bb4a30709919"
    assert make_settings("curation.reject_arith_errors=true").curation.rules_hash() != "7569bb4a30709919"
    with pytest.raises(ValueError, match=r"\['intra'\] are not higher-is-better step_scores metrics"):
        curate.step_flags(None, {"intra": 0.5})
    with pytest.raises(ValueError, match=r"\['arith_errors'\] are not higher-is-better"):  # a count: no threshold
        curate.step_flags(None, {"arith_errors": 0.5})


def test_reject_arith_errors_is_one_rule_and_one_flag(make_settings):
    on = make_settings("curation.reject_arith_errors=true").curation
    assert [(r.id, r.kind, r.column, r.bound) for r in curate.rules(on)] == [
        ("max:arith_errors_total<=0", "max", "arith_errors_total", 0.0)]
    assert on.flag_thresholds() == {"arith_valid": 1.0}
    both = make_settings("curation.reject_arith_errors=true", "curation.step_thresholds={inter: 0.5}").curation
    assert both.flag_thresholds() == {"arith_valid": 1.0, "inter": 0.5}
    off = make_settings().curation
    assert (curate.rules(off), off.flag_thresholds()) == ([], {})


def test_run_twice_adds_nothing(spark, night_one, make_settings, lake):
    settings = _copy_of(night_one.lake, lake, make_settings, *NIGHT)
    versions = {n: tables.version(spark, settings.table(n)) for n in ("curation", "curated", "rejected")}
    again = curate.run(spark, settings, run_id="run-2")
    assert again.counts["batch"] == 0 and again.counts["curated"] == 0 and again.counts["rejected"] == 0
    assert {n: tables.version(spark, settings.table(n)) for n in versions} == versions


def test_run_killed_after_decisions_finishes_from_stored_decisions(spark, scored, lake, make_settings, monkeypatch):
    settings = _copy_of(scored, lake, make_settings, *RULES)

    def killed(_):
        raise KeyboardInterrupt("killed after the decisions MERGE")

    monkeypatch.setattr(curate, "split", killed)
    with pytest.raises(KeyboardInterrupt):
        curate.run(spark, settings, run_id="run-1")
    monkeypatch.undo()
    assert tables.read(spark, settings.table("curation")).count() == 5
    assert not tables.exists(spark, settings.table("curated"))
    # A new chain arrives before the rerun: it gets its own quantile over its own batch, the stored five keep theirs.
    _setup(spark, settings, {"c6": (0.9, 0.05, True, 3)})
    result = curate.run(spark, settings, run_id="run-2")
    curated, rejected = _split(spark, settings)
    exp_curated, exp_rejected = _expected(spark)
    assertDataFrameEqual(curated.where(F.col(CU.CHAIN_ID) != "c6"), exp_curated)
    assertDataFrameEqual(rejected, exp_rejected)
    assert result.counts["batch"] == 1
    assert curated.where(F.col(CU.CHAIN_ID) == "c6").count() == 1  # q0.5 of {0.05} is 0.05: passes


def test_run_new_rules_curate_again_under_new_rules_hash(spark, night_one, make_settings, lake):
    settings = _copy_of(night_one.lake, lake, make_settings, *NIGHT)
    looser = make_settings("curation.thresholds={intra_entail: 0.1}")
    result = curate.run(spark, looser, run_id="run-2")
    assert result.counts["batch"] == 5
    per_rules = dict(tables.read(spark, settings.table("curation")).groupBy(CU.RULES_HASH).count().collect())
    assert per_rules == {settings.curation.rules_hash(): 5, looser.curation.rules_hash(): 5}
    # c5 has no intra_entail score: a null never passes a threshold.
    new_rejected = tables.read(spark, settings.table("rejected")).where(F.col(CU.RULES_HASH) == looser.curation.rules_hash())
    assert [(r[CU.CHAIN_ID], list(r[CU.FAILED_RULES])) for r in new_rejected.collect()] == [
        ("c5", ["threshold:intra_entail_min>=0.1"])
    ]


def test_run_quantile_reference_table(spark, scored, lake, make_settings, tmp_path):
    ref_path = str(tmp_path / "reference")
    ref = _scores(spark, "other", {"r1": (0.5, 0.2, True, 2), "r2": (0.5, 0.4, True, 2)})
    ref.write.format("delta").save(ref_path)
    settings = _copy_of(scored, lake, make_settings, "curation.quantiles={inter: 0.5}",
                        f"curation.quantile_reference={ref_path}")
    result = curate.run(spark, settings, run_id="run-1")
    assert result.rules[0]["bound"] == exact(0.3)
    rejected = tables.read(spark, settings.table("rejected")).select(CU.CHAIN_ID).collect()
    assert [r[0] for r in rejected] == ["c3"]


def test_change_feed_of_curated_returns_only_the_new_nights_rows(spark, night_one, make_settings, lake):
    """A downstream reader of `curated`/`rejected` takes what a night added from the Delta change data feed."""
    settings = _copy_of(night_one.lake, lake, make_settings, *NIGHT)
    after_night_1 = {n: tables.version(spark, settings.table(n)) for n in ("curated", "rejected")}
    night_2 = {"c6": (0.95, 0.9, True, 3), "c7": (0.1, 0.9, True, 3), "c8": (0.8, 0.95, True, 4)}
    tables.insert_new(spark, _scores(spark, settings.scoring_hash(), night_2), settings.table("chain_scores"),
                      CS.SCHEMA, [CS.CHAIN_ID, CS.CONFIG_HASH])
    curate.run(spark, settings, run_id="night-2")
    for name in ("curated", "rejected"):
        new = (
            spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", after_night_1[name] + 1).load(settings.table(name))
            .where(F.col("_change_type") == "insert")
            .drop("_change_type", "_commit_version", "_commit_timestamp")
        )
        expected = tables.read(spark, settings.table(name)).where(F.col(CU.RUN_ID) == "night-2")
        assertDataFrameEqual(new, expected)
        # The same feed read without Spark (deltalake's load_cdf, README "Reading the lake without Spark").
        without_spark = delta_readers.change_feed_inserts(settings.table(name), after_night_1[name] + 1)
        assert delta_readers.canonical(without_spark, expected.schema) == delta_readers.canonical(
            [r.asDict() for r in expected.collect()], expected.schema), name
        assert {r[0] for r in new.select(CU.CHAIN_ID).collect()} <= set(night_2)
    # The night-2 bound of inter (median over its 3 chains) is 0.9: c6, c8 pass it, c7 fails its threshold.
    assert {r[0] for r in tables.read(spark, settings.table("curated")).where(F.col(CU.RUN_ID) == "night-2")
            .select(CU.CHAIN_ID).collect()} == {"c6", "c8"}
