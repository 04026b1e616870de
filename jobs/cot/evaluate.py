"""CoT Collection evaluation: evaluation files (BBH, MGSM, P3, custom JSONL) -> `cot_predictions`, `cot_metrics`.

Direct and CoT modes, as in Kim et al. 2023 and its official code (docs/design/COT_EVAL.md, docs/COT_PROTOCOL.md):
- Direct: classification scores every option (+ T5's </s>) after `source + "\\n[ANSWER] "` (examples exploded to
  one row per option, log-likelihood, argmax per example); generation compares the output with the gold (EM).
- CoT: a rationale of >= min_new_tokens after `source + "\\n\\nLet's think step by step.\\n"`, cut before the
  first "[ANSWER]"; classification scores the options after `rationale + "\\n[ANSWER] "`; generation takes the
  answer after the last "[ANSWER]".
This module holds the modes and the stage that runs them; the model UDFs are built by jobs/cot/model_udfs.py, the
metrics computed by jobs/cot/metrics.py, the tables keyed, read and written by jobs/cot/storage.py.

    python -m jobs.cot.evaluate --set cot.datasets=[bbh] --set cot.max_examples_per_task=5
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StringType, StructField, StructType

from jobs.cot.data import Reject, load_examples, load_fewshot
from jobs.cot.metrics import compute_metrics
from jobs.cot.model_udfs import CotUdfs, build_udfs
from jobs.cot.settings import CotSettings
from jobs.cot.storage import (
    KEY,
    done_keys,
    example_key,
    examples_frame,
    key_column,
    protocol_hash,
    stored_predictions,
    write_metrics,
    write_predictions,
)
from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.progress import Progress, counted
from jobs.infra.stage import Job, Stage
from schemas import cot as S
from udfs import cot_text

log = logging.getLogger(__spec__.name)

QUARANTINE_STAGE = "cot_eval"


# ---- text rules as column functions ----------------------------------------------------------------------
_JUDGED = StructType(
    [StructField("correct", BooleanType()), StructField("numeric", BooleanType())]
)


def _judge(is_generation: bool) -> Callable[..., Column]:
    @F.pandas_udf(_JUDGED)
    def judge(prediction: pd.Series, gold: pd.Series) -> pd.DataFrame:
        correct = [cot_text.exact_match(p, g) for p, g in zip(prediction, gold, strict=True)]
        numeric = [cot_text.numeric_match(p, g) if is_generation else None for p, g in zip(prediction, gold, strict=True)]
        return pd.DataFrame({"correct": correct, "numeric": pd.array(numeric, dtype="boolean")})

    return judge


def _rationale_of(indicators: Sequence[str]) -> Callable[..., Column]:
    @F.pandas_udf(StringType())
    def rationale(text: pd.Series) -> pd.Series:
        return pd.Series([None if t is None else cot_text.rationale_of(t, indicators) for t in text])

    return rationale


def _answer_of(indicators: Sequence[str], until: Sequence[str] = ()) -> Callable[..., Column]:
    @F.pandas_udf(StringType())
    def answer(text: pd.Series) -> pd.Series:
        return pd.Series([None if t is None else cot_text.extract_answer(t, indicators, until) for t in text])

    return answer


def _fewshot_of(fewshot: Mapping[tuple[str, str], tuple[str, str]]) -> Callable[..., Column]:
    """(dataset, task, source) -> the few-shot prompt, or null for a (dataset, task) without exemplars."""
    from udfs.cot_fewshot import fewshot_prompt

    @F.pandas_udf(StringType())
    def prompt(dataset: pd.Series, task: pd.Series, source: pd.Series) -> pd.Series:
        out = []
        for d, t, src in zip(dataset, task, source, strict=True):
            frame = fewshot.get((d, t))
            out.append(None if frame is None else fewshot_prompt(frame[0], src or "", frame[1]))
        return pd.Series(out, dtype=object)

    return prompt


# ---- the pure core ---------------------------------------------------------------------------------------
def _argmax(scores: Column, field: str) -> Column:
    # Highest score wins; a tie goes to the first option (-idx larger), as udfs.cot_text.pick_option.
    return F.array_max(F.transform(scores, lambda s: F.struct(s[field], -s["idx"], s["option"])))["option"]


def score_classification(df: DataFrame, options_udf: Callable[..., Column], score: str, partitions: int) -> DataFrame:
    """Rows with KEY, prompt, prefix, options -> KEY, option_scores, the three argmax options, truncated, error.

    One row per (example, option), scored by the shared-prompt UDF (an example's rows kept adjacent), then
    gathered back per example.
    """
    exploded = (
        df.select(KEY, S.PROMPT, "prefix", F.posexplode(S.OPTIONS).alias("idx", "option"))
        .repartition(partitions, KEY)
        .sortWithinPartitions(KEY, "idx")
    )
    scored = exploded.withColumn("s", options_udf(S.PROMPT, "prefix", "option"))
    n_tok = F.col("s.n_tokens")
    per_token = F.when(n_tok > 0, F.col("s.sum_logprob") / n_tok).otherwise(F.lit(0.0))
    per_byte = F.when(F.col("s.n_bytes") > 0, F.col("s.sum_logprob") / F.col("s.n_bytes")).otherwise(F.lit(0.0))
    gathered = scored.groupBy(KEY).agg(
        F.array_sort(
            F.collect_list(
                F.struct(
                    F.col("idx"),
                    F.col("option"),
                    F.col("s.sum_logprob").alias("sum_logprob"),
                    per_token.alias("per_token"),
                    per_byte.alias("per_byte"),
                    n_tok.alias("n_tokens"),
                )
            )
        ).alias("_scores"),
        F.max(F.col("s.truncated").cast("int")).cast("boolean").alias("_opt_truncated"),
        F.first(F.col("s.error"), ignorenulls=True).alias("_opt_error"),
    )
    fields = {"sum": "sum_logprob", "per_token": "per_token", "per_byte": "per_byte"}
    return gathered.select(
        KEY,
        F.transform(
            "_scores",
            lambda s: F.struct(
                s["option"].alias("option"),
                s["sum_logprob"].alias("sum_logprob"),
                s["per_token"].alias("per_token"),
                s["per_byte"].alias("per_byte"),
                s["n_tokens"].alias("n_tokens"),
            ),
        ).alias(S.OPTION_SCORES),
        _argmax(F.col("_scores"), fields[score]).alias("_pred"),
        _argmax(F.col("_scores"), "per_token").alias("_pred_token"),
        _argmax(F.col("_scores"), "per_byte").alias("_pred_byte"),
        "_opt_truncated",
        "_opt_error",
    )


@dataclass(frozen=True)
class _Pass:
    """What every mode's functions share: settings, model UDFs, partitions and the holder of their frames."""

    cfg: CotSettings
    udfs: CotUdfs
    partitions: int
    keep: Callable[[DataFrame], DataFrame]

    def generated(self, rows: DataFrame, udf: Callable[..., Column]) -> DataFrame:
        """`rows` with the struct `g`, `udf`'s generation from the prompt (held)."""
        # Sorted inside partitions: a rerun forms the same batches (sampled rows draw per row, so the text
        # would not change anyway; the padding, and with it the float noise, stays the same too).
        ordered = rows.repartition(self.partitions, KEY).sortWithinPartitions(KEY)
        return self.keep(ordered.withColumn("g", udf(S.PROMPT)))


def _prompted(
    examples: DataFrame, mode: str, cfg: CotSettings, udfs: CotUdfs,
    fewshot: Mapping[tuple[str, str], tuple[str, str]] | None,
) -> DataFrame:
    """Examples -> with PROMPT (the source and the mode's suffix; exemplars around CoT prompts of the tasks
    `fewshot` names) and `_src_cut` (the source was cut to fit)."""
    suffix = cfg.direct_suffix if mode == "direct" else cfg.cot_trigger
    if udfs.prompt is not None:  # official: the source truncated and round-tripped through the tokenizer
        built = examples.withColumn("_p", udfs.prompt(suffix)(F.col(S.SOURCE)))
        base = built.withColumn(S.PROMPT, F.col("_p.prompt")).withColumn("_src_cut", F.col("_p.truncated")).drop("_p")
    else:
        base = examples.withColumn(S.PROMPT, F.concat(F.col(S.SOURCE), F.lit(suffix))).withColumn("_src_cut", F.lit(False))
    if fewshot and mode == "cot":
        # lm-eval's layout, not the official round trip: the text goes to the model as written and, when too long,
        # is cut from the LEFT inside the model UDFs (the oldest exemplar goes first, the question stays; flagged).
        shot = _fewshot_of(fewshot)(F.col(S.DATASET), F.col(S.TASK), F.col(S.SOURCE))
        base = base.withColumn("_shot", shot)
        base = base.withColumn(S.PROMPT, F.coalesce(F.col("_shot"), F.col(S.PROMPT)))
        base = base.withColumn("_src_cut", F.col("_shot").isNull() & F.col("_src_cut")).drop("_shot")
    return base


# Classification: the prefix between prompt and options is empty (Direct) or rationale + join (CoT); each
# mode's function -> (predictions, rows whose rationale could not be generated).
def _direct_classification(cls: DataFrame, run: _Pass) -> tuple[DataFrame, DataFrame]:
    cls_in = cls.withColumn("prefix", F.lit("")).withColumn(S.RATIONALE, F.lit(None).cast("string"))
    cls_in = cls_in.withColumn("_gen_error", F.lit(None).cast("string")).withColumn("_gen_truncated", F.lit(False))
    return _classified(cls_in, run)


def _cot_classification(cls: DataFrame, run: _Pass) -> tuple[DataFrame, DataFrame]:
    drafted = run.generated(cls, run.udfs.rationale)
    cls_in = (
        drafted.withColumn(S.RATIONALE, _rationale_of(run.cfg.indicators)(F.col("g.text")))
        .withColumn("prefix", F.concat(F.coalesce(F.col(S.RATIONALE), F.lit("")), F.lit(run.cfg.answer_join)))
        .withColumn("_gen_error", F.col("g.error"))
        .withColumn("_gen_truncated", F.coalesce(F.col("g.truncated"), F.lit(False)))
        .drop("g")
    )
    return _classified(cls_in, run)


def _classified(cls_in: DataFrame, run: _Pass) -> tuple[DataFrame, DataFrame]:
    """Rows with their prefix, rationale, `_gen_error` and `_gen_truncated` -> the options scored after the
    prefix and judged (PREDICTIONS_SCHEMA's columns + `_error`), and the rows whose rationale failed."""
    ok_cls = cls_in.where(F.col("_gen_error").isNull())
    scored = run.keep(score_classification(ok_cls, run.udfs.options, run.cfg.score, run.partitions))
    cls_out = ok_cls.join(scored, KEY)
    judge_cls = _judge(False)
    cls_pred = (
        cls_out.withColumn("_j", judge_cls(F.col("_pred"), F.col(S.GOLD)))
        .withColumn("_jt", judge_cls(F.col("_pred_token"), F.col(S.GOLD)))
        .withColumn("_jb", judge_cls(F.col("_pred_byte"), F.col(S.GOLD)))
        .select(
            *[F.col(c) for c in S.EXAMPLE_SCHEMA.fieldNames()],
            F.col(S.PROMPT),
            F.col(S.RATIONALE),
            F.col("_pred").alias(S.PREDICTION),
            F.col("_j.correct").alias(S.CORRECT),
            F.lit(None).cast("boolean").alias(S.NUMERIC_CORRECT),
            F.col("_jt.correct").alias(S.CORRECT_PER_TOKEN),
            F.col("_jb.correct").alias(S.CORRECT_PER_BYTE),
            F.col(S.OPTION_SCORES),
            (F.col("_gen_truncated") | F.col("_src_cut") | F.coalesce(F.col("_opt_truncated"), F.lit(False))).alias(
                S.TRUNCATED
            ),
            F.col("_opt_error").alias("_error"),
            (F.lit(1.0) / F.size(S.OPTIONS)).alias(S.CHANCE),
        )
    )
    cls_failed = cls_in.where(F.col("_gen_error").isNotNull()).select(
        *S.EXAMPLE_SCHEMA.fieldNames(), F.col("_gen_error").alias("_error"), F.lit("rationale_generation_failed").alias("_reason")
    )
    return cls_pred, cls_failed


# Generation: Direct compares the whole output; CoT takes the text after the last indicator.
def _direct_generation(gen: DataFrame, run: _Pass) -> DataFrame:
    generated = run.generated(gen, run.udfs.direct_generate)
    answer = _answer_of(())(F.col("g.text"))  # Python's strip, as the official ids_to_clean_text (F.trim keeps "\n")
    return _judged_generation(generated, answer, F.lit(None).cast("string"))


def _cot_generation(gen: DataFrame, run: _Pass) -> DataFrame:
    generated = run.generated(gen, run.udfs.cot_generate)
    answer = _answer_of(run.cfg.indicators, run.cfg.answer_until)(F.col("g.text"))
    return _judged_generation(generated, answer, F.col("g.text"))


def _judged_generation(generated: DataFrame, answer: Column, rationale: Column) -> DataFrame:
    """Rows with their generation `g` -> `answer` judged against the gold (PREDICTIONS_SCHEMA's columns and
    `_error`)."""
    judged = generated.withColumn(S.PREDICTION, answer).withColumn(S.RATIONALE, rationale)
    judged = judged.withColumn("_j", _judge(True)(F.col(S.PREDICTION), F.col(S.GOLD)))
    return judged.select(
        *[F.col(c) for c in S.EXAMPLE_SCHEMA.fieldNames()],
        F.col(S.PROMPT),
        F.col(S.RATIONALE),
        F.col(S.PREDICTION),
        F.col("_j.correct").alias(S.CORRECT),
        F.col("_j.numeric").alias(S.NUMERIC_CORRECT),
        F.lit(None).cast("boolean").alias(S.CORRECT_PER_TOKEN),
        F.lit(None).cast("boolean").alias(S.CORRECT_PER_BYTE),
        F.lit(None).cast(S.PREDICTIONS_SCHEMA[S.OPTION_SCORES].dataType).alias(S.OPTION_SCORES),
        (F.coalesce(F.col("g.truncated"), F.lit(False)) | F.col("_src_cut")).alias(S.TRUNCATED),
        F.col("g.error").alias("_error"),
        F.lit(0.0).alias(S.CHANCE),
    )


def _split_failed(
    cls_pred: DataFrame, gen_pred: DataFrame, cls_failed: DataFrame, mode: str, model: str
) -> tuple[DataFrame, DataFrame]:
    """Both kinds' predictions -> (the good ones in PREDICTIONS_SCHEMA, every failed row with `_error` and
    `_reason`)."""
    both = cls_pred.unionByName(gen_pred).withColumn(S.MODE, F.lit(mode)).withColumn(S.MODEL, F.lit(model))
    both = both.withColumn(S.PROTOCOL_HASH, F.lit(None).cast("string"))  # run() stamps the run's fingerprint
    good = both.where(F.col("_error").isNull()).drop("_error")
    failed = both.where(F.col("_error").isNotNull()).select(
        *S.EXAMPLE_SCHEMA.fieldNames(), "_error", F.lit("scoring_failed").alias("_reason")
    )
    failed = failed.unionByName(cls_failed).withColumn(S.MODE, F.lit(mode))
    return tables.conform(good, S.PREDICTIONS_SCHEMA), failed


def transform(
    examples: DataFrame, mode: str, cfg: CotSettings, model: str, udfs: CotUdfs, partitions: int,
    hold: tables.Held | None = None, fewshot: Mapping[tuple[str, str], tuple[str, str]] | None = None,
) -> tuple[DataFrame, DataFrame]:
    """Examples (EXAMPLE_SCHEMA) -> (predictions in PREDICTIONS_SCHEMA, failed rows with `_error`, `_stage`).

    Pure: no reads or writes. With `hold`, model outputs are persisted (released by the holder) so no UDF
    runs twice for a row. `fewshot` ((dataset, task) -> (prefix, suffix), `jobs.cot.data.load_fewshot`) puts
    exemplars around the CoT-mode prompts of the tasks it names; Direct prompts stay zero-shot (the exemplar
    files are CoT demonstrations).
    """
    run = _Pass(cfg, udfs, partitions, hold if hold is not None else (lambda df: df))
    base = run.keep(_prompted(examples, mode, cfg, udfs, fewshot).withColumn(KEY, key_column()))
    cls = base.where(F.col(S.OPTIONS).isNotNull() & (F.size(S.OPTIONS) > 0))
    gen = base.where(F.col(S.OPTIONS).isNull() | (F.size(S.OPTIONS) == 0))
    if mode == "direct":
        (cls_pred, cls_failed), gen_pred = _direct_classification(cls, run), _direct_generation(gen, run)
    else:
        (cls_pred, cls_failed), gen_pred = _cot_classification(cls, run), _cot_generation(gen, run)
    return _split_failed(cls_pred, gen_pred, cls_failed, mode, model)


# ---- the stage: quarantine rows, chunks, the run -------------------------------------------------------
def _reject_rows(spark: SparkSession, rejects: list[Reject], run_id: str | None) -> DataFrame:
    data = [(r.reason, r.detail, r.raw, r.source) for r in rejects]
    df = spark.createDataFrame(data, "reason string, detail string, raw string, source string")
    return tables.quarantine_rows(
        df, "cot_load", F.col("reason"), F.col("detail"), raw=F.col("raw"), source=F.col("source"), run_id=run_id
    )


def _chunks(rows: list[dict[str, Any]], size: int) -> list[tuple[str, list[list[dict[str, Any]]]]]:
    """[(progress label, chunks of <= `size` rows)]; each chunk is one Spark pass and one commit.

    A dataset larger than `size` is its own group (its progress line shows its rate and ETA); consecutive small
    datasets share a chunk (label "a+b"), since every Spark pass has a fixed cost of several seconds.
    """
    by_dataset: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_dataset.setdefault(row[S.DATASET], []).append(row)
    groups: list[tuple[str, list[list[dict[str, Any]]]]] = []
    small: list[str] = []
    pending: list[dict[str, Any]] = []
    for dataset, part in by_dataset.items():
        if len(part) > size:
            groups.append((dataset, [part[i : i + size] for i in range(0, len(part), size)]))
            continue
        if len(pending) + len(part) > size:
            groups.append(("+".join(small), [pending]))
            small, pending = [], []
        small.append(dataset)
        pending = pending + part
    if pending:
        groups.append(("+".join(small), [pending]))
    return groups


def run(
    spark: SparkSession, settings: Settings, run_id: str | None = None, udfs: CotUdfs | None = None
) -> dict[str, Any]:
    """Evaluate the configured datasets in every mode; returns counts, timings and the metrics frame.

    Work is committed per chunk of `cot.chunk_examples` examples of one dataset, so a killed run loses at most
    one chunk; with `cot.resume` (default) a rerun skips the examples whose predictions this model and protocol
    already have in `cot_predictions`. Progress (examples done, rate, ETA) is reported per mode and dataset.
    """
    from udfs.runtime import check_available

    cfg = settings.cot
    check_available(settings.models.cot.path, "cot")  # fail before any table is touched
    rows, rejects, counts = load_examples(cfg)
    fewshot = load_fewshot(cfg)  # a missing exemplar file refuses the run here, before any table is written
    if rejects:
        tables.append_quarantine(spark, settings, _reject_rows(spark, rejects, run_id))
    udfs = udfs or build_udfs(settings)
    partitions = cfg.partitions or settings.spark.shuffle_partitions
    model = settings.models.cot.path
    fingerprint = protocol_hash(settings)
    path = settings.table("cot_predictions")
    counts["protocol_hash"] = fingerprint
    for mode in cfg.modes:
        started = time.time()
        done = done_keys(spark, path, mode, model, fingerprint) if cfg.resume else set()
        todo = [r for r in rows if example_key(r) not in done]
        n_new = n_failed = n_truncated = 0
        for label, chunks in _chunks(todo, cfg.chunk_examples):
            total = sum(len(c) for c in chunks)
            with Progress(f"cot_eval {mode} {label}", total, "examples", settings.log.progress_seconds, spark) as progress:
                for chunk in chunks:
                    with tables.Held() as hold:
                        examples = hold(examples_frame(spark, chunk))
                        pred, failed = transform(examples, mode, cfg, model, udfs, partitions, hold, fewshot)
                        progress.expect(len(chunk))
                        pred = hold(counted(pred.withColumn(S.PROTOCOL_HASH, F.lit(fingerprint))))
                        failed = hold(failed)
                        k_pred, k_failed = pred.count(), failed.count()
                        n_new, n_failed = n_new + k_pred, n_failed + k_failed
                        n_truncated += pred.where(F.col(S.TRUNCATED)).count()
                        write_predictions(spark, pred, path)
                        if k_failed:
                            tables.append_quarantine(
                                spark,
                                settings,
                                tables.quarantine_rows(
                                    failed, QUARANTINE_STAGE, F.col("_reason"), F.col("_error"), chain_id=key_column(),
                                    source=F.col(S.MODE), run_id=run_id,
                                ),
                            )  # fmt: skip
                        progress.commit(len(chunk))
        resumed = len(rows) - len(todo)
        counts[f"{mode}_resumed"] = resumed
        counts[f"{mode}_predictions"] = n_new + resumed
        counts[f"{mode}_quarantined"] = n_failed
        counts[f"{mode}_truncated"] = n_truncated
        counts[f"{mode}_seconds"] = round(time.time() - started, 2)
        counts[f"{mode}_reconciled"] = int(n_new + n_failed + resumed == len(rows))
    frame = stored_predictions(spark, path, model, fingerprint, cfg.modes, {example_key(r) for r in rows})
    metrics = compute_metrics(frame, cfg.bootstrap_resamples, cfg.confidence, cfg.seed) if not frame.empty else None
    if metrics is not None and not metrics.empty:
        write_metrics(spark, settings, metrics, run_id)
    counts["metrics"] = metrics
    return counts


def protocol_line(cfg: CotSettings) -> str:
    """"protocol: official" and every departure from the official code's values, for logs and table headers."""
    departures = cfg.departures()
    named = ", ".join(f"{k}={v!r} (official {o!r})" for k, (v, o) in departures.items())
    return f"protocol: {cfg.protocol}" + (f"; departures: {named}" if named else "; no departures")


def publish_tables(settings: Settings, tracked: Any, metrics: pd.DataFrame, run_id: str | None) -> dict[str, str]:
    """The paper's tables: printed (rich), logged to MLflow (Markdown, CSV, bar chart, HTML), HTML by the lake."""
    import tempfile
    from pathlib import Path

    from jobs.cot import paper_tables as P
    from jobs.infra.config_paths import resolve_path

    tables = P.paper_tables([(settings.models.cot.path, metrics)], settings.cot.confidence)
    header = f"model: {settings.models.cot.path} ({settings.models.cot.family}); {protocol_line(settings.cot)}"
    P.print_tables(tables, header)
    note = f"{header}. {P.NOTE}"
    with tempfile.TemporaryDirectory() as tmp:
        paths = P.write(tables, Path(tmp), f"{settings.models.cot.path}, run {run_id}", note)
        for path in paths.values():
            tracked.log_file(f"cot_tables/{path.name}", path)
        folder = resolve_path(settings.paths.lake) / "_reports" / "cot"
        folder.mkdir(parents=True, exist_ok=True)
        kept = folder / f"{time.strftime('%Y%m%dT%H%M%S')}_{run_id}.html"
        kept.write_text(paths["html"].read_text())
    return {"html": str(kept)}


def _body(job: Job) -> dict[str, Any]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    line = protocol_line(settings.cot)
    (log.warning if settings.cot.departures() else log.info)(f"[cot_eval] {line}")
    tracked.set_tags({"cot.protocol": settings.cot.protocol, "cot.departures": line})
    result = run(spark, settings, tracked.local_id)
    metrics: pd.DataFrame | None = result.pop("metrics")
    tracked.log_metrics({k: v for k, v in result.items() if isinstance(v, (int, float))})
    if metrics is not None:
        top = metrics[metrics[S.AGGREGATE].isin(["macro", "micro"])]
        tracked.log_metrics(
            {f"{r[S.DATASET]}.{r[S.MODE]}.{r[S.AGGREGATE]}.{r[S.METRIC_NAME]}": r[S.VALUE] for _, r in top.iterrows()}
        )
        tracked.log_text("cot_metrics.csv", metrics.to_csv(index=False))
        result["report"] = publish_tables(settings, tracked, metrics, tracked.local_id)["html"]
    tracked.set_tags({"model": settings.models.cot.path, "family": settings.models.cot.family})
    summary = {k: v for k, v in result.items() if not k.startswith("p3_template")}
    log.info(f"[cot_eval] {summary} -> {settings.table('cot_predictions')}, {settings.table('cot_metrics')}")
    if not all(result.get(f"{m}_reconciled", 1) for m in settings.cot.modes):
        raise RuntimeError(f"cot_eval counts do not reconcile: {result}")
    return result


STAGE = Stage("cot_eval", __doc__, _body, writes=("cot_predictions", "cot_metrics", "quarantine"), section="cot")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
