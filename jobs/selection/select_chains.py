"""`chains` (k sampled chains per question) + `chain_scores` -> answer accuracy of ReCEval-guided chain choice.

Per question (chains.question_id, k taken from the data) a selection method chooses one of the k chains; accuracy
against the gold answer is reported beside greedy decoding. The methods are declared once, in udfs.selection
(each a pure function over one question's candidates, run here per question in a grouped applyInPandas): the
argmax of each ReCEval criterion (`select.criteria`), and the rows of `select.methods`: by default
self-consistency (majority vote over the normalised answers, ties to the earliest sample), filter-then-vote (the
arithmetic check, a score threshold), weighted vote, group scores, and the oracle (a correct candidate whenever
the question has one: the ceiling any choice among the k can reach). A method parameter with a grid (a threshold,
a temperature, a weight between scores) is chosen by k-fold cross-validation over the questions
(jobs/selection/cross_validation.py): each fold is answered with the value chosen on the other folds, only those
held-out answers are reported, and the `fold` and `setting` columns and the fold table say which value each fold
chose. Greedy is the question's real greedy decode, a chain with
`metadata[select.greedy_flag]` = "true" (sample_chains writes one): it is kept apart, never a candidate of the
ReCEval choice or the vote. A question without one falls back to the old rule, the first sample (the smallest
`metadata[select.greedy_key]`, else the smallest chain_id); the `greedy_basis` column and the log say which. Criteria (SelectSettings): correctness = the listed
correctness chain scores, informativeness = the listed informativeness scores; several columns in one
criterion are combined by `combine`. Default `rank_mean`: each column becomes its percent rank among the
question's chains and the ranks are averaged, so probabilities and nats weigh the same; "both" is the mean of
the correctness and informativeness ranks (the paper does not publish its combination). `sum` adds raw values.
A chain with a null score in a criterion ranks last for it.

Every method is compared with greedy on the same questions: the accuracy difference and its paired bootstrap
percentile CI (questions resampled with replacement, each keeping both its answers; select.bootstrap_resamples,
select.confidence, select.seed), as the paper's downstream table reads "better than greedy".
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, IntegerType, StringType, StructField, StructType

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.stage import Job, Stage
from jobs.selection import cross_validation as CV
from jobs.selection.settings import SelectSettings
from schemas import chain_scores as CS
from schemas import chains as C
from schemas import metrics as MR
from udfs import selection as SEL

log = logging.getLogger(__spec__.name)

METHOD, CORRECT, ORDER, NORM = "method", "correct", "_order", "_norm"
GREEDY, MAJORITY, ORACLE = "greedy", "self_consistency", "oracle"
DELTA, LOW, HIGH = "delta_vs_greedy", "ci_low", "ci_high"  # accuracy(method) - accuracy(greedy), its CI
BASIS, DECODE, FIRST = "greedy_basis", "greedy_decode", "first_sample"  # where a greedy pick came from
# A cross-validated pick: the grid point its fold chose (null for a method with nothing to tune) and the fold.
SETTING, FOLD = "setting", "fold"
RIGHT, ARITH = "_right", "_arith"  # a candidate's answer matches the gold answer; its arithmetic errors
FOLDS = "folds"  # run()'s rows: each cross-validated method's folds (fold, questions, setting, accuracies)
_PICKED = StructType([
    StructField(C.DATASET, StringType()), StructField(C.QUESTION_ID, StringType()), StructField(METHOD, StringType()),
    StructField(SETTING, StringType()), StructField(C.CHAIN_ID, StringType()), StructField(RIGHT, BooleanType()),
])  # fmt: skip
_KEPT = StructType([
    StructField(C.DATASET, StringType()), StructField(C.QUESTION_ID, StringType()), StructField(METHOD, StringType()),
    StructField(SETTING, StringType()), StructField(FOLD, IntegerType()),
])  # fmt: skip
# A method run: (table row, registry method, its parameters, the grid point's label or None when nothing is tuned).
Run = tuple[str, str, dict[str, Any], str | None]


def normalise(answer: Column) -> Column:
    """Lower case, no '$' or thousands commas, no trailing period: "$1,000." and "1000" compare equal."""
    text = F.lower(F.trim(answer))
    text = F.regexp_replace(text, r"[$,]", "")
    return F.regexp_replace(text, r"\.+$", "")


def same_answer(a: Column, b: Column) -> Column:
    num_a, num_b = a.try_cast("double"), b.try_cast("double")
    numeric = num_a.isNotNull() & num_b.isNotNull()
    return F.coalesce(F.when(numeric, F.abs(num_a - num_b) < 1e-6).otherwise(a == b), F.lit(False))


def _criterion(columns: Sequence[str], question: Window, combine: str) -> Column:
    if combine == "sum":
        return sum((F.col(c) for c in columns), F.lit(0.0))
    ranks = [F.when(F.col(c).isNotNull(), F.percent_rank().over(question.orderBy(F.col(c).asc_nulls_first())))
             for c in columns]
    return sum(ranks, F.lit(0.0)) / len(columns)


def scored_candidates(chains: DataFrame, chain_scores: DataFrame, cfg: SelectSettings, config_hash: str) -> DataFrame:
    """Chains of questions with k >= 2 samples, with their sample order, one column per criterion, their
    arithmetic errors (`_arith`: arith_errors_total) and whether their answer is right (`_right`)."""
    order = F.coalesce(F.col(C.METADATA)[cfg.greedy_key].try_cast("double"), F.lit(float("inf")))
    base = chains.where(F.col(C.QUESTION_ID).isNotNull())
    if cfg.datasets:
        base = base.where(F.col(C.DATASET).isin(cfg.datasets))
    wanted = sorted(set(cfg.correctness) | set(cfg.informativeness))
    arith = CS.total_col(MR.ARITH_ERRORS)
    scores = chain_scores.where(F.col(CS.CONFIG_HASH) == config_hash)
    errors = F.col(arith) if arith in chain_scores.columns else F.lit(None)  # a registry without the check
    scores = scores.select(CS.CHAIN_ID, *wanted, errors.cast("double").alias(ARITH))
    question = Window.partitionBy(C.DATASET, C.QUESTION_ID)
    joined = (
        base.select(C.CHAIN_ID, C.DATASET, C.QUESTION_ID, C.ANSWER, C.GOLD_ANSWER, order.alias(ORDER))
        .join(scores, C.CHAIN_ID, "left")
        .withColumn("_k", F.count(F.lit(1)).over(question))
        .where(F.col("_k") >= 2)
        .withColumn(NORM, normalise(F.col(C.ANSWER)))
        .withColumn(RIGHT, same_answer(F.col(NORM), normalise(F.col(C.GOLD_ANSWER))))
    )
    corr = _criterion(cfg.correctness, question, cfg.combine)
    info = _criterion(cfg.informativeness, question, cfg.combine)
    joined = joined.withColumn("correctness", corr).withColumn("informativeness", info)
    if cfg.combine == "sum":
        both = F.col("correctness") + F.col("informativeness")
    else:
        both = (
            F.percent_rank().over(question.orderBy(F.col("correctness").asc_nulls_first()))
            + F.percent_rank().over(question.orderBy(F.col("informativeness").asc_nulls_first()))
        ) / 2
    return joined.withColumn("both", both)


def _first(df: DataFrame, ordering: list[Column], method: str) -> DataFrame:
    question = Window.partitionBy(C.DATASET, C.QUESTION_ID).orderBy(*ordering, F.col(ORDER), F.col(C.CHAIN_ID))
    return (
        df.withColumn("_pick", F.row_number().over(question))
        .where(F.col("_pick") == 1)
        .select(C.DATASET, C.QUESTION_ID, F.lit(method).alias(METHOD), C.CHAIN_ID, C.ANSWER, C.GOLD_ANSWER)
    )


def method_runs(cfg: SelectSettings) -> list[Run]:
    """Every (row, method, parameters, grid point) to run per question: each criterion's argmax, then each of
    `select.methods` once, or once per grid point when it has a grid to cross-validate."""
    runs: list[Run] = [(c, SEL.ARGMAX, {"score": c}, None) for c in cfg.criteria]
    for name, spec in cfg.methods.items():
        grid = spec.tuned_grid()
        if not grid:
            runs.append((name, spec.method, dict(spec.params), None))
        for point in CV.grid_points(grid) if grid else ():
            runs.append((name, spec.method, {**spec.params, **point}, CV.label(point)))
    return runs


def _number(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def candidates_of(pdf: pd.DataFrame) -> list[SEL.Candidate]:
    """One question's candidate rows (scored_candidates' columns) as udfs.selection candidates. A NaN score is a
    missing one (pandas holds nulls as NaN)."""
    return [
        SEL.Candidate(
            chain_id=r[C.CHAIN_ID], order=float(r[ORDER]), answer=None if pd.isna(r[NORM]) else r[NORM],
            scores={s: _number(r[s]) for s in SEL.SCORES}, arith_errors=_number(r[ARITH]), correct=bool(r[RIGHT]),
        )
        for r in pdf.to_dict("records")
    ]  # fmt: skip


def choose_per_question(cand: DataFrame, runs: Sequence[Run]) -> DataFrame:
    """One row per (question, run): the chain udfs.selection chooses among the question's candidates."""
    runs = list(runs)

    def apply(pdf: pd.DataFrame) -> pd.DataFrame:
        candidates = candidates_of(pdf)
        right = {c.chain_id: c.correct for c in candidates}
        dataset, question = pdf[C.DATASET].iloc[0], pdf[C.QUESTION_ID].iloc[0]
        rows = []
        for name, method, params, setting in runs:
            chosen = SEL.choose(method, candidates, params)
            rows.append((dataset, question, name, setting, chosen, right[chosen]))
        return pd.DataFrame(rows, columns=_PICKED.names)

    columns = [C.DATASET, C.QUESTION_ID, C.CHAIN_ID, ORDER, NORM, *SEL.SCORES, ARITH, RIGHT]
    return cand.select(*columns).groupBy(C.DATASET, C.QUESTION_ID).applyInPandas(apply, _PICKED)


