"""GSM-8K questions -> k sampled chains + one greedy decode per question (JSONL for ingest), bad rows -> `quarantine`.

Chain selection as in the ReCEval paper's downstream experiment (Flan-T5-XXL, 20 samples at temperature 0.7 on
GSM-8K). A seeded choice of `sample.questions` questions from `sample.questions_path` (ROSCOE's GSM-8K test
inputs); each gets the zero-shot CoT prompt `sample.prompt` ("Q: {question}\\nA: Let's think step by step.\\n",
Kojima et al. 2022): the paper does not publish its prompt, and zero-shot needs no exemplar file (MGSM's English
GSM-8K exemplars live in another dataset and are not wired in here), k samples (`sample.k`, temperature, top_p,
seed) and one greedy decode (do_sample=False) by `sample.model` (causal or seq2seq). With `sample.chat_template`
an instruct model reads the question as a chat user turn and continues its own turn, opened with
`sample.chat_opening`. Each chain row: chain_id, dataset, question_id, context (the question), chain, answer
(`sample.answer_rule`: the last `\\boxed{}`, else the last number after the last answer indicator, outside code
blocks), gold_answer, metadata {sample_idx, greedy, temperature, top_p, top_k, seed, model, n_tokens, truncated,
chat_template}. The greedy row has greedy=true and no sample_idx: select_chains takes it as the
baseline and never as a candidate. Same settings, same chains (udfs/sampling.py).

Quarantined (stage sample_chains): question rows without text or gold answer, questions whose generation
failed, empty chains (nothing to score) and chains with undecodable bytes (U+FFFD inside; one a max_new_tokens
cut leaves at the end is dropped). Counts reconcile: questions read = chosen + bad (+ not chosen); chains =
chosen x (k + 1) = written + empty + undecodable + those of failed questions.

    python -m jobs.selection.sample_chains --set sample.questions=20 --set sample.k=5
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import RuntimeSettings, Settings
from jobs.infra.config_paths import dataset_file, resolve_path
from jobs.infra.stage import Job, Stage
from jobs.selection.settings import SampleSettings
from schemas import chains as C
from udfs import sampling

log = logging.getLogger(__spec__.name)

QUARANTINE_STAGE = "sample_chains"
# Blank as Python's str.strip() (ingest's rule) sees it: Java's \s misses \x1c-\x1f, NBSP and the Unicode spaces.
BLANK = r"^[\s\x{1c}-\x{1f}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]*$"
QUESTION_FIELDS = f"{C.QUESTION_ID} string, {C.CONTEXT} string, {C.GOLD_ANSWER} string, prompt string"


def output_folder(settings: Settings) -> str:
    cfg = settings.sample
    return str(resolve_path(cfg.output) if cfg.output else resolve_path(settings.paths.lake) / "_samples" / cfg.dataset)


def read_questions(cfg: SampleSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(questions, rejects): every line of the questions file, as {question_id, context, gold_answer, prompt} or
    as a reject {reason, detail, raw}."""
    path = dataset_file(cfg.questions_path, "sample.questions_path", "roscoe_gsm8k")
    good, bad = [], []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                bad.append({"reason": "not_json", "detail": f"line {n + 1}: {err}", "raw": line})
                continue
            question = row.get(cfg.question_field) if isinstance(row, dict) else None
            gold = sampling.gold_answer(row.get(cfg.gold_field), cfg.gold_marker) if isinstance(row, dict) else None
            if not isinstance(question, str) or not question.strip():
                bad.append({"reason": "missing_question", "detail": f"line {n + 1}: no {cfg.question_field!r}",
                            "raw": line})  # fmt: skip
            elif gold is None:
                bad.append({"reason": "missing_gold", "detail": f"line {n + 1}: no {cfg.gold_marker!r} in "
                            f"{cfg.gold_field!r}", "raw": line})  # fmt: skip
            else:
                key = str(row.get(cfg.key_field) or f"line_{n}")
                good.append({C.QUESTION_ID: key, C.CONTEXT: question.strip(), C.GOLD_ANSWER: gold,
                             "prompt": sampling.prompt_for(cfg.prompt, question)})  # fmt: skip
    return good, bad


def check_model(cfg: SampleSettings) -> None:
    """Fail on the driver, before any table is touched, when the sampler is not on this machine."""
    from udfs.runtime import ModelUnavailable, check_available

    try:
        check_available(cfg.model.path, "sample")
    except ModelUnavailable:
        raise ModelUnavailable(
            f"sample.model.path={cfg.model.path!r} is neither a local folder nor in the local Hugging Face cache; "
            "give a folder saved with save_pretrained (--set sample.model.path=/path) or pre-fill the HF cache"
        ) from None


