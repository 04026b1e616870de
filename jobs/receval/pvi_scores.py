"""`steps` + `contexts` -> PVI columns of `step_scores` (intra_pvi, info_gain and their parts); failures -> `quarantine`.

Per chain of n steps the job asks the LMs for three kinds of target log-likelihoods (docs/design/RECEVAL.md "Scores per
step i"; meanlogp = mean natural-log probability of the target tokens, EOS excluded):
- g:    meanlogp_g(" " + conclusion | "Generate entailed sentence: " + " & ".join(premises + earlier
        conclusions) + " ->"), one per step; a step with no premise text gets the official empty join
        "Generate entailed sentence:  ->" (pvi.empty_premises, docs/PVI.md);
- g':   meanlogp_g'(" " + conclusion | "Generate entailed sentence: None ->"), one per DISTINCT conclusion
        (its input is constant);
- info: L(k) = meanlogp(" " + a_hat | " " + " ".join(s(1..k)) + " Therefore,"), L(0) with " Therefore,",
        for k = 0..n: n+1 passes, not 2n; info_gain(i) = L(i) - L(i-1). With a causal LM and
        runtime.share_prefix the n+1 passes share their prefix " s(1) ... s(k)", which the scorer runs once
        (udfs.prefix_sharing.share_prefixes); so do the g' passes (one constant source).
The request strings come from one plain-Python function (`udfs.pvi_prompts.chain_requests`) shared with the
training job and the benchmark. All requests are deduplicated across the whole input before any model runs.
Every source and target is scored whole up to each model's own position limit (udfs.loglik.position_limit;
pvi.max_length is an optional lower cap); a step any of whose passes had to be cut is flagged in
`step_scores.pvi_truncated` and counted (`steps_truncated`), never cut silently (docs/PVI.md).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from jobs.infra import tables
from jobs.infra.config import ModelRef, ModelsSettings, RuntimeSettings, Settings
from jobs.infra.stage import Job, Stage
from jobs.receval import scores_table
from jobs.receval.nli_scores import embedder
from jobs.receval.settings import RELEVANT, PviSettings
from schemas import step_scores as SS
from schemas import steps as ST
from udfs import candidates, loglik
from udfs.model_paths import PVI_RECORD
from udfs.pvi_prompts import IG_CUR, IG_PREV, NULL, TRAINED_KIND, G, chain_requests

log = logging.getLogger(__spec__.name)

ERROR = "error"  # null when every score of the step came back; read by jobs.receval.score and `run`
TRUNCATED = SS.PVI_TRUNCATED  # some source or target of the step's passes was cut to the model's limit
QUARANTINE_STAGE = "pvi"

# A fake LM for tests: scorer(role, sources, targets) -> list[TargetScore], role in pvi_g|pvi_null|info_gain.
Scorer = Callable[[str, Sequence[str], Sequence[str]], Sequence[loglik.TargetScore]]


# --- Spark --------------------------------------------------------------------------------------------------

_REQUESTS = StructType(
    [
        StructField(ST.CHAIN_ID, StringType(), False),
        StructField(ST.CONFIG_HASH, StringType(), False),
        StructField(ST.STEP_IDX, IntegerType(), False),
        StructField("kind", StringType(), False),
        StructField("role", StringType(), False),
        StructField("source", StringType(), False),
        StructField("target", StringType(), False),
    ]
)


def _requests_fn(family: str, history: str | int, empty_premises: str = "empty_join", top_k: int = 8,
                 embed: candidates.EmbedFactory | None = None):
    if history == RELEVANT and embed is None:
        raise ValueError("pvi.intra_history=relevant needs an embed factory")
    encoder = candidates.once(embed) if embed is not None else None  # built only when a chain has a step over top_k

    def build(chain: pd.DataFrame) -> pd.DataFrame:
        chain = chain.sort_values(ST.STEP_IDX)
        idx = chain[ST.STEP_IDX].tolist()
        answer = chain[ST.ANSWER].iloc[0]
        answer = None if answer is None or (isinstance(answer, float) and pd.isna(answer)) else str(answer)
        premises = [list(p) if p is not None else [] for p in chain[ST.PREMISE_RCUS]]
        conclusions = chain[ST.CONCLUSION_RCU].tolist()
        kept = None
        if history == RELEVANT:  # the rule nli.intra_history=relevant applies, on the same conclusions
            vectors = (candidates.embed_texts(encoder(), conclusions)
                       if candidates.intra_needs_embeddings(conclusions, top_k) else None)
            kept = candidates.intra_relevant(conclusions, vectors, top_k)
        reqs = chain_requests(
            chain[ST.STEP_TEXT].tolist(), premises, conclusions, answer, family, history, empty_premises, kept,
        )
        return pd.DataFrame(
            {
                ST.CHAIN_ID: chain[ST.CHAIN_ID].iloc[0],
                ST.CONFIG_HASH: chain[ST.CONFIG_HASH].iloc[0],
                ST.STEP_IDX: [idx[r.step_idx] for r in reqs],
                "kind": [r.kind for r in reqs],
                "role": [r.role for r in reqs],
                "source": [r.source for r in reqs],
                "target": [r.target for r in reqs],
            },
            columns=_REQUESTS.fieldNames(),
        )

    return build


def requests(steps: DataFrame, contexts: DataFrame, cfg: PviSettings, models: ModelsSettings,
             rt: RuntimeSettings | None = None, embed: candidates.EmbedFactory | None = None) -> DataFrame:
    """One row per (step, kind) with the model role and the exact source/target strings.

    With pvi.intra_history=relevant, `embed` (a factory of `embed(texts) -> (n, d)`; None: models.embedding) picks
    the earlier conclusions of g's source."""
    if embed is None and cfg.intra_history == RELEVANT:
        embed = embedder(models.embedding, rt or RuntimeSettings())
    joined = steps.select(
        ST.CHAIN_ID, ST.CONFIG_HASH, ST.STEP_IDX, ST.STEP_TEXT, ST.PREMISE_RCUS, ST.CONCLUSION_RCU
    ).join(contexts.select(ST.CHAIN_ID, ST.CONFIG_HASH, ST.ANSWER), [ST.CHAIN_ID, ST.CONFIG_HASH], "left")
    build = _requests_fn(info_gain_family(cfg, models), cfg.intra_history, cfg.empty_premises, cfg.intra_top_k, embed)
    return joined.groupBy(ST.CHAIN_ID, ST.CONFIG_HASH).applyInPandas(build, _REQUESTS)