def cross_validated(picked: DataFrame, runs: Sequence[Run], cfg: SelectSettings
                    ) -> tuple[DataFrame, dict[tuple[str, str], list[CV.Fold]]]:
    """(dataset, question, method, setting, fold) of every held-out answer of a tuned method, and its folds per
    (dataset, method). Per dataset: the questions are split into `cv_folds` folds (seed `cv_seed`) and each fold is
    answered with the grid point best on the others. A dataset with under 2 questions has no tuned rows (logged)."""
    grid: dict[str, list[str]] = {}
    for name, _, _, setting in runs:
        if setting is not None:
            grid.setdefault(name, []).append(setting)
    outcomes: dict[tuple[str, str], dict[str, dict[str, bool]]] = {}
    tuned = picked.where(F.col(SETTING).isNotNull()).select(C.DATASET, C.QUESTION_ID, METHOD, SETTING, RIGHT)
    for r in tuned.collect():  # questions x grid points: small
        outcomes.setdefault((r[C.DATASET], r[METHOD]), {}).setdefault(r[C.QUESTION_ID], {})[r[SETTING]] = r[RIGHT]
    kept, folds = [], {}
    for (dataset, method), answers in sorted(outcomes.items()):
        if len(answers) < 2:
            log.warning("[select_chains] %s: %s is not reported: cross-validating its parameters needs 2 questions "
                        "or more, there is %d", dataset, method, len(answers))  # fmt: skip
            continue
        fold_of, folds[(dataset, method)] = CV.cross_validate(answers, grid[method], cfg.cv_folds, cfg.cv_seed)
        chosen = {f.fold: f.setting for f in folds[(dataset, method)]}
        kept += [(dataset, q, method, chosen[f], f) for q, f in sorted(fold_of.items())]
    return picked.sparkSession.createDataFrame(kept, _KEPT), folds


