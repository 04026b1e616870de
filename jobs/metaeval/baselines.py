"""`chains` -> `baseline_scores`: ROSCOE-SA/SS (MiniLM embeddings), ROSCOE-LI (NLI), ROSCOE-REP and ROUGE-2.

The scores land in a long table (chain_id, metric, score) that `meta_eval` reads beside `chain_scores`, so
baselines and ReCEval go through the same Somers' D code and sit side by side in one table. With
`baselines.per_step`, the per-step forms of five of them (schemas/metrics.py, step_baseline_scores) also land in
`step_baseline_scores` (chain_id, step_idx, metric, score), which the localisation job evaluates beside the ReCEval
step scores (`localise.step_baselines`); both come from the same model calls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import ModelsSettings, RuntimeSettings, Settings
from jobs.infra.stage import Job, Stage
from jobs.metaeval.settings import BaselineSettings
from jobs.receval.settings import NliSettings
from schemas import baseline_scores as B
from schemas import chains as C
from udfs import roscoe

log = logging.getLogger(__spec__.name)

KEYS = [B.CHAIN_ID, B.METRIC]
# step_idx null: a chain score; set: a per-step score (baselines.per_step)
_OUT = "chain_id string, step_idx int, metric string, score double, model string"


class Scored(NamedTuple):
    chains: DataFrame  # baseline_scores rows
    steps: DataFrame  # step_baseline_scores rows (none unless baselines.per_step)

EmbedFactory = Callable[[], roscoe.Embedder]
ContradictFactory = Callable[[], roscoe.ContradictFn]


def _sentencizer() -> Any:
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    return nlp


def sentences(text: str | None, nlp: Any) -> list[str]:
    if not text or not text.strip():
        return []
    return [s.text.strip() for s in nlp(text).sents if s.text.strip()]


def embed_factory(cfg: BaselineSettings, models: ModelsSettings, rt: RuntimeSettings) -> EmbedFactory:
    ref = models.embedding

    def factory() -> roscoe.Embedder:
        from udfs import runtime

        device = runtime.task_device(rt.device)
        # fp32 whatever runtime.dtype says: cosine scores are compared across chains, bf16 noise would tie them.
        model, tokenizer = runtime.load_model(ref.path, "embedding", device, "fp32", ref.revision)
        return roscoe.Embedder(model, tokenizer, cfg.batch_size, cfg.max_length)

    return factory


def contradict_factory(nli_cfg: NliSettings, models: ModelsSettings,
                       rt: RuntimeSettings) -> ContradictFactory:
    # The scoring job's predictor: the nli section's batch size and max length reach these calls too.
    from jobs.receval.nli_scores import predictor
    from udfs import nli

    make = predictor(nli_cfg, models.nli, rt)

    def factory() -> roscoe.ContradictFn:
        predict = make()
        return lambda premises, hypotheses: nli.as_output(predict(premises, hypotheses), len(premises)).probs[:, 2]

    return factory


def score_batch(pdf: pd.DataFrame, groups: list[str], reference_based: bool, nlp: Any,
                embed: roscoe.Embedder | None, contradict: roscoe.ContradictFn | None,
                names: dict[str, str], per_step: bool = False) -> pd.DataFrame:
    """Chains (pandas) -> long score rows (step_idx null for a chain score). Plain Python: the unit the Spark job
    maps over partitions. Per-step rows only for chains given as a steps list: a chain split here from its text
    has no step index the lake shares."""
    parsed = []
    for row in pdf.itertuples(index=False):
        given = row.steps is not None and len(row.steps) > 0
        steps = list(row.steps) if given else sentences(row.chain_text, nlp)
        gold = list(row.gold_steps) if row.gold_steps is not None and len(row.gold_steps) else None
        parsed.append((row.chain_id, steps, sentences(row.context, nlp), gold, per_step and given))
    out: list[tuple[str, int | None, str, float | None, str]] = []

    def add_steps(cid: str, values: dict[str, np.ndarray], model: str) -> None:
        for metric, per in values.items():
            out.extend((cid, t, metric, float(v), model) for t, v in enumerate(per))

    if embed is not None and ({"sa", "ss"} & set(groups)):
        embedded = roscoe.chain_embeddings(embed, [(s, x, g) for _, s, x, g, _ in parsed])
        for (cid, steps, context, _, stepwise), emb in zip(parsed, embedded, strict=True):
            if not steps or not context:
                continue
            for metric, value in roscoe.embedding_scores(emb, reference_based).items():
                family = metric.split("_")[1]
                if family in groups:
                    out.append((cid, None, metric, value, names["embedding"]))
            if stepwise:
                add_steps(cid, {m: v for m, v in roscoe.step_embedding_scores(emb).items()
                                if m.split("_")[1] in groups}, names["embedding"])
    if contradict is not None and "li" in groups:
        for cid, steps, context, _, stepwise in parsed:
            if steps:
                per = roscoe.step_nli_scores(steps, context, contradict)  # the chain scores are their minima
                for metric, value in roscoe.chain_scores(per).items():
                    out.append((cid, None, metric, value, names["nli"]))
                if stepwise:
                    add_steps(cid, per, names["nli"])
    if "rouge" in groups:
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)
        for cid, steps, _, gold, _ in parsed:
            if gold and steps:
                out.append((cid, None, "rouge2", roscoe.rouge2(steps, gold, scorer), "rouge-score"))
    frame = pd.DataFrame(out, columns=["chain_id", "step_idx", "metric", "score", "model"])
    frame["step_idx"] = frame["step_idx"].astype("Int32")
    frame["score"] = frame["score"].astype(float)
    return frame


def transform(chains: DataFrame, cfg: BaselineSettings, models: ModelsSettings, rt: RuntimeSettings,
              nli_cfg: NliSettings, embed: EmbedFactory | None = None,
              contradict: ContradictFactory | None = None) -> DataFrame:
    """`chains` -> long score rows (`_OUT` + computed_at; `split` parts them). Factories run inside the workers
    (models load once per worker); `nli_cfg` sizes the NLI model's calls as the scoring job's."""
    groups = list(cfg.groups)
    embed = embed or (embed_factory(cfg, models, rt) if {"sa", "ss"} & set(groups) else None)
    contradict = contradict or (contradict_factory(nli_cfg, models, rt) if "li" in groups else None)
    names = {"embedding": models.embedding.path, "nli": models.nli.path}
    reference_based, per_step = cfg.reference_based, cfg.per_step

    def score(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        nlp = _sentencizer()
        embedder = embed() if embed else None
        contra = contradict() if contradict else None
        for pdf in batches:
            yield score_batch(pdf, groups, reference_based, nlp, embedder, contra, names, per_step)

    chosen = chains.select(C.CHAIN_ID, C.CONTEXT, C.STEPS, C.CHAIN_TEXT, C.GOLD_STEPS)
    return chosen.mapInPandas(score, _OUT).withColumn(B.COMPUTED_AT, tables.now())


def split(scored: DataFrame) -> Scored:
    """transform's rows -> (baseline_scores rows, step_baseline_scores rows)."""
    return Scored(
        tables.conform(scored.where(F.col(B.STEP_IDX).isNull()), B.SCHEMA),
        tables.conform(scored.where(F.col(B.STEP_IDX).isNotNull()), B.STEP_SCHEMA),
    )


