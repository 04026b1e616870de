"""CoT Collection evaluation: evaluation files (BBH, MGSM, P3, custom JSONL) -> `cot_predictions`, `cot_metrics`.

Direct and CoT modes, as in Kim et al. 2023 and its official code (docs/design/COT_EVAL.md, docs/COT_PROTOCOL.md):
- Direct: classification scores every option (+ T5's </s>) after `source + "\\n[ANSWER] "` (examples exploded to
  one row per option, log-likelihood, argmax per example); generation compares the output with the gold (EM).
- CoT: a rationale of >= min_new_tokens after `source + "\\n\\nLet's think step by step.\\n"`, cut before the
  first "[ANSWER]"; classification scores the options after `rationale + "\\n[ANSWER] "`; generation takes the
  answer after the last "[ANSWER]".

    python -m jobs.cot.evaluate --set cot.datasets=[bbh] --set cot.max_examples_per_task=5
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StringType, StructField, StructType

from jobs.cot.data import Reject, load_examples, load_fewshot
from jobs.cot.settings import CotSettings
from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.progress import Progress, counted
from jobs.infra.stage import Job, Stage
from schemas import cot as S
from schemas import metrics as MR
from udfs import cot_text

log = logging.getLogger(__spec__.name)

QUARANTINE_STAGE = "cot_eval"
KEY = "_key"
PRED_KEYS = [S.DATASET, S.TASK, S.TEMPLATE, S.EXAMPLE_ID, S.MODE, S.MODEL, S.PROTOCOL_HASH]
METRIC_KEYS = [S.DATASET, S.MODE, S.MODEL, S.AGGREGATE, S.GROUP, S.METRIC_NAME]


@dataclass(frozen=True)
class CotUdfs:
    """The model UDFs, built once per job (a new UDF object would reload the model)."""

    options: Callable[..., Column]  # (prompt, prefix, option) -> struct(sum_logprob, n_tokens, n_bytes, ...)
    direct_generate: Callable[..., Column]  # prompt -> struct(text, n_tokens, truncated, error)
    rationale: Callable[..., Column]  # CoT classification: the rationale (options are scored after it)
    cot_generate: Callable[..., Column]  # CoT generation: rationale and answer
    # suffix -> UDF source -> struct(prompt, truncated) (the official source round trip); None: source + suffix.
    prompt: Callable[[str], Callable[..., Column]] | None = None


def generator_options(cfg: CotSettings) -> dict[str, dict[str, Any]]:
    """Keyword arguments of `udfs.generate.generate` for each of the job's three generators (official values by
    default: evaluation.py's generate calls)."""
    sampling = dict(do_sample=cfg.sample, top_p=cfg.top_p, temperature=cfg.temperature, seed=cfg.seed,
                    no_repeat_ngram_size=cfg.no_repeat_ngram_size, clean_up_spaces=True)  # fmt: skip
    return {
        "direct_generate": dict(**sampling, max_new_tokens=cfg.direct_max_new_tokens, min_new_tokens=0,
                                stop_strings=list(cfg.direct_stop)),  # fmt: skip
        "rationale": dict(**sampling, max_new_tokens=cfg.max_new_tokens, min_new_tokens=cfg.min_new_tokens,
                          stop_strings=list(cfg.indicators) if cfg.stop_at_indicator else []),  # fmt: skip
        "cot_generate": dict(**sampling, max_new_tokens=cfg.generation_max_new_tokens,
                             min_new_tokens=cfg.generation_min_new_tokens, stop_strings=[]),  # fmt: skip
    }