def choices(chains: DataFrame, chain_scores: DataFrame, settings: Settings, hold: tables.Held | None = None
            ) -> tuple[DataFrame, dict[tuple[str, str], list[CV.Fold]]]:
    """(one row per (question, method): the chosen chain, its answer and whether it matches the gold answer;
    the folds of each cross-validated (dataset, method)). Runs the cross-validation (a Spark job).

    With `hold`, the candidates and the per-question choices (each read twice) are persisted until the holder
    releases them."""
    cfg = settings.select
    config_hash = cfg.config_hash or settings.scoring_hash()
    decoded = F.coalesce(F.lower(F.col(C.METADATA)[cfg.greedy_flag]) == "true", F.lit(False))
    cand = scored_candidates(chains.where(~decoded), chain_scores, cfg, config_hash)
    cand = hold(cand) if hold is not None else cand
    keys = [C.DATASET, C.QUESTION_ID]
    asked = cand.select(*keys).distinct()
    # The real greedy decode of each question that has candidates (the smallest chain_id should a question hold two).
    real = chains.where(decoded & F.col(C.QUESTION_ID).isNotNull()).join(asked, keys, "left_semi")
    real = real.withColumn(ORDER, F.lit(0.0))
    real = _first(real, [], GREEDY).withColumn(BASIS, F.lit(DECODE))
    fallback = _first(cand, [], GREEDY).join(real.select(*keys), keys, "left_anti").withColumn(BASIS, F.lit(FIRST))
    greedy = real.unionByName(fallback).withColumn(SETTING, F.lit(None).cast("string"))
    greedy = greedy.withColumn(FOLD, F.lit(None).cast("int"))
    runs = method_runs(cfg)
    picked = choose_per_question(cand, runs)
    picked = hold(picked) if hold is not None else picked
    kept, folds = cross_validated(picked, runs, cfg)
    fixed = picked.where(F.col(SETTING).isNull()).withColumn(FOLD, F.lit(None).cast("int"))
    tuned = picked.join(kept, [*keys, METHOD, SETTING])  # only each fold's own setting: held-out answers
    answers = cand.select(C.CHAIN_ID, *keys, C.ANSWER, C.GOLD_ANSWER)
    chosen = fixed.unionByName(tuned).join(answers, [C.CHAIN_ID, *keys]).select(
        *keys, METHOD, C.CHAIN_ID, C.ANSWER, C.GOLD_ANSWER, F.lit(None).cast("string").alias(BASIS), SETTING, FOLD)
    out = greedy.unionByName(chosen)
    return out.withColumn(CORRECT, same_answer(normalise(F.col(C.ANSWER)), normalise(F.col(C.GOLD_ANSWER)))), folds


