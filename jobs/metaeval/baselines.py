"""`chains` -> `baseline_scores`: ROSCOE-SA/SS (MiniLM embeddings), ROSCOE-LI (NLI), ROSCOE-REP and ROUGE-2.

The scores land in a long table (chain_id, metric, score) that `meta_eval` reads beside `chain_scores`, so
baselines and ReCEval go through the same Somers' D code and sit side by side in one table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.tracking import job
from schemas import baseline_scores as B
from schemas import chains as C
from udfs import roscoe

log = logging.getLogger(__spec__.name)

KEYS = [B.CHAIN_ID, B.METRIC]
_OUT = "chain_id string, metric string, score double, model string"

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


def embed_factory(settings: Settings) -> EmbedFactory:
    ref, rt, cfg = settings.models.embedding, settings.runtime, settings.baselines

    def factory() -> roscoe.Embedder:
        from udfs import runtime

        device = runtime.task_device(rt.device)
        # fp32 whatever runtime.dtype says: cosine scores are compared across chains, bf16 noise would tie them.
        model, tokenizer = runtime.load_model(ref.path, "embedding", device, "fp32", ref.revision)
        return roscoe.Embedder(model, tokenizer, cfg.batch_size, cfg.max_length)

    return factory


def contradict_factory(settings: Settings) -> ContradictFactory:
    from udfs import nli

    ref, rt = settings.models.nli, settings.runtime
    make = nli.model_predictor(ref.path, ref.revision, rt.device, rt.dtype, rt.batch_size, rt.max_length,
                               rt.torch_threads, rt.trust_remote_code, cache_size=rt.model_cache_size)

    def factory() -> roscoe.ContradictFn:
        predict = make()
        return lambda premises, hypotheses: nli.as_output(predict(premises, hypotheses), len(premises)).probs[:, 2]

    return factory


def score_batch(pdf: pd.DataFrame, groups: list[str], reference_based: bool, nlp: Any,
                embed: roscoe.Embedder | None, contradict: roscoe.ContradictFn | None,
                names: dict[str, str]) -> pd.DataFrame:
    """Chains (pandas) -> long score rows. Plain Python: the unit the Spark job maps over partitions."""
    parsed = []
    for row in pdf.itertuples(index=False):
        steps = list(row.steps) if row.steps is not None and len(row.steps) else sentences(row.chain_text, nlp)
        gold = list(row.gold_steps) if row.gold_steps is not None and len(row.gold_steps) else None
        parsed.append((row.chain_id, steps, sentences(row.context, nlp), gold))
    out: list[tuple[str, str, float | None, str]] = []
    if embed is not None and ({"sa", "ss"} & set(groups)):
        embedded = roscoe.chain_embeddings(embed, [(s, x, g) for _, s, x, g in parsed])
        for (cid, steps, context, _), emb in zip(parsed, embedded, strict=True):
            if not steps or not context:
                continue
            for metric, value in roscoe.embedding_scores(emb, reference_based).items():
                family = metric.split("_")[1]
                if family in groups:
                    out.append((cid, metric, value, names["embedding"]))
    if contradict is not None and "li" in groups:
        for cid, steps, context, _ in parsed:
            if steps:
                for metric, value in roscoe.nli_scores(steps, context, contradict).items():
                    out.append((cid, metric, value, names["nli"]))
    if "rouge" in groups:
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)
        for cid, steps, _, gold in parsed:
            if gold and steps:
                out.append((cid, "rouge2", roscoe.rouge2(steps, gold, scorer), "rouge-score"))
    frame = pd.DataFrame(out, columns=["chain_id", "metric", "score", "model"])
    frame["score"] = frame["score"].astype(float)
    return frame


def transform(chains: DataFrame, settings: Settings, embed: EmbedFactory | None = None,
              contradict: ContradictFactory | None = None) -> DataFrame:
    """`chains` -> `baseline_scores` rows. Factories run inside the workers (models load once per worker)."""
    cfg = settings.baselines
    groups = list(cfg.groups)
    embed = embed or (embed_factory(settings) if {"sa", "ss"} & set(groups) else None)
    contradict = contradict or (contradict_factory(settings) if "li" in groups else None)
    names = {"embedding": settings.models.embedding.path, "nli": settings.models.nli.path}
    reference_based = cfg.reference_based

    def score(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        nlp = _sentencizer()
        embedder = embed() if embed else None
        contra = contradict() if contradict else None
        for pdf in batches:
            yield score_batch(pdf, groups, reference_based, nlp, embedder, contra, names)

    chosen = chains.select(C.CHAIN_ID, C.CONTEXT, C.STEPS, C.CHAIN_TEXT, C.GOLD_STEPS)
    scored = chosen.mapInPandas(score, _OUT)
    return tables.conform(scored.withColumn(B.COMPUTED_AT, F.current_timestamp()), B.SCHEMA)


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
        scores = hold(transform(chains, settings))
        tables.upsert(spark, scores, settings.table("baseline_scores"), B.SCHEMA, KEYS)
        counts = {"chains": chains.count(), "scores": scores.count()}
        for row in scores.groupBy(B.METRIC).agg(F.mean(B.SCORE).alias("m")).collect():
            counts[f"mean_{row[B.METRIC]}"] = float(np.round(row["m"], 6)) if row["m"] is not None else None
    return counts


def main(argv: list[str] | None = None) -> dict[str, int]:
    with job("baselines", __doc__, argv) as (spark, settings, tracked):
        counts = run(spark, settings)
        tracked.log_metrics(counts)
        log.info(f"[baselines] {counts}")
    return counts


if __name__ == "__main__":
    main()
