"""`steps` + `contexts` (Delta) -> NLI columns of `step_scores`: intra-step entailment and inter-step correctness.

intra_entail(i) = P_entail(" and ".join(premise RCUs of i + earlier conclusions), conclusion of i), 1.0 without
premise text; inter(i) = 1 - max P_contradiction(r, conclusion of i) over context sentences and earlier
conclusions, 1.0 for an empty set. Pairs are built with Spark SQL, identical pairs are scored once across the
whole batch, and failed steps go to `quarantine` (stage "nli") when runtime.on_row_error is "quarantine".

With nli.inter_history / intra_history = relevant, the earlier conclusions (inter: and context sentences) a step
keeps are those udfs/candidates.py picks from one sentence-encoder pass per chain (a grouped applyInPandas);
a chain whose steps all have no more candidates than the top_k keeps every one and is never embedded.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, StringType, StructField, StructType

from jobs.infra import tables
from jobs.infra.config import ModelRef, ModelsSettings, RuntimeSettings, Settings
from jobs.infra.stage import Job, Stage
from jobs.receval import scores_table
from jobs.receval.settings import RELEVANT, NliSettings
from schemas import step_scores as SS
from schemas import steps as S
from udfs import candidates, nli, runtime

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


INTER_KEPT = "_inter_kept"  # per step (relevant): the ORD of each inter candidate kept
INTRA_KEPT = "_intra_kept"  # per step (relevant): the step_idx of each earlier conclusion kept
_SELECTION_SCHEMA = StructType(
    [
        StructField(S.CHAIN_ID, StringType(), False),
        StructField(S.CONFIG_HASH, StringType(), False),
        StructField(S.STEP_IDX, IntegerType(), False),
        StructField(INTER_KEPT, ArrayType(IntegerType()), True),
        StructField(INTRA_KEPT, ArrayType(IntegerType()), True),
    ]
)


def _history(arr: Column, option: str | int, kept: str) -> Column:
    """Earlier conclusions kept by a history option: all, none, the last k, or those in column `kept` (relevant)."""
    if option == "all":
        return arr
    if option == "none":
        return F.filter(arr, lambda _: F.lit(False))
    if option == RELEVANT:  # no selection row (a chain within top_k): every one, as `all`
        return F.when(F.col(kept).isNull(), arr).otherwise(
            F.filter(arr, lambda c: F.array_contains(F.col(kept), c[S.STEP_IDX]))
        )
    return _last(arr, int(option))


def select_relevant(chains: pd.DataFrame, cfg: NliSettings, embed: candidates.EmbedFactory) -> pd.DataFrame:
    """Chains (one row each: keys, blank-free context sentences, step indices and conclusions in step order) ->
    one row per step: the inter ORDs and earlier step indices its `relevant` options keep (_SELECTION_SCHEMA).

    The encoder (`embed()`) is asked for only by a chain with a step over its top_k, and such a chain's texts
    (its context sentences and conclusions) go through it in one call.
    """
    inter_on, intra_on = cfg.inter_history == RELEVANT, cfg.intra_history == RELEVANT
    rows = []
    for chain in chains.itertuples(index=False):
        sentences = [] if chain.sentences is None else list(chain.sentences)
        indices = [int(i) for i in chain.indices]
        conclusions = list(chain.conclusions)
        needs = (inter_on and candidates.inter_needs_embeddings(sentences, conclusions, cfg.inter_top_k)) or (
            intra_on and candidates.intra_needs_embeddings(conclusions, cfg.intra_top_k)
        )
        vectors = candidates.embed_texts(embed(), sentences + conclusions) if needs else None
        n = len(sentences)
        inter = (
            candidates.inter_relevant(sentences, conclusions, vectors, cfg.inter_top_k, cfg.inter_recent)
            if inter_on
            else [None] * len(indices)
        )
        intra = (
            candidates.intra_relevant(conclusions, None if vectors is None else vectors[n:], cfg.intra_top_k)
            if intra_on
            else [None] * len(indices)
        )
        for step, kept_inter, kept_intra in zip(indices, inter, intra, strict=True):
            rows.append(
                (
                    chain.chain_id,
                    chain.config_hash,
                    step,
                    # The ORD step_premises gives each candidate: context index, then n + step_idx.
                    None if kept_inter is None else [p if p < n else n + indices[p - n] for p in kept_inter],
                    None if kept_intra is None else [indices[j] for j in kept_intra],
                )
            )
    return pd.DataFrame(rows, columns=_SELECTION_SCHEMA.names)


def _selections(chains: DataFrame, cfg: NliSettings, embed: candidates.EmbedFactory) -> DataFrame:
    """Per step: what the relevant options keep, from one grouped applyInPandas call per chain."""
    encoder = candidates.once(embed)

    def select(pdf: pd.DataFrame) -> pd.DataFrame:
        return select_relevant(pdf, cfg, encoder)

    frame = chains.select(
        S.CHAIN_ID,
        S.CONFIG_HASH,
        F.col("_sentences").alias("sentences"),
        F.transform("_chain", lambda c: c[S.STEP_IDX]).alias("indices"),
        F.transform("_chain", lambda c: c[S.CONCLUSION_RCU]).alias("conclusions"),
    )
    return frame.groupBy(S.CHAIN_ID, S.CONFIG_HASH).applyInPandas(select, _SELECTION_SCHEMA)


def step_premises(
    steps: DataFrame, contexts: DataFrame, cfg: NliSettings, embed: candidates.EmbedFactory | None = None
) -> DataFrame:
    """Per step: the intra premise text (null when there is none) and the inter premise candidates.

    `embed` (a factory of `embed(texts) -> (n, d)`) is needed when an option is `relevant`.
    """
    keys = [S.CHAIN_ID, S.CONFIG_HASH]
    conclusions = steps.groupBy(*keys).agg(
        F.array_sort(F.collect_list(F.struct(S.STEP_IDX, S.CONCLUSION_RCU))).alias("_chain")
    )
    ctx = contexts.select(*keys, _blank_free(F.col(S.CONTEXT_SENTENCES)).alias("_sentences"))
    none: Column = F.array().cast("array<string>")
    # A chain without a contexts row has no sentences (null would null the whole candidate array).
    chains = conclusions.join(ctx, keys, "left").withColumn("_sentences", F.coalesce("_sentences", none))
    df = steps.join(chains, keys)
    if cfg.uses_embedding():
        if embed is None:
            raise ValueError("nli.inter_history / intra_history = relevant needs an embed factory")
        # Only chains that may have a step over its top_k go through the selection (a Python stage): a night of
        # textbook chains runs none. The count here may exceed a step's by one (the last conclusion counts), never
        # fall short; a chain left out has no selection rows, which keep every candidate, as `all` does.
        concluded = F.size(F.filter("_chain", lambda c: F.trim(F.coalesce(c[S.CONCLUSION_RCU], F.lit(""))) != ""))
        over = F.lit(False)
        if cfg.inter_history == RELEVANT:
            over = over | (F.size("_sentences") + concluded > cfg.inter_top_k)
        if cfg.intra_history == RELEVANT:
            over = over | (concluded > cfg.intra_top_k)
        # One selection row per step of a selected chain; left, so that a step could never vanish from the output.
        df = df.join(_selections(chains.where(over), cfg, embed), KEYS, "left")
    earlier = F.filter("_chain", lambda c: c[S.STEP_IDX] < F.col(S.STEP_IDX))
    earlier = F.filter(earlier, lambda c: c[S.CONCLUSION_RCU].isNotNull() & (F.trim(c[S.CONCLUSION_RCU]) != ""))

    intra_parts = _blank_free(
        F.concat(
            F.coalesce(F.col(S.PREMISE_RCUS), F.array().cast("array<string>")),
            F.transform(_history(earlier, cfg.intra_history, INTRA_KEPT), lambda c: c[S.CONCLUSION_RCU]),
        )
    )
    sentences = F.col("_sentences")
    from_context = F.transform(
        sentences,
        lambda s, i: F.struct(s.alias(PREMISE), F.lit(CONTEXT_SOURCE).alias(SOURCE), i.alias(ORD)),
    )
    from_steps = F.transform(
        # relevant: every earlier conclusion here; the kept ORDs below choose among them and the sentences.
        earlier if cfg.inter_history == RELEVANT else _history(earlier, cfg.inter_history, INTER_KEPT),
        lambda c: F.struct(
            c[S.CONCLUSION_RCU].alias(PREMISE),
            F.concat(F.lit("step:"), c[S.STEP_IDX].cast("string")).alias(SOURCE),
            (F.size(sentences) + c[S.STEP_IDX]).alias(ORD),
        ),
    )
    inter = F.concat(from_context, from_steps)
    if cfg.inter_history == RELEVANT:
        inter = F.when(F.col(INTER_KEPT).isNull(), inter).otherwise(
            F.filter(inter, lambda c: F.array_contains(F.col(INTER_KEPT), c[ORD]))
        )
    return df.select(
        *KEYS,
        F.col(S.CONCLUSION_RCU).alias(HYPOTHESIS),
        F.when(F.size(intra_parts) > 0, F.array_join(intra_parts, " and ")).alias(SS.INTRA_PREMISE),
        inter.alias("_inter"),
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


def embedder(ref: ModelRef, rt: RuntimeSettings) -> candidates.EmbedFactory:
    """The sentence encoder `ref` (models.embedding) as a worker-side factory (device, batch size from config)."""
    return candidates.model_embedder(
        ref.path,
        ref.revision,
        device=rt.device,
        batch_size=rt.batch_size,
        threads=rt.torch_threads,
        trust_remote_code=rt.trust_remote_code,
        cache_size=rt.model_cache_size,
    )


def check_models(settings: Settings) -> str:
    """Before any table is touched: the NLI model (its resolved path returned) and, when a `relevant` option
    picks premises by embedding, the sentence encoder; a missing one raises runtime.ModelUnavailable."""
    resolved = runtime.check_available(settings.models.nli.path, "nli")
    if settings.nli.uses_embedding():
        runtime.check_available(settings.models.embedding.path, "embedding")
    return resolved


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
    embed: candidates.EmbedFactory | None = None,
    embedding: ModelRef | None = None,
) -> Plan:
    """`embed` replaces the sentence encoder `embedding` (models.embedding; None: its default) of the relevant
    options by a factory returning `embed(texts) -> (n, d)`."""
    if embed is None and cfg.uses_embedding():
        embed = embedder(embedding or ModelsSettings().embedding, rt)
    premises = step_premises(steps, contexts, cfg, embed)
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
    embed: candidates.EmbedFactory | None = None,
    embedding: ModelRef | None = None,
    accumulators: Sequence = (),
) -> DataFrame:
    """steps (schemas.steps.SCHEMA) + contexts (CONTEXTS_SCHEMA) -> OUTPUT_SCHEMA: NLI_SCHEMA + config_hash, error.

    `model` is models.nli; `predict` replaces it by a factory returning `predict(premises, hypotheses)`.
    `embedding` is models.embedding (the relevant options' encoder); `embed` replaces it by a factory returning
    `embed(texts) -> (n, d)`. `accumulators`: optional Spark accumulators of the pairs given to the model (and the
    truncated ones), as udfs.nli.nli_udf counts them.
    """
    return plan(steps, contexts, cfg, model, rt, predict, accumulators, embed, embedding).result


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
    embed: candidates.EmbedFactory | None = None,
) -> dict[str, int]:
    """Score the steps of settings.scoring_hash() into `step_scores`; failed steps into `quarantine`."""
    ref = settings.models.nli
    # Before any table is read or written: a missing model must not leave a partial table.
    resolved = check_models(settings) if embed is None else runtime.check_available(ref.path, "nli")
    revision = model_revision(ref, resolved)
    config_hash = settings.scoring_hash()
    steps = tables.read(spark, settings.table("steps"), S.SCHEMA).where(F.col(S.CONFIG_HASH) == config_hash)
    contexts = tables.read(spark, settings.table("contexts"), S.CONTEXTS_SCHEMA).where(
        F.col(S.CONFIG_HASH) == config_hash
    )
    # Counts what the model was actually given (a recomputed partition would count twice: visible here).
    sent = spark.sparkContext.accumulator(0)
    p = plan(steps, contexts, settings.nli, ref, settings.runtime, predict, (sent,), embed, settings.models.embedding)
    # The model runs once: the distinct scored pairs are cached and both counts and scores read them.
    with tables.Held() as hold:
        if settings.nli.uses_embedding():
            # The selection (an encoder pass per long chain) feeds the pairs, the scores and the counts: held
            # before the scored pairs are, so every later plan reads it instead of embedding again.
            hold(p.premises)
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