def picks(chains: DataFrame, chain_scores: DataFrame, settings: Settings, hold: tables.Held | None = None) -> DataFrame:
    """One row per (question, method): the chosen chain, its answer and whether it matches the gold answer
    (`choices` without the folds)."""
    return choices(chains, chain_scores, settings, hold)[0]


SELECTED = "_selected"  # curation: the chain is kept by the selection rule


def selected_chains(chains: DataFrame, chain_scores: DataFrame, settings: Settings) -> DataFrame:
    """(chain_id, _selected) for every candidate chain (the select stage's: sampled chains of questions with two or
    more, scored under the scoring hash; every dataset): per question, `curation.select_method` keeps the chain it
    chooses (`select_keep` chosen) or every chain of the chosen answer (chosen_answer), true; the others false.
    A chain that is no candidate has no row. The criteria come from the select section (combine, columns)."""
    cur = settings.curation
    if cur.select_method is None:
        raise ValueError("curation.select_method is not set")
    method, params, keep = cur.select_method, dict(cur.select_params), cur.select_keep
    cfg = settings.select.model_copy(update={"datasets": None})
    decoded = F.coalesce(F.lower(F.col(C.METADATA)[cfg.greedy_flag]) == "true", F.lit(False))
    cand = scored_candidates(chains.where(~decoded), chain_scores, cfg, settings.scoring_hash())

    def apply(pdf: pd.DataFrame) -> pd.DataFrame:
        candidates = candidates_of(pdf)
        kept = set(SEL.chosen_answer(method, candidates, params) if keep == "chosen_answer"
                   else [SEL.choose(method, candidates, params)])  # fmt: skip
        return pd.DataFrame({C.CHAIN_ID: [c.chain_id for c in candidates],
                             SELECTED: [c.chain_id in kept for c in candidates]})  # fmt: skip

    columns = [C.DATASET, C.QUESTION_ID, C.CHAIN_ID, ORDER, NORM, *SEL.SCORES, ARITH, RIGHT]
    out = StructType([StructField(C.CHAIN_ID, StringType()), StructField(SELECTED, BooleanType())])
    return cand.select(*columns).groupBy(C.DATASET, C.QUESTION_ID).applyInPandas(apply, out)


