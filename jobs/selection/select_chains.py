"""`chains` (k sampled chains per question) + `chain_scores` -> answer accuracy of ReCEval-guided chain choice.

Per question (chains.question_id, k taken from the data) the chain with the best ReCEval score answers;
accuracy against the gold answer is reported beside greedy decoding and self-consistency (majority vote over
the normalised answers, ties to the earliest sample) and the oracle (a correct candidate whenever the question has
one: the ceiling any choice among the k can reach). Greedy is the question's real greedy decode, a chain with
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

import logging
from collections.abc import Sequence

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.stage import Job, Stage
from jobs.selection.settings import SelectSettings
from schemas import chain_scores as CS
from schemas import chains as C

log = logging.getLogger(__spec__.name)

METHOD, CORRECT, ORDER, NORM = "method", "correct", "_order", "_norm"
GREEDY, MAJORITY, ORACLE = "greedy", "self_consistency", "oracle"
DELTA, LOW, HIGH = "delta_vs_greedy", "ci_low", "ci_high"  # accuracy(method) - accuracy(greedy), its CI
BASIS, DECODE, FIRST = "greedy_basis", "greedy_decode", "first_sample"  # where a greedy pick came from


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
    """Chains of questions with k >= 2 samples, with their sample order and one column per criterion."""
    order = F.coalesce(F.col(C.METADATA)[cfg.greedy_key].try_cast("double"), F.lit(float("inf")))
    base = chains.where(F.col(C.QUESTION_ID).isNotNull())
    if cfg.datasets:
        base = base.where(F.col(C.DATASET).isin(cfg.datasets))
    wanted = sorted(set(cfg.correctness) | set(cfg.informativeness))
    scores = chain_scores.where(F.col(CS.CONFIG_HASH) == config_hash).select(CS.CHAIN_ID, *wanted)
    question = Window.partitionBy(C.DATASET, C.QUESTION_ID)
    joined = (
        base.select(C.CHAIN_ID, C.DATASET, C.QUESTION_ID, C.ANSWER, C.GOLD_ANSWER, order.alias(ORDER))
        .join(scores, C.CHAIN_ID, "left")
        .withColumn("_k", F.count(F.lit(1)).over(question))
        .where(F.col("_k") >= 2)
        .withColumn(NORM, normalise(F.col(C.ANSWER)))
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


def picks(chains: DataFrame, chain_scores: DataFrame, settings: Settings, hold: tables.Held | None = None) -> DataFrame:
    """One row per (question, method): the chosen chain, its answer and whether it matches the gold answer.

    With `hold`, the candidates (read by every method) are persisted until the holder releases them."""
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
    chosen = [real.unionByName(fallback)]
    for criterion in cfg.criteria:
        chosen.append(_first(cand, [F.col(criterion).desc_nulls_last()], criterion))
    votes = cand.withColumn("_votes", F.count(F.lit(1)).over(Window.partitionBy(C.DATASET, C.QUESTION_ID, NORM)))
    votes = votes.withColumn("_first_of_answer", F.min(ORDER).over(Window.partitionBy(C.DATASET, C.QUESTION_ID, NORM)))
    chosen.append(_first(votes, [F.col("_votes").desc(), F.col("_first_of_answer")], MAJORITY))
    right = same_answer(F.col(NORM), normalise(F.col(C.GOLD_ANSWER)))
    chosen.append(_first(cand.withColumn("_right", right), [F.col("_right").desc()], ORACLE))
    out = chosen[0]
    for part in chosen[1:]:
        out = out.unionByName(part.withColumn(BASIS, F.lit(None).cast("string")))
    return out.withColumn(CORRECT, same_answer(normalise(F.col(C.ANSWER)), normalise(F.col(C.GOLD_ANSWER))))


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
    """Accuracy rows per (dataset, method); each greedy row also says how many of its picks were real decodes."""
    chains = tables.read(spark, settings.table("chains"), C.SCHEMA)
    scores = tables.read(spark, settings.table("chain_scores"), CS.SCHEMA)
    with tables.Held() as hold:
        chosen = hold(picks(chains, scores, settings, hold))
        rows = [r.asDict() for r in accuracy(chosen).orderBy(C.DATASET, METHOD).collect()]
        bases = greedy_bases(chosen)
        cfg = settings.select
        compared = against_greedy(chosen, cfg.bootstrap_resamples, cfg.confidence, cfg.seed)
    for r in rows:
        r[DELTA], r[LOW], r[HIGH] = compared[(r[C.DATASET], r[METHOD])]
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
        versus = ""
        if r[METHOD] != GREEDY and r.get(DELTA) is not None:
            ci = f" [{100 * r[LOW]:+.1f}, {100 * r[HIGH]:+.1f}]" if r.get(LOW) is not None else " (no CI: < 2 questions)"
            versus = f"{100 * r[DELTA]:+.1f}{ci}"
        lines.append(f"| {r[C.DATASET]} | {method} | {r['n_questions']} | {100 * r['accuracy']:.1f} % | {versus} |")
    if not rows:  # an empty table must not read as a result
        lines.append("\nno question has 2 or more candidate chains (quarantined or unscored chains are not candidates)")
    return "\n".join(lines) + "\n"


def _body(job: Job) -> list[dict]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    rows = run(spark, settings)
    tracked.log_metrics({f"accuracy_{r[C.DATASET]}_{r[METHOD]}": r["accuracy"] for r in rows})
    tracked.log_metrics({f"{key}_{r[C.DATASET]}_{r[METHOD]}": r[key] for r in rows if r[METHOD] != GREEDY
                         for key in (DELTA, LOW, HIGH) if r.get(key) is not None})  # fmt: skip
    tracked.log_text("select_chains/accuracy.md", report(rows))
    print(report(rows))
    return rows


STAGE = Stage("select_chains", __doc__, _body, reads=("chains", "chain_scores"), writes=(), section="select")


def main(argv: list[str] | None = None) -> list[dict]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