def run(spark: SparkSession, settings: Settings) -> dict[str, int]:
    chains = tables.read(spark, settings.table("chains"), C.SCHEMA)
    if settings.baselines.datasets:
        chains = chains.where(F.col(C.DATASET).isin(settings.baselines.datasets))
    if {"sa", "ss"} & set(settings.baselines.groups):
        from udfs import runtime

        runtime.check_available(settings.models.embedding.path, "embedding")
    if "li" in settings.baselines.groups:
        from udfs import runtime

        runtime.check_available(settings.models.nli.path, "nli")
    with tables.Held() as hold:
        # Held once: the chain and step rows are two filters of one scoring pass, so the models run once.
        scored = split(hold(transform(chains, settings.baselines, settings.models, settings.runtime,
                                      settings.nli)))
        chain_rows = scored.chains
        tables.upsert(spark, chain_rows, settings.table("baseline_scores"), B.SCHEMA, KEYS)
        counts = {"chains": chains.count(), "scores": chain_rows.count()}
        if settings.baselines.per_step:
            step_rows = scored.steps
            tables.upsert(spark, step_rows, settings.table("step_baseline_scores"), B.STEP_SCHEMA, B.STEP_KEYS)
            counts["step_scores"] = step_rows.count()
        for row in chain_rows.groupBy(B.METRIC).agg(F.mean(B.SCORE).alias("m")).collect():
            counts[f"mean_{row[B.METRIC]}"] = float(np.round(row["m"], 6)) if row["m"] is not None else None
    return counts


def _body(job: Job) -> dict[str, int]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    counts = run(spark, settings)
    tracked.log_metrics(counts)
    log.info(f"[baselines] {counts}")
    return counts


def _writes(settings: Settings) -> tuple[str, ...]:
    return ("baseline_scores", *(("step_baseline_scores",) if settings.baselines.per_step else ()))


STAGE = Stage("baselines", __doc__, _body, reads=("chains",), writes=_writes, section="baselines")


def main(argv: list[str] | None = None) -> dict[str, int]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