def accuracy(chosen: DataFrame) -> DataFrame:
    return chosen.groupBy(C.DATASET, METHOD).agg(
        F.count(F.lit(1)).alias("n_questions"), F.avg(F.col(CORRECT).cast("double")).alias("accuracy")
    )


def paired_bootstrap(method: np.ndarray, greedy: np.ndarray, resamples: int, confidence: float,
                     seed: int) -> tuple[float, float | None, float | None]:
    """(mean(method) - mean(greedy), CI low, CI high): a percentile bootstrap over questions, each resampled with
    both its outcomes (paired), by scipy.stats.bootstrap. No CI (None) with fewer than two questions."""
    from scipy.stats import bootstrap

    diff = np.asarray(method, dtype=float) - np.asarray(greedy, dtype=float)
    delta = float(diff.mean()) if len(diff) else float("nan")
    if len(diff) < 2:
        return delta, None, None
    if np.all(diff == diff[0]):  # no spread: every resample gives the same difference
        return delta, delta, delta
    res = bootstrap((diff,), np.mean, n_resamples=resamples, confidence_level=confidence, method="percentile",
                    vectorized=True, rng=np.random.default_rng(seed))  # fmt: skip
    return delta, float(res.confidence_interval.low), float(res.confidence_interval.high)


def against_greedy(chosen: DataFrame, resamples: int, confidence: float, seed: int) -> dict[tuple[str, str], tuple]:
    """(dataset, method) -> paired_bootstrap of the method's per-question correctness against greedy's."""
    outcome: dict[tuple[str, str], dict[str, bool]] = {}
    for r in chosen.select(C.DATASET, C.QUESTION_ID, METHOD, CORRECT).collect():
        outcome.setdefault((r[C.DATASET], r[METHOD]), {})[r[C.QUESTION_ID]] = bool(r[CORRECT])
    out = {}
    for (dataset, method), answers in sorted(outcome.items()):
        base = outcome.get((dataset, GREEDY), {})
        questions = sorted(set(answers) & set(base))  # every method answers every question: the same set
        out[(dataset, method)] = paired_bootstrap(np.array([answers[q] for q in questions]),
                                                  np.array([base[q] for q in questions]), resamples, confidence, seed)
    return out


def greedy_bases(chosen: DataFrame) -> dict[str, dict[str, int]]:
    """dataset -> {greedy_decode: n, first_sample: n}: how many greedy picks were real decodes."""
    out: dict[str, dict[str, int]] = {}
    for r in chosen.where(F.col(METHOD) == GREEDY).groupBy(C.DATASET, BASIS).count().collect():
        out.setdefault(r[C.DATASET], {})[r[BASIS]] = r["count"]
    return out


