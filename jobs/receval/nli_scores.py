"""`steps` + `contexts` (Delta) -> NLI columns of `step_scores`: intra-step entailment and inter-step correctness.

intra_entail(i) = P_entail(" and ".join(premise RCUs of i + earlier conclusions), conclusion of i), 1.0 without
premise text; inter(i) = 1 - max P_contradiction(r, conclusion of i) over context sentences and earlier
conclusions, 1.0 for an empty set. Pairs are built with Spark SQL, identical pairs are scored once across the
whole batch, and failed steps go to `quarantine` (stage "nli") when runtime.on_row_error is "quarantine".
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from jobs.infra import tables
from jobs.infra.config import ModelRef, RuntimeSettings, Settings
from jobs.infra.stage import Job, Stage
from jobs.receval import scores_table
from jobs.receval.settings import NliSettings
from schemas import step_scores as SS
from schemas import steps as S
from udfs import nli, runtime

log = logging.getLogger(__spec__.name)

KEYS = [S.CHAIN_ID, S.CONFIG_HASH, S.STEP_IDX]
PREMISE = "premise"
HYPOTHESIS = "hypothesis"
KIND = "kind"  # intra | inter
ORD = "ord"  # position of an inter premise: context sentences first, then earlier steps
SOURCE = "source"
ERROR = "error"  # why the step could not be scored (null when it was)
CONTEXT_SOURCE = "context"

NLI_COLUMNS = [f.name for f in SS.NLI_SCHEMA.fields[2:]]
OUTPUT_SCHEMA = StructType(
    [
        *SS.NLI_SCHEMA.fields[:2],
        StructField(S.CONFIG_HASH, StringType(), False),
        *SS.NLI_SCHEMA.fields[2:],
        StructField(ERROR, StringType(), True),
    ]
)


def _blank_free(arr: Column) -> Column:
    return F.filter(arr, lambda s: s.isNotNull() & (F.trim(s) != ""))


def _last(arr: Column, k: int) -> Column:
    return F.filter(arr, lambda _, i: i >= F.size(arr) - k)


def _history(arr: Column, option: str | int) -> Column:
    """Earlier conclusions kept by a history option: all, none, or the last k."""
    if option == "all":
        return arr
    if option == "none":
        return F.filter(arr, lambda _: F.lit(False))
    return _last(arr, int(option))


def step_premises(steps: DataFrame, contexts: DataFrame, cfg: NliSettings) -> DataFrame:
    """Per step: the intra premise text (null when there is none) and the inter premise candidates."""
    conclusions = steps.groupBy(S.CHAIN_ID, S.CONFIG_HASH).agg(
        F.array_sort(F.collect_list(F.struct(S.STEP_IDX, S.CONCLUSION_RCU))).alias("_chain")
    )
    ctx = contexts.select(S.CHAIN_ID, S.CONFIG_HASH, S.CONTEXT_SENTENCES)
    df = steps.join(conclusions, [S.CHAIN_ID, S.CONFIG_HASH]).join(ctx, [S.CHAIN_ID, S.CONFIG_HASH], "left")
    earlier = F.filter("_chain", lambda c: c[S.STEP_IDX] < F.col(S.STEP_IDX))
    earlier = F.filter(earlier, lambda c: c[S.CONCLUSION_RCU].isNotNull() & (F.trim(c[S.CONCLUSION_RCU]) != ""))

    intra_parts = _blank_free(
        F.concat(
            F.coalesce(F.col(S.PREMISE_RCUS), F.array().cast("array<string>")),
            F.transform(_history(earlier, cfg.intra_history), lambda c: c[S.CONCLUSION_RCU]),
        )
    )
    sentences = _blank_free(F.coalesce(F.col(S.CONTEXT_SENTENCES), F.array().cast("array<string>")))
    from_context = F.transform(
        sentences,
        lambda s, i: F.struct(s.alias(PREMISE), F.lit(CONTEXT_SOURCE).alias(SOURCE), i.alias(ORD)),
    )
    from_steps = F.transform(
        _history(earlier, cfg.inter_history),
        lambda c: F.struct(
            c[S.CONCLUSION_RCU].alias(PREMISE),
            F.concat(F.lit("step:"), c[S.STEP_IDX].cast("string")).alias(SOURCE),
            (F.size(sentences) + c[S.STEP_IDX]).alias(ORD),
        ),
    )
    return df.select(
        *KEYS,
        F.col(S.CONCLUSION_RCU).alias(HYPOTHESIS),
        F.when(F.size(intra_parts) > 0, F.array_join(intra_parts, " and ")).alias(SS.INTRA_PREMISE),
        F.concat(from_context, from_steps).alias("_inter"),
    )


def pairs(premises: DataFrame) -> DataFrame:
    """Every (premise, hypothesis) pair the scores need, tagged with its step, kind and source."""
    intra = premises.where(F.col(SS.INTRA_PREMISE).isNotNull()).select(
        *KEYS,
        F.lit("intra").alias(KIND),
        F.lit(0).alias(ORD),
        F.lit(None).cast("string").alias(SOURCE),
        F.col(SS.INTRA_PREMISE).alias(PREMISE),
        HYPOTHESIS,
    )
    inter = premises.select(*KEYS, HYPOTHESIS, F.explode("_inter").alias("c")).select(
        *KEYS,
        F.lit("inter").alias(KIND),
        F.col(f"c.{ORD}").alias(ORD),
        F.col(f"c.{SOURCE}").alias(SOURCE),
        F.col(f"c.{PREMISE}").alias(PREMISE),
        HYPOTHESIS,
    )
    return intra.unionByName(inter)


def score_distinct(all_pairs: DataFrame, udf, dedup: bool = True) -> DataFrame:
    """Each distinct pair once through the model (context sentences recur across chains and steps).

    dedup=False scores every pair row; the join back in `step_scores` then meets copies of a pair, which the
    max/set aggregations there absorb, so the scores are the same.
    """
    distinct = all_pairs.select(PREMISE, HYPOTHESIS)
    if dedup:
        distinct = distinct.distinct()
    return distinct.select(PREMISE, HYPOTHESIS, udf(F.col(PREMISE), F.col(HYPOTHESIS)).alias("s")).select(
        PREMISE,
        HYPOTHESIS,
        F.col(f"s.{nli.ENTAIL}").alias(nli.ENTAIL),
        F.col(f"s.{nli.CONTRADICTION}").alias(nli.CONTRADICTION),
        F.col(f"s.{nli.TRUNCATED}").alias(nli.TRUNCATED),
        F.col(f"s.{nli.ERROR}").alias(ERROR),
    )


def step_scores(premises: DataFrame, all_pairs: DataFrame, scored: DataFrame) -> DataFrame:
    """Join pair scores back to their steps; a step with any failed pair gets an error and no scores."""
    joined = all_pairs.join(scored, [PREMISE, HYPOTHESIS])
    is_intra = F.col(KIND) == "intra"
    per_step = joined.groupBy(*KEYS).agg(
        F.max(F.when(is_intra, F.col(nli.ENTAIL))).alias("_entail"),
        # Ties on contradiction go to the earliest premise (context before steps).
        F.max(
            F.when(
                ~is_intra,
                F.struct(
                    F.col(nli.CONTRADICTION).alias("p"),
                    (-F.col(ORD)).alias("o"),
                    F.col(PREMISE).alias("premise"),
                    F.col(SOURCE).alias("source"),
                ),
            )
        ).alias("_worst"),
        F.array_join(F.array_sort(F.collect_set(ERROR)), "; ").alias("_error"),
    )
    out = premises.select(*KEYS, SS.INTRA_PREMISE).join(per_step, KEYS, "left")
    error = F.when(F.col("_error") != "", F.col("_error"))
    ok = error.isNull()
    worst = F.col("_worst")
    return out.select(
        S.CHAIN_ID,
        S.STEP_IDX,
        S.CONFIG_HASH,
        F.when(ok, F.when(F.col(SS.INTRA_PREMISE).isNull(), F.lit(1.0)).otherwise(F.col("_entail"))).alias(
            SS.INTRA_ENTAIL
        ),
        F.col(SS.INTRA_PREMISE),
        F.when(ok, F.when(worst.isNull(), F.lit(1.0)).otherwise(1.0 - worst["p"])).alias(SS.INTER),
        F.when(ok, worst["p"]).alias(SS.INTER_MAX_CONTRADICTION),
        F.when(ok, worst["premise"]).alias(SS.INTER_WORST_PREMISE),
        F.when(ok, worst["source"]).alias(SS.INTER_WORST_SOURCE),
        error.alias(ERROR),
    )


def predictor(cfg: NliSettings, ref: ModelRef, rt: RuntimeSettings) -> nli.PredictFactory:
    """The NLI model `ref` (models.nli) as a worker-side factory (device, dtype, batch size from config)."""
    batch_size, max_length = cfg.call_sizes(rt)
    return nli.model_predictor(
        ref.path,
        ref.revision,
        device=rt.device,
        dtype=rt.dtype,
        batch_size=batch_size,
        max_length=max_length,
        threads=rt.torch_threads,
        trust_remote_code=rt.trust_remote_code,
        sort=rt.sort_by_length,
        cache_size=rt.model_cache_size,
    )


@dataclass
class Plan:
    premises: DataFrame
    pairs: DataFrame
    scored: DataFrame
    result: DataFrame


def plan(
    steps: DataFrame,
    contexts: DataFrame,
    cfg: NliSettings,
    model: ModelRef,
    rt: RuntimeSettings,
    predict: nli.PredictFactory | None = None,
    accumulators: Sequence = (),
) -> Plan:
    premises = step_premises(steps, contexts, cfg)
    all_pairs = pairs(premises)
    udf = nli.nli_udf(predict or predictor(cfg, model, rt), rt.on_row_error, *accumulators)
    scored = score_distinct(all_pairs, udf, rt.dedup)
    return Plan(premises, all_pairs, scored, step_scores(premises, all_pairs, scored))


def transform(
    steps: DataFrame,
    contexts: DataFrame,
    cfg: NliSettings,
    model: ModelRef,
    rt: RuntimeSettings,
    predict: nli.PredictFactory | None = None,
) -> DataFrame:
    """steps (schemas.steps.SCHEMA) + contexts (CONTEXTS_SCHEMA) -> OUTPUT_SCHEMA: NLI_SCHEMA + config_hash, error.

    `model` is models.nli; `predict` replaces it by a factory returning `predict(premises, hypotheses)`.
    """
    return plan(steps, contexts, cfg, model, rt, predict).result


def model_revision(ref: ModelRef, resolved: str) -> str | None:
    """The configured revision; else the HF cache snapshot, or a fingerprint of a local model folder."""
    if ref.revision:
        return ref.revision
    folder = Path(resolved)
    if not folder.is_dir():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(resolved, "config.json")
            return Path(cached).parent.name if isinstance(cached, str) else None
        except Exception:
            return None
    # Head and size of each weights file: changes when the weights do, without reading gigabytes.
    digest = hashlib.sha256()
    for path in sorted([folder / "config.json", *folder.glob("*.safetensors")]):
        if path.exists():
            with path.open("rb") as f:
                digest.update(path.name.encode() + f.read(1 << 20) + str(path.stat().st_size).encode())
    return "sha256:" + digest.hexdigest()[:16]


def run(
    spark: SparkSession,
    settings: Settings,
    run_id: str | None = None,
    predict: nli.PredictFactory | None = None,
) -> dict[str, int]:
    """Score the steps of settings.scoring_hash() into `step_scores`; failed steps into `quarantine`."""
    ref = settings.models.nli
    # Before any table is read or written: a missing model must not leave a partial table.
    resolved = runtime.check_available(ref.path, "nli")
    revision = model_revision(ref, resolved)
    config_hash = settings.scoring_hash()
    steps = tables.read(spark, settings.table("steps"), S.SCHEMA).where(F.col(S.CONFIG_HASH) == config_hash)
    contexts = tables.read(spark, settings.table("contexts"), S.CONTEXTS_SCHEMA).where(
        F.col(S.CONFIG_HASH) == config_hash
    )
    # Counts what the model was actually given (a recomputed partition would count twice: visible here).
    sent = spark.sparkContext.accumulator(0)
    p = plan(steps, contexts, settings.nli, ref, settings.runtime, predict, (sent,))
    # The model runs once: the distinct scored pairs are cached and both counts and scores read them.
    with tables.Held() as hold:
        scored = hold(p.scored)
        pairs_distinct = scored.count()
        result = hold(step_scores(p.premises, p.pairs, scored))
        counts = {
            "steps": result.count(),
            "pairs": p.pairs.count(),
            "pairs_distinct": pairs_distinct,
            "pairs_sent": int(sent.value),
            "pairs_truncated": scored.where(F.col(nli.TRUNCATED)).count(),
        }
        good = result.where(F.col(ERROR).isNull()).select(
            *result.columns, F.lit(ref.path).alias(SS.NLI_MODEL), F.lit(revision).cast("string").alias(SS.NLI_REVISION)
        )
        bad = result.where(F.col(ERROR).isNotNull())
        counts["steps_scored"] = good.count()
        counts["steps_quarantined"] = bad.count()
        # Its own group of columns: a row the PVI job (or the pipeline) wrote keeps theirs.
        scores_table.write(spark, settings, good, [*NLI_COLUMNS, SS.NLI_MODEL, SS.NLI_REVISION])
        if counts["steps_quarantined"]:
            rows = tables.quarantine_rows(
                bad,
                "nli",
                "scoring_error",
                F.col(ERROR),
                chain_id=F.col(S.CHAIN_ID),
                raw=F.to_json(F.struct(S.CHAIN_ID, S.STEP_IDX, S.CONFIG_HASH)),
                source=settings.table("steps"),
                run_id=run_id,
            )
            tables.append_quarantine(spark, settings, rows)
        counts["reconciled"] = int(counts["steps"] == counts["steps_scored"] + counts["steps_quarantined"])
    return counts


def _body(job: Job) -> dict[str, int]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    counts = run(spark, settings, tracked.local_id)
    tracked.log_metrics({f"nli_{k}": v for k, v in counts.items()})
    tracked.set_tags({"nli_model": settings.models.nli.path})
    log.info(
        f"[nli_scores] steps={counts['steps']} scored={counts['steps_scored']} "
        f"quarantined={counts['steps_quarantined']} pairs={counts['pairs']} "
        f"distinct={counts['pairs_distinct']} sent={counts['pairs_sent']} "
        f"truncated={counts['pairs_truncated']} -> {settings.table('step_scores')}"
    )
    if not counts["reconciled"]:
        raise RuntimeError(f"nli_scores counts do not reconcile: {counts}")
    return counts


STAGE = Stage("nli_scores", __doc__, _body, reads=("steps", "contexts"), writes=("step_scores", "quarantine"),
              section="nli")


def main(argv: list[str] | None = None) -> dict[str, int]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