def choose(questions: list[dict[str, Any]], cfg: SampleSettings) -> list[dict[str, Any]]:
    """A seeded choice of `cfg.questions` questions, in file order (all when None or more than there are)."""
    if cfg.questions is None or cfg.questions >= len(questions):
        return list(questions)
    picked = sorted(random.Random(cfg.seed).sample(range(len(questions)), cfg.questions))
    return [questions[i] for i in picked]


def chat_prompts(questions: list[dict[str, Any]], cfg: SampleSettings) -> bool:
    """With `sample.chat_template`, each question's prompt becomes the tokenizer's chat rendering (the question as
    the user turn, the assistant turn opened with `chat_opening`), in place. True when the template was used."""
    if not cfg.chat_template:
        return False
    from udfs.cot_prompt import has_chat_template, load_tokenizer, render_chat

    tokenizer = load_tokenizer(cfg.model.path)
    if not has_chat_template(tokenizer):
        log.warning("[%s] sample.chat_template is set but %s has no chat template: the plain sample.prompt is used",
                    QUARANTINE_STAGE, cfg.model.path)  # fmt: skip
        return False
    for q in questions:
        q["prompt"] = render_chat(tokenizer, q[C.CONTEXT], cfg.chat_opening)
    return True


def transform(questions: DataFrame, cfg: SampleSettings, rt: RuntimeSettings, draw: Any = None,
              hold: tables.Held | None = None, chat: bool = False) -> tuple[DataFrame, DataFrame]:
    """Question rows -> (chain rows in the ingest input shape, failed rows with _reason/_detail/_chain_id).

    `draw`: the UDF prompt -> struct(chains, error); None builds the configured model's (tests pass fakes).
    With `hold`, the generations are persisted: both outputs read them, and the model must run once."""
    if draw is None:
        factory = sampling.model_draw_factory(
            cfg.model.path, cfg.model.family, rt.device, rt.dtype, cfg.model.revision, rt.torch_threads,
            cache_size=rt.model_cache_size,
            k=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed, max_new_tokens=cfg.max_new_tokens,
            max_length=cfg.max_length, batch_size=cfg.batch_size, max_tokens=rt.generation_batch_tokens, top_k=cfg.top_k,
        )  # fmt: skip
        draw = sampling.draw_udf(factory, cfg.answer_indicators, rt.on_row_error, cfg.answer_rule)
    drawn = questions.withColumn("_d", draw(F.col("prompt")))
    drawn = hold(drawn) if hold is not None else drawn
    failed_q = drawn.where(F.col("_d.error").isNotNull()).select(
        C.QUESTION_ID, F.lit("generation_error").alias("_reason"), F.col("_d.error").alias("_detail"),
        F.col(C.QUESTION_ID).alias("_chain_id"), F.col("prompt"))  # fmt: skip
    chains = drawn.where(F.col("_d.error").isNull()).select(
        C.QUESTION_ID, C.CONTEXT, C.GOLD_ANSWER, F.explode("_d.chains").alias("c"))
    suffix = F.when(F.col("c.greedy"), F.lit("greedy")).otherwise(F.concat(F.lit("s"), F.col("c.sample_idx")))
    meta = {
        "sample_idx": F.col("c.sample_idx").cast("string"),
        "greedy": F.when(F.col("c.greedy"), "true").otherwise("false"),
        "temperature": F.lit(json.dumps(cfg.temperature)), "top_p": F.lit(json.dumps(cfg.top_p)), "top_k": F.lit(None if cfg.top_k is None else str(cfg.top_k)).cast("string"),
        "seed": F.lit(str(cfg.seed)), "model": F.lit(cfg.model.path), "n_tokens": F.col("c.n_tokens").cast("string"),
        "truncated": F.when(F.col("c.truncated"), "true").otherwise("false"),
        "chat_template": F.lit("true" if chat else "false"),
    }  # fmt: skip
    # The greedy row has no sample_idx: its null entry is dropped from the map rather than written as null.
    keys = F.array(*[F.lit(k) for k in meta])
    values = F.array(*meta.values())
    metadata = F.map_filter(F.map_from_arrays(keys, values), lambda k, v: v.isNotNull())
    rows = chains.select(
        F.concat_ws("-", F.col(C.QUESTION_ID), suffix).alias(C.CHAIN_ID),
        F.lit(cfg.dataset).alias(C.DATASET), C.QUESTION_ID, C.CONTEXT,
        F.col("c.text").alias("chain"), F.col("c.answer").alias(C.ANSWER), C.GOLD_ANSWER,
        metadata.alias(C.METADATA),
    )  # fmt: skip
    # Ingest would refuse these rows (empty_chain, undecodable_text): they are quarantined here, where they arise.
    text = F.coalesce(F.col("chain"), F.lit(""))
    reason = (F.when(F.regexp_like(text, F.lit(BLANK)), "empty_chain")
              .when(F.instr(text, sampling.REPLACEMENT) > 0, "undecodable_text"))  # fmt: skip
    detail = F.when(reason == "empty_chain", "the model generated no text").otherwise(
        "the generated text holds bytes that are not valid UTF-8 (U+FFFD)")
    failed_c = rows.where(reason.isNotNull()).select(
        C.QUESTION_ID, reason.alias("_reason"), detail.alias("_detail"), F.col(C.CHAIN_ID).alias("_chain_id"),
        F.to_json(F.struct(*rows.columns)).alias("prompt"))  # fmt: skip
    return rows.where(reason.isNull()), failed_q.unionByName(failed_c)