def info_gain_family(cfg: PviSettings, models: ModelsSettings) -> str:
    family = cfg.info_gain_family
    if models.info_gain.family != family:
        raise ValueError(
            f"pvi.info_gain_family={family!r} but models.info_gain.family={models.info_gain.family!r}: "
            "set both to the same family"
        )
    return family


def model_id(ref: ModelRef) -> str:
    return ref.path if not ref.revision else f"{ref.path}@{ref.revision}"


def _bound(scorer: Scorer, role: str) -> loglik.TargetScoreFn:
    return functools.partial(scorer, role)


def _factories(cfg: PviSettings, models: ModelsSettings, rt: RuntimeSettings,
               scorer: Scorer | None) -> dict[str, Callable[[], loglik.TargetScoreFn]]:
    refs = {"pvi_g": models.pvi_g, "pvi_null": models.pvi_null, "info_gain": models.info_gain}
    if scorer is not None:
        return {role: functools.partial(_bound, scorer, role) for role in refs}
    batch_size = cfg.batch_size or rt.batch_size
    # None: each model's own position limit, read from its config on the worker (runtime.max_length is the
    # NLI cap and not the LMs': GPT-2 takes 1,024 positions, and a 512 cut left-truncated long chains' L(k)).
    max_length = cfg.max_length
    families = {"pvi_g": refs["pvi_g"].family, "pvi_null": refs["pvi_null"].family,
                "info_gain": info_gain_family(cfg, models)}
    return {
        role: loglik.model_scorer_factory(
            ref.path, families[role], rt.device, rt.dtype, ref.revision, batch_size, max_length,
            rt.torch_threads, rt.trust_remote_code, rt.sort_by_length, rt.share_prefix, rt.max_batch_tokens,
            rt.model_cache_size,
        )
        for role, ref in refs.items()
    }