def build_udfs(settings: Settings) -> CotUdfs:
    from udfs.generate import generate_udf, model_generator_factory
    from udfs.options import model_options_factory, options_udf

    cfg, rt, ref = settings.cot, settings.runtime, settings.models.cot
    if ref.family not in ("causal", "seq2seq"):
        raise ValueError(f"models.cot.family must be causal or seq2seq, got {ref.family!r}")
    batch = cfg.batch_size or rt.batch_size
    length = cfg.max_length
    dtype = rt.dtype if cfg.dtype == "auto" else cfg.dtype
    common = dict(path=ref.path, family=ref.family, device=rt.device, dtype=dtype, revision=ref.revision,
                  trust_remote_code=rt.trust_remote_code, torch_threads=rt.torch_threads,
                  cache_size=rt.model_cache_size)  # fmt: skip
    gens = generator_options(cfg)

    def gen(name: str) -> Callable[..., Column]:
        # cot.max_length is the official input length (the prompt's tokens). A causal LM's new tokens share its
        # window with the prompt (udfs.generate), so its window is the input length plus the new tokens (the
        # model's own context still bounds it); with 512 for both the prompt would be cut to one token.
        window = length + gens[name]["max_new_tokens"] if ref.family == "causal" else length
        factory = model_generator_factory(**common, batch_size=batch, max_length=window,
                                          max_tokens=rt.generation_batch_tokens, **gens[name])
        return generate_udf(factory, rt.on_row_error)

    def prompt(suffix: str) -> Callable[..., Column]:
        from udfs.cot_prompt import prompt_udf

        return prompt_udf(ref.path, suffix, length, rt.trust_remote_code, cfg.chat_template, cfg.source_roundtrip)

    return CotUdfs(
        options=options_udf(
            model_options_factory(**common, batch_size=batch, max_length=length, share_prompt=cfg.share_prompt,
                                  max_tokens=rt.max_batch_tokens, eos=cfg.score_eos and ref.family == "seq2seq",
                                  move_space=cfg.causal_move_space and ref.family == "causal"),  # fmt: skip
            rt.on_row_error,
        ),
        direct_generate=gen("direct_generate"),
        rationale=gen("rationale"),
        cot_generate=gen("cot_generate"),
        prompt=prompt if cfg.source_roundtrip or cfg.chat_template else None,
    )


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


def _key() -> Column:
    # Template is null for BBH and MGSM: a plain equi-join on it would drop those rows.
    return F.concat_ws("\x1f", S.DATASET, S.TASK, F.coalesce(F.col(S.TEMPLATE), F.lit("\x00")), S.EXAMPLE_ID)


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
    base = run.keep(_prompted(examples, mode, cfg, udfs, fewshot).withColumn(KEY, _key()))
    cls = base.where(F.col(S.OPTIONS).isNotNull() & (F.size(S.OPTIONS) > 0))
    gen = base.where(F.col(S.OPTIONS).isNull() | (F.size(S.OPTIONS) == 0))
    if mode == "direct":
        (cls_pred, cls_failed), gen_pred = _direct_classification(cls, run), _direct_generation(gen, run)
    else:
        (cls_pred, cls_failed), gen_pred = _cot_classification(cls, run), _cot_generation(gen, run)
    return _split_failed(cls_pred, gen_pred, cls_failed, mode, model)