def _check_replaceable(folder: str) -> None:
    """The output folder is replaced whole: refuse one holding anything but an earlier sample (a mistyped
    sample.output must not delete a folder of other files)."""
    path = Path(folder)
    if not path.exists():
        return
    foreign = [p.name for p in path.iterdir()
               if not (p.name.startswith(("part-", "_SUCCESS", "._SUCCESS", ".part-")) and p.is_file())]
    if foreign:
        raise FileExistsError(f"sample.output={folder} holds files that are not an earlier sample ({foreign[:3]}); "
                              "name an empty or new folder")


def run(spark: SparkSession, settings: Settings, run_id: str | None = None, draw: Any = None) -> dict[str, Any]:
    cfg = settings.sample
    started = time.time()
    if draw is None:
        check_model(cfg)
    good, bad = read_questions(cfg)
    chosen = choose(good, cfg)
    chat = chat_prompts(chosen, cfg)
    out = output_folder(settings)
    with tables.Held() as hold:
        # One partition per generation batch of rows (k + 1 per question), at most one per core: each partition's
        # Python worker imports torch and loads the model, which costs more than a handful of questions.
        rows_per_question = cfg.k + 1
        batches = math.ceil(len(chosen) * rows_per_question / cfg.batch_size)
        parts = max(1, min(batches, spark.sparkContext.defaultParallelism))
        questions = spark.createDataFrame(chosen, QUESTION_FIELDS).repartition(parts)
        rows, failed = transform(questions, cfg, settings.runtime, draw, hold, chat)
        _check_replaceable(out)
        shutil.rmtree(out, ignore_errors=True)  # a rerun replaces the whole sample, never mixes two
        rows.orderBy(C.QUESTION_ID, C.CHAIN_ID).coalesce(1).write.mode("overwrite").json(out)
        written = rows.count()
        reasons = {r["_reason"]: r["n"] for r in failed.groupBy("_reason").agg(F.count(F.lit(1)).alias("n")).collect()}
        quarantine = tables.quarantine_rows(failed, QUARANTINE_STAGE, F.col("_reason"), F.col("_detail"),
                                            chain_id=F.col("_chain_id"), raw=F.col("prompt"),
                                            source=F.lit(str(resolve_path(cfg.questions_path))), run_id=run_id)
        if bad:
            rejects = spark.createDataFrame(bad, "reason string, detail string, raw string")
            quarantine = quarantine.unionByName(tables.quarantine_rows(
                rejects, QUARANTINE_STAGE, F.col("reason"), F.col("detail"), raw=F.col("raw"),
                source=F.lit(str(resolve_path(cfg.questions_path))), run_id=run_id))  # fmt: skip
        if reasons or bad:
            tables.append_quarantine(spark, settings, quarantine)
    failed_questions = reasons.get("generation_error", 0)
    empty, undecodable = reasons.get("empty_chain", 0), reasons.get("undecodable_text", 0)
    expected = len(chosen) * (cfg.k + 1)
    counts = {
        "questions_read": len(good) + len(bad), "questions_bad": len(bad), "questions_chosen": len(chosen),
        "questions_failed": failed_questions, "chains_written": written, "chains_empty": empty,
        "chains_undecodable": undecodable,
        "reconciled": int(expected == written + empty + undecodable + failed_questions * (cfg.k + 1)),
        "seconds": round(time.time() - started, 1), "output": out,
    }  # fmt: skip
    if not counts["reconciled"]:
        raise RuntimeError(f"sample_chains counts do not reconcile: {counts} (expected {expected} chains)")
    log.info("[%s] %s", QUARANTINE_STAGE, counts)
    return counts


def _body(job: Job) -> dict[str, Any]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    counts = run(spark, settings, tracked.run_id)
    tracked.log_metrics({k: v for k, v in counts.items() if isinstance(v, (int, float))})
    tracked.set_tags({"sample_output": counts["output"]})
    print(json.dumps(counts))
    return counts


STAGE = Stage("sample_chains", __doc__, _body, writes=("quarantine",), section="sample")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