def _parallelism(df: DataFrame) -> int:
    try:
        return max(1, df.sparkSession.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext
        return int(df.sparkSession.conf.get("spark.sql.shuffle.partitions", "8"))


def transform(steps: DataFrame, contexts: DataFrame, cfg: PviSettings, models: ModelsSettings, rt: RuntimeSettings,
              scorer: Scorer | None = None, sent: Any = None, embed: candidates.EmbedFactory | None = None) -> DataFrame:
    """(steps, contexts) -> one row per step: keys, PVI_SCHEMA scores, model ids, `pvi_truncated`, `error`. Pure.

    `scorer` replaces the LMs (tests). With runtime.on_row_error == "fail" a scoring error fails the job; with
    "quarantine" it lands in `error` and the step's scores are null. `sent`: an optional accumulator of the LM
    passes scored (the pipeline's progress shows it). `embed` replaces the sentence encoder of
    pvi.intra_history=relevant (tests).
    """
    reqs = requests(steps, contexts, cfg, models, rt, embed)
    # runtime.dedup=False scores every request (2n L(k) passes, g' per step): the join below then meets copies,
    # which the max in `pick` absorbs, so the scores are the same.
    # A distinct pass keeps the first chain that asked for it: partitioned and sorted by that chain, a chain's
    # L(k) passes reach the scorer in one batch, where runtime.share_prefix runs their common prefix once.
    # The explicit partition count keeps adaptive execution from coalescing the (few, small) pair rows into
    # one task: the model work must spread over every core. Chains differ in cost and hashing them is uneven,
    # so each core gets several partitions, which evens out the load.
    pairs = reqs.select("role", "source", "target", F.col(ST.CHAIN_ID).alias("_chain"))
    if rt.dedup:
        pairs = pairs.groupBy("role", "source", "target").agg(F.min("_chain").alias("_chain"))
    pairs = pairs.repartition(4 * _parallelism(steps), "_chain").sortWithinPartitions("_chain")
    on_error = rt.on_row_error
    scored = None
    for role, factory in _factories(cfg, models, rt, scorer).items():
        udf = loglik.loglik_udf(factory, on_error, sent)
        part = pairs.where(F.col("role") == role).withColumn("s", udf("source", "target")).drop("_chain")
        scored = part if scored is None else scored.unionByName(part)
    joined = reqs.join(scored, ["role", "source", "target"], "left")

    def pick(kind: str):
        return F.max(F.when(F.col("kind") == kind, F.col("s.mean_logprob")))

    errors = F.array_distinct(F.collect_list(F.when(F.col("s.error").isNotNull(),
                                                    F.concat(F.col("kind"), F.lit(": "), F.col("s.error")))))
    per_step = joined.groupBy(ST.CHAIN_ID, ST.CONFIG_HASH, ST.STEP_IDX).agg(
        pick(G).alias(SS.PVI_G),
        pick(NULL).alias(SS.PVI_NULL),
        pick(IG_PREV).alias(SS.IG_L_PREV),
        pick(IG_CUR).alias(SS.IG_L),
        F.max(F.coalesce(F.col("s.truncated"), F.lit(False))).alias(TRUNCATED),
        errors.alias("_errors"),
    )
    return per_step.select(
        ST.CHAIN_ID,
        ST.STEP_IDX,
        (F.col(SS.PVI_G) - F.col(SS.PVI_NULL)).alias(SS.INTRA_PVI),
        SS.PVI_G,
        SS.PVI_NULL,
        (F.col(SS.IG_L) - F.col(SS.IG_L_PREV)).alias(SS.INFO_GAIN),
        SS.IG_L_PREV,
        SS.IG_L,
        ST.CONFIG_HASH,
        F.lit(model_id(models.pvi_g)).alias(SS.PVI_MODEL),
        F.lit(model_id(models.pvi_null)).alias(SS.PVI_NULL_MODEL),
        F.lit(model_id(models.info_gain)).alias(SS.IG_MODEL),
        TRUNCATED,
        F.when(F.size("_errors") > 0, F.concat_ws("; ", "_errors")).alias(ERROR),
    )


OUTPUT_COLUMNS = [*SS.PVI_SCHEMA.fieldNames()[2:], SS.PVI_MODEL, SS.PVI_NULL_MODEL, SS.IG_MODEL, SS.PVI_TRUNCATED]


def train_command(role: str, settings: Settings) -> str:
    kind = TRAINED_KIND[role]
    profile = f" --set models.profile={settings.models.profile}" if settings.models.profile != "offline" else ""
    return f"python -m jobs.training.train_pvi{profile} --set train_pvi.kind={kind}"


def check_trained(settings: Settings) -> None:
    """With models.require_trained_pvi (the paper profile): g and g' must be train_pvi checkpoints.

    A plain T5 as g or g' scores PVI with a model that never learnt the task, and nothing in the output would say
    so: the check needs the folder train_pvi writes (weights + train_pvi.json naming the kind) and fails on the
    driver, before any table is touched, naming the command that makes it.
    """
    import json
    from pathlib import Path

    from udfs import runtime

    if not settings.models.require_trained_pvi:
        return
    # A seq2seq L(k) model answers train_pvi's "Generate final answer:" task (the small profile's); a causal
    # info-gain model is a plain LM, as in the official code, and needs no training.
    causal = settings.pvi.info_gain_family == "causal"
    for role, kind in TRAINED_KIND.items():
        if role == "info_gain" and causal:
            continue
        path = getattr(settings.models, role).path
        folder = Path(runtime.resolve_model_path(path))
        record = folder / PVI_RECORD
        found = json.loads(record.read_text()).get("kind") if record.is_file() else None
        if found == kind and (folder / "config.json").is_file():
            continue
        what = (f"{folder} holds a train_pvi model of kind {found!r}, not {kind!r}" if found is not None else
                f"{path!r} is not a trained PVI checkpoint (no folder with train_pvi.json written by train_pvi)")
        raise runtime.ModelUnavailable(
            f"models.{role}: {what}. models.require_trained_pvi is on (the {settings.models.profile} profile), so "
            f"PVI is never scored with an untrained model. Train it first: `{train_command(role, settings)}` "
            f"(writes {settings.train_pvi.output_dir}/{kind}), or set models.{role}.path to a trained checkpoint."
        )


def check_models(settings: Settings) -> None:
    """On the driver, before any table is touched: every PVI model is reachable (and trained where required)."""
    from udfs import runtime

    info_gain_family(settings.pvi, settings.models)
    check_trained(settings)
    for role in ("pvi_g", "pvi_null", "info_gain"):
        runtime.check_available(getattr(settings.models, role).path, role)
    if settings.pvi.intra_history == RELEVANT:
        runtime.check_available(settings.models.embedding.path, "embedding")


def _to_score(steps: DataFrame, spark: SparkSession, settings: Settings) -> DataFrame:
    """Steps of the current configuration whose chains have no PVI scores yet (all of them with rescore)."""
    steps = steps.where(F.col(ST.CONFIG_HASH) == settings.scoring_hash())
    path = settings.table("step_scores")
    if settings.pipeline.rescore or not tables.exists(spark, path):
        return steps
    done = (
        tables.read(spark, path)
        .where(F.col(SS.PVI_G).isNotNull())
        .select(SS.CHAIN_ID, SS.CONFIG_HASH)
        .distinct()
    )
    return steps.join(done, [ST.CHAIN_ID, ST.CONFIG_HASH], "left_anti")


def run(spark: SparkSession, settings: Settings, job=None, scorer: Scorer | None = None) -> dict[str, int]:
    """Score the steps table's PVI columns into `step_scores`; failing steps -> `quarantine` (stage pvi)."""
    if scorer is None:
        check_models(settings)
    steps = _to_score(tables.read(spark, settings.table("steps"), ST.SCHEMA), spark, settings)
    contexts = tables.read(spark, settings.table("contexts"), ST.CONTEXTS_SCHEMA)
    started = time.time()
    scored = transform(steps, contexts, settings.pvi, settings.models, settings.runtime, scorer).persist()
    try:
        n_in = steps.count()
        tally = scored.agg(
            F.count(F.lit(1)).alias("n"),
            F.count(ERROR).alias("bad"),
            F.count(F.when(F.col(TRUNCATED), 1)).alias("truncated"),
        ).first()
        n_bad, n_truncated = int(tally["bad"]), int(tally["truncated"])
        n_good = int(tally["n"]) - n_bad
        good = scored.where(F.col(ERROR).isNull())
        bad = scored.where(F.col(ERROR).isNotNull())
        # Its own group of columns: a row the NLI job (or the pipeline) wrote keeps theirs.
        scores_table.write(spark, settings, good, OUTPUT_COLUMNS)
        if n_bad:
            rows = tables.quarantine_rows(
                bad, QUARANTINE_STAGE, "scoring_error", F.col(ERROR), chain_id=F.col(SS.CHAIN_ID),
                raw=F.to_json(F.struct(SS.CHAIN_ID, SS.CONFIG_HASH, SS.STEP_IDX)),
                source=F.concat(F.lit("config_hash:"), F.col(SS.CONFIG_HASH)),
                run_id=getattr(job, "local_id", None),
            )
            tables.append_quarantine(spark, settings, rows)
    finally:
        scored.unpersist()
    counts = {"steps_in": n_in, "steps_scored": n_good, "steps_quarantined": n_bad, "steps_truncated": n_truncated}
    if n_in != n_good + n_bad:
        raise RuntimeError(f"PVI counts do not reconcile: {counts}")
    log.info(f"[pvi_scores] {counts} in {time.time() - started:.1f}s")
    if job is not None:
        job.log_metrics({**counts, "pvi_seconds": time.time() - started})
        job.set_tags({"pvi_model": model_id(settings.models.pvi_g), "pvi_null_model": model_id(settings.models.pvi_null),
                      "ig_model": model_id(settings.models.info_gain)})
    return counts


def _body(job: Job) -> dict[str, int]:
    spark, settings = job.spark, job.settings
    job.tracked.set_tags({"input_steps_version": tables.version(spark, settings.table("steps"))})
    counts = run(spark, settings, job.tracked)
    job.tracked.set_tags({"output_step_scores_version": tables.version(spark, settings.table("step_scores"))})
    return counts


STAGE = Stage(
    "pvi_scores", __doc__, _body, reads=("steps", "contexts"), writes=("step_scores", "quarantine"), section="pvi",
    # Before any session or run: an unreachable or untrained model fails with nothing touched.
    check=lambda settings, args: check_models(settings),
)


def main(argv: list[str] | None = None) -> dict[str, int]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