def run(spark: SparkSession, settings: Settings) -> list[dict]:
    """Accuracy rows per (dataset, method); each greedy row also says how many of its picks were real decodes, and
    each cross-validated method's row lists its folds (`folds`: fold, questions, setting, accuracies)."""
    chains = tables.read(spark, settings.table("chains"), C.SCHEMA)
    scores = tables.read(spark, settings.table("chain_scores"), CS.SCHEMA)
    with tables.Held() as hold:
        chosen, folds = choices(chains, scores, settings, hold)
        chosen = hold(chosen)
        rows = [r.asDict() for r in accuracy(chosen).orderBy(C.DATASET, METHOD).collect()]
        bases = greedy_bases(chosen)
        cfg = settings.select
        compared = against_greedy(chosen, cfg.bootstrap_resamples, cfg.confidence, cfg.seed)
    for r in rows:
        r[DELTA], r[LOW], r[HIGH] = compared[(r[C.DATASET], r[METHOD])]
        if (r[C.DATASET], r[METHOD]) in folds:
            r[FOLDS] = [asdict(f) for f in folds[(r[C.DATASET], r[METHOD])]]
            log.info("[select_chains] %s %s: settings chosen per fold %s", r[C.DATASET], r[METHOD],
                     [f.setting for f in folds[(r[C.DATASET], r[METHOD])]])  # fmt: skip
        if r[METHOD] == GREEDY:
            r[DECODE], r[FIRST] = (bases.get(r[C.DATASET], {}).get(b, 0) for b in (DECODE, FIRST))
            if r[FIRST]:
                log.warning("[select_chains] %s: %d of %d questions have no greedy decode (metadata %s=true); their "
                            "greedy is the first sample (smallest metadata %s)", r[C.DATASET], r[FIRST],
                            r["n_questions"], settings.select.greedy_flag, settings.select.greedy_key)  # fmt: skip
    return rows


def report(rows: list[dict]) -> str:
    lines = ["| dataset | method | questions | accuracy | vs greedy (paired bootstrap CI) |", "|---|---|---|---|---|"]
    for r in rows:
        method = r[METHOD]
        if method == GREEDY and FIRST in r:  # say what the baseline was: real decodes or the old first-sample rule
            method += f" ({r[DECODE]} greedy decodes, {r[FIRST]} first samples)"
        if r.get(FOLDS):
            method += f" (held out, {len(r[FOLDS])} folds)"
        versus = ""
        if r[METHOD] != GREEDY and r.get(DELTA) is not None:
            ci = f" [{100 * r[LOW]:+.1f}, {100 * r[HIGH]:+.1f}]" if r.get(LOW) is not None else " (no CI: < 2 questions)"
            versus = f"{100 * r[DELTA]:+.1f}{ci}"
        lines.append(f"| {r[C.DATASET]} | {method} | {r['n_questions']} | {100 * r['accuracy']:.1f} % | {versus} |")
    if not rows:  # an empty table must not read as a result
        lines.append("\nno question has 2 or more candidate chains (quarantined or unscored chains are not candidates)")
    tuned = [r for r in rows if r.get(FOLDS)]
    if tuned:  # which parameter each fold chose, on the other folds only
        lines += ["", "Cross-validated parameters: each fold is answered with the setting best on the other folds; the "
                  "accuracy above is over these held-out answers only.", "",
                  "| dataset | method | fold | questions | setting (chosen on the other folds) | accuracy there | "
                  "held-out accuracy |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in tuned:
            for f in r[FOLDS]:
                lines.append(f"| {r[C.DATASET]} | {r[METHOD]} | {f['fold']} | {f['questions']} | `{f['setting']}` | "
                             f"{100 * f['train_accuracy']:.1f} % | {100 * f['heldout_accuracy']:.1f} % |")
    return "\n".join(lines) + "\n"


def _body(job: Job) -> list[dict]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    rows = run(spark, settings)
    tracked.log_metrics({f"accuracy_{r[C.DATASET]}_{r[METHOD]}": r["accuracy"] for r in rows})
    tracked.log_metrics({f"{key}_{r[C.DATASET]}_{r[METHOD]}": r[key] for r in rows if r[METHOD] != GREEDY
                         for key in (DELTA, LOW, HIGH) if r.get(key) is not None})  # fmt: skip
    tracked.log_text("select_chains/accuracy.md", report(rows))
    tracked.log_text("select_chains/folds.json", json.dumps({f"{r[C.DATASET]}/{r[METHOD]}": r[FOLDS] for r in rows
                                                            if r.get(FOLDS)}, indent=1))  # fmt: skip
    print(report(rows))
    return rows


STAGE = Stage("select_chains", __doc__, _body, reads=("chains", "chain_scores"), writes=(), section="select")


def main(argv: list[str] | None = None) -> list[dict]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