# ---- metrics (driver side: one row per group, small) -----------------------------------------------------
def _bootstrap(samples: list[np.ndarray], tasks: list[int], resamples: int, confidence: float, seed: int):
    """Percentile CI of mean over tasks of (median over the task's samples of the sample mean).

    One sample per task reduces to a mean of task means (macro); one sample to the plain mean. Samples are
    resampled independently (stratified by task/template), with scipy.stats.bootstrap.
    """
    from scipy.stats import bootstrap

    if not samples or any(len(s) < 2 for s in samples):
        return None, None
    groups = sorted(set(tasks))

    def stat(*arrays: np.ndarray, axis: int = -1) -> np.ndarray:
        means = [a.mean(axis=axis) for a in arrays]
        per_task = [np.median(np.stack([m for m, t in zip(means, tasks, strict=True) if t == g]), axis=0) for g in groups]
        return np.mean(np.stack(per_task), axis=0)

    if all(np.all(s == s[0]) for s in samples) and len({float(s[0]) for s in samples}) == 1:
        value = float(samples[0][0])  # no spread: every resample gives the same value
        return value, value
    res = bootstrap(
        tuple(samples), stat, n_resamples=resamples, confidence_level=confidence, method="percentile",
        vectorized=True, paired=False, batch=max(1, 20_000_000 // max(1, sum(len(s) for s in samples))),
        rng=np.random.default_rng(seed),
    )  # fmt: skip
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def compute_metrics(pred: pd.DataFrame, resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Predictions (dataset, task, template, mode, model, correct, numeric_correct, correct_per_*) -> metric rows.

    Per template and per task; per dataset the macro mean over tasks (a templated task counts with its
    median over templates, as T0 reports) and the micro mean over rows; bootstrap CIs beside each value.
    """
    columns = {m.name: m.source for m in MR.of_table(MR.COT_METRICS)}  # metric -> its predictions column
    out: list[dict[str, Any]] = []
    for (dataset, mode, model), part in pred.groupby([S.DATASET, S.MODE, S.MODEL], sort=True):
        for metric, column in columns.items():
            if column not in part:  # predictions from before the column existed
                continue
            rows = part[part[column].notna()]
            if rows.empty:
                continue

            def add(aggregate: str, group: str, samples: list[np.ndarray], tasks: list[int], value: float,
                    ids: tuple[str, str, str, str] = (dataset, mode, model, metric)) -> None:  # fmt: skip
                low, high = _bootstrap(samples, tasks, resamples, confidence, seed)
                dataset_, mode_, model_, metric_ = ids
                out.append({S.DATASET: dataset_, S.MODE: mode_, S.MODEL: model_, S.AGGREGATE: aggregate,
                            S.GROUP: group, S.METRIC_NAME: metric_, S.VALUE: value, S.CI_LOW: low,
                            S.CI_HIGH: high, S.N: int(sum(len(s) for s in samples))})  # fmt: skip

            samples: list[np.ndarray] = []
            owners: list[int] = []
            task_values: list[float] = []
            for t_index, (task, trows) in enumerate(rows.groupby(S.TASK, sort=True)):
                values = trows[column].astype(float).to_numpy()
                templated = trows[S.TEMPLATE].notna()
                add("task", task, [values], [0], float(values.mean()))
                if templated.any():
                    per_template = []
                    t_samples = []
                    for template, prows in trows[templated].groupby(S.TEMPLATE, sort=True):
                        v = prows[column].astype(float).to_numpy()
                        add("template", f"{task}/{template}", [v], [0], float(v.mean()))
                        per_template.append(float(v.mean()))
                        t_samples.append(v)
                    add("median_template", task, t_samples, [0] * len(t_samples), float(np.median(per_template)))
                    samples += t_samples
                    owners += [t_index] * len(t_samples)
                    task_values.append(float(np.median(per_template)))
                else:
                    samples.append(values)
                    owners.append(t_index)
                    task_values.append(float(values.mean()))
            add("macro", "*", samples, owners, float(np.mean(task_values)))
            all_values = rows[column].astype(float).to_numpy()
            add("micro", "*", [all_values], [0], float(all_values.mean()))
    return pd.DataFrame(out, columns=[f.name for f in S.METRICS_SCHEMA.fields if f.name not in (S.RUN_ID, S.COMPUTED_AT)])


# ---- reads and writes ------------------------------------------------------------------------------------
def metrics_frame(spark: SparkSession, metrics: pd.DataFrame, run_id: str | None) -> DataFrame:
    schema = StructType([f for f in S.METRICS_SCHEMA.fields if f.name not in (S.RUN_ID, S.COMPUTED_AT)])
    records = [
        tuple(None if isinstance(v, float) and np.isnan(v) else v for v in row)
        for row in metrics[schema.fieldNames()].itertuples(index=False, name=None)
    ]
    df = spark.createDataFrame(records, schema)
    return df.withColumn(S.RUN_ID, F.lit(run_id).cast("string")).withColumn(S.COMPUTED_AT, tables.now())


def examples_frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    frame = pd.DataFrame(rows, columns=S.EXAMPLE_SCHEMA.fieldNames())
    return spark.createDataFrame(frame, S.EXAMPLE_SCHEMA)


def _reject_rows(spark: SparkSession, rejects: list[Reject], run_id: str | None) -> DataFrame:
    data = [(r.reason, r.detail, r.raw, r.source) for r in rejects]
    df = spark.createDataFrame(data, "reason string, detail string, raw string, source string")
    return tables.quarantine_rows(
        df, "cot_load", F.col("reason"), F.col("detail"), raw=F.col("raw"), source=F.col("source"), run_id=run_id
    )


def protocol_hash(settings: Settings) -> str:
    """Fingerprint of what makes a prediction: the protocol keys, the seed, loader choices and the model."""
    import hashlib
    import json

    from jobs.cot.settings import OFFICIAL_COT

    cfg, ref = settings.cot, settings.models.cot
    keyed = {k: getattr(cfg, k) for k in OFFICIAL_COT}
    keyed |= {"protocol": cfg.protocol, "seed": cfg.seed, "causal_move_space": cfg.causal_move_space,
              "bbh_option_style": cfg.bbh_option_style, "family": ref.family, "revision": ref.revision}  # fmt: skip
    keyed |= cfg.fewshot_keys()  # empty when zero-shot: fingerprints stored before few-shot existed still match
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()[:16]


def example_key(row: dict[str, Any]) -> str:
    """The driver-side twin of `_key()` (same separator and null template)."""
    template = row[S.TEMPLATE] if row[S.TEMPLATE] is not None else "\x00"
    return "\x1f".join([row[S.DATASET], row[S.TASK], template, row[S.EXAMPLE_ID]])


def _done_keys(spark: SparkSession, path: str, mode: str, model: str, fingerprint: str) -> set[str]:
    """Keys of the examples this (mode, model, protocol) already has predictions for: a resumed run skips them."""
    if not tables.exists(spark, path):
        return set()
    df = spark.read.format("delta").load(path)
    if S.PROTOCOL_HASH not in df.columns:
        return set()
    mine = df.where((F.col(S.MODE) == mode) & (F.col(S.MODEL) == model) & (F.col(S.PROTOCOL_HASH) == fingerprint))
    return {r[0] for r in mine.select(_key()).collect()}


def _stored_predictions(spark: SparkSession, path: str, model: str, fingerprint: str, modes: Sequence[str],
                        keys: set[str]) -> pd.DataFrame:  # fmt: skip
    """This run's examples' predictions as stored (made now or by the run that was resumed), for the metrics."""
    if not tables.exists(spark, path) or not keys:
        return pd.DataFrame()
    df = spark.read.format("delta").load(path)
    mine = df.where((F.col(S.MODEL) == model) & (F.col(S.PROTOCOL_HASH) == fingerprint) & F.col(S.MODE).isin(list(modes)))
    frame = mine.select(_key().alias(KEY), S.DATASET, S.TASK, S.TEMPLATE, S.MODE, S.MODEL, S.CORRECT,
                        S.NUMERIC_CORRECT, S.CORRECT_PER_TOKEN, S.CORRECT_PER_BYTE, S.CHANCE).toPandas()  # fmt: skip
    return frame[frame[KEY].isin(keys)].drop(columns=[KEY]).reset_index(drop=True)


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
        done = _done_keys(spark, path, mode, model, fingerprint) if cfg.resume else set()
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
                        # Nullable keys (template): `=` never matches a null, so a rerun would add those rows again.
                        tables.upsert(spark, pred, path, S.PREDICTIONS_SCHEMA, PRED_KEYS, null_safe=PRED_KEYS)
                        if k_failed:
                            tables.append_quarantine(
                                spark,
                                settings,
                                tables.quarantine_rows(
                                    failed, QUARANTINE_STAGE, F.col("_reason"), F.col("_error"), chain_id=_key(),
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
    frame = _stored_predictions(spark, path, model, fingerprint, cfg.modes, {example_key(r) for r in rows})
    metrics = compute_metrics(frame, cfg.bootstrap_resamples, cfg.confidence, cfg.seed) if not frame.empty else None
    if metrics is not None and not metrics.empty:
        mdf = metrics_frame(spark, metrics, run_id)
        tables.upsert(spark, mdf, settings.table("cot_metrics"), S.METRICS_SCHEMA, METRIC_KEYS)
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
