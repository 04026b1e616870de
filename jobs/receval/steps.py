"""`chains` -> `steps` (one row per step, with its RCUs) and `contexts` (X in sentences, a_hat); failures -> `quarantine`.

Step boundaries (`steps.boundary`):
- a chain that comes with a `steps` array keeps those steps (boundary recorded as "given") for every option
  but `whole`, which joins them into one step: the producer already segmented the chain (EntailmentBank
  proofs arrive rendered, one step per proof step);
- a chain given as one text is split by `sentence` (spaCy sentences; newlines are hard boundaries, since LLM
  chains list steps one per line without periods), `newline`, `paragraph` (blocks between blank lines: what a
  reasoning model writes, one step per paragraph, its equations and list lines kept inside it), or kept `whole`;
  `given` quarantines it (reason missing_steps).
RCUs: a chain that carries its own (`chains.step_rcus`, one entry per given step) keeps them as given, extractor
"given", unparsed (except under `whole`, which joins the steps and extracts); otherwise `steps.extractor` finds them
(clause units by default, docs/design/RECEVAL.md) and `steps.roles` picks the conclusion.
The context X is split the same way as `sentence` (the question is appended when the context does not
already contain it). One spaCy pass per Arrow batch (`nlp.pipe`), the pipeline loaded once per worker.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StringType, StructField, StructType

from jobs.infra import tables
from jobs.infra.config import ModelsSettings, RuntimeSettings, Settings
from jobs.infra.progress import counted
from jobs.infra.stage import Job, Stage
from jobs.receval.settings import StepsSettings
from schemas import chains as C
from schemas import steps as S
from udfs import rcu, rcu_clauses, rcu_math

log = logging.getLogger(__spec__.name)

QUARANTINE_STAGE = "steps"
_INPUT = (C.CHAIN_ID, C.CONTEXT, C.QUESTION, C.STEPS, C.CHAIN_TEXT, C.ANSWER, C.STEP_RCUS)
STEP_EXTRACTOR = "extractor"  # per step: the configured extractor's name, or "given" for units the chain carried
GIVEN = "given"
_STEP = StructType(
    [
        StructField(S.STEP_TEXT, StringType(), False),
        StructField(S.PREMISE_RCUS, ArrayType(StringType(), False), False),
        StructField(S.CONCLUSION_RCU, StringType(), False),
        StructField(S.BOUNDARY, StringType(), False),
        StructField(STEP_EXTRACTOR, StringType(), False),
    ]
)
EXTRACTED = StructType(
    [
        StructField(C.CHAIN_ID, StringType(), True),
        # JSON text: pandas -> Arrow conversion of arrays of structs fails in the UDF (ChunkedArray)
        StructField("steps", StringType(), True),
        StructField(S.CONTEXT_SENTENCES, ArrayType(StringType(), False), True),
        StructField(S.ANSWER, StringType(), True),
        StructField(S.ANSWER_RULE, StringType(), True),
        StructField("error", StringType(), True),
        StructField("detail", StringType(), True),
        StructField("raw", StringType(), True),
    ]
)


class ChainError(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class Options:
    """What a worker needs (small and picklable: shipped with the UDF closure)."""

    boundary: str
    roles: str
    extractor: str
    spacy: str
    srl_model: str | None
    device: str
    batch_size: int
    max_length: int
    indicators: tuple[str, ...]
    strip_calculator: bool
    max_steps: int = 2_000

    @classmethod
    def from_settings(cls, settings: Settings) -> Options:
        return cls.of(settings.steps, settings.models, settings.runtime)

    @classmethod
    def of(cls, st: StepsSettings, models: ModelsSettings, rt: RuntimeSettings) -> Options:
        if st.extractor == "srl" and not st.srl_model:
            raise ValueError("steps.extractor=srl needs steps.srl_model (a token-classification model path)")
        return cls(
            st.boundary,
            st.roles,
            st.extractor,
            models.spacy,
            st.srl_model,
            rt.device,
            st.batch_size,
            rt.max_length,
            tuple(st.answer_indicators),
            st.strip_calculator,
            st.max_steps,
        )

    @property
    def extractor_name(self) -> str:
        return f"srl:{self.srl_model}" if self.extractor == "srl" else f"{self.extractor}:{self.spacy}"


def _units_fn(opts: Options) -> Callable[[Any], list[rcu.Rcu]]:
    """doc or span -> its RCUs, by the configured extractor."""
    if opts.extractor == "clauses":
        return rcu_clauses.clause_units
    frames_of = _frames_fn(opts)
    return lambda span: rcu.rcus_of(span, frames_of)


def _frames_fn(opts: Options) -> Callable[[Any], list[rcu.Frame]]:
    if opts.extractor == "spacy":
        return rcu.spacy_frames
    from udfs import runtime

    model, tokenizer = runtime.load_model(opts.srl_model, "srl", device=runtime.task_device(opts.device))

    def frames(sent: Any) -> list[rcu.Frame]:
        return rcu.srl_frames(sent, model, tokenizer, opts.max_length)

    return frames


Units = tuple[list[str], str]  # given (premise RCUs, conclusion RCU) of one step
Planned = tuple[str, str, bool, Units | None]  # step text, boundary, split into sentences?, given units


def _given_units(record: dict[str, Any], n_steps: int) -> list[Units] | None:
    """The chain's own RCUs per step (chains.step_rcus), or None; they must match the steps one for one."""
    given = record.get(C.STEP_RCUS)
    if given is None:
        return None
    units = []
    for item in given:
        item = item.asDict() if hasattr(item, "asDict") else item
        premises = item.get(C.RCU_PREMISES)
        units.append(([str(p) for p in (premises.tolist() if hasattr(premises, "tolist") else premises or [])],
                      str(item.get(C.RCU_CONCLUSION) or "")))
    if len(units) != n_steps:
        raise ChainError("bad_step_rcus", f"{len(units)} given RCU entries for {n_steps} steps")
    return units


def _plan(record: dict[str, Any], opts: Options) -> tuple[list[Planned], list[str]]:
    """(steps: (text, boundary, split into sentences?, given units or None), context lines). Only steps without
    given units are parsed."""
    clean = lambda t: rcu.clean_text(t, opts.strip_calculator)  # noqa: E731
    given = record.get(C.STEPS)
    text = record.get(C.CHAIN_TEXT)
    if given is not None and len(given) > 0:
        parts = [clean(s).strip() for s in given]
        if opts.boundary == "whole":  # one joined step: units given per step no longer apply, they are extracted
            plan = [(" ".join(p for p in parts if p), "whole", False, None)]
        else:
            units = _given_units(record, len(parts))
            plan = [(p, "given", False, units[i] if units else None) for i, p in enumerate(parts)]
    elif text is not None and text.strip():
        text = clean(text)
        if opts.boundary == "given":
            raise ChainError("missing_steps", "steps.boundary=given but the chain has no steps array")
        if opts.boundary == "whole":
            plan = [(text.strip(), "whole", False, None)]
        elif opts.boundary == "newline":
            plan = [(line, "newline", False, None) for line in rcu.lines(text)]
        elif opts.boundary == "paragraph":
            plan = [(block, "paragraph", False, None) for block in rcu.paragraphs(text)]
        else:
            plan = [(line, "sentence", True, None) for line in rcu.lines(text)]
    else:
        raise ChainError("no_steps", "the chain has neither steps nor chain text")
    context = record.get(C.CONTEXT) or ""
    question = record.get(C.QUESTION)
    if question and question.strip() and question.strip() not in context:
        context = f"{context}\n{question}"
    return plan, rcu.lines(clean(context))


def _steps_of(
    plan: list[Planned], docs: list[tuple[Any, rcu_math.Masked]], units_of, opts: Options
) -> list[dict[str, Any]]:
    """One dict per step; `docs` holds the parses (of the math-masked texts, with their masks) of the planned steps
    without given units, in order. Units are found on the masked text and handed on in the original's characters."""
    out = []
    parsed = iter(docs)
    for text, boundary, split, given in plan:
        if given is not None:
            out.append(
                {S.STEP_TEXT: text, S.PREMISE_RCUS: given[0], S.CONCLUSION_RCU: given[1], S.BOUNDARY: boundary,
                 STEP_EXTRACTOR: GIVEN}
            )
            continue
        doc, mask = next(parsed)
        units = rcu.sentence_spans(doc) if split else [doc]
        for unit in units:
            step_text, at = rcu_math.restored_span(mask, unit)
            base = unit.start_char if hasattr(unit, "start_char") else 0
            found = []
            for u in units_of(unit) if step_text else []:
                a = mask.to_original(base + u.start)
                found.append(rcu.Rcu(mask.original[a : mask.to_original(base + u.start + len(u.text))], a - at))
            premises, conclusion = rcu.assign_roles(found, step_text, opts.roles)
            out.append(
                {S.STEP_TEXT: step_text, S.PREMISE_RCUS: premises, S.CONCLUSION_RCU: conclusion, S.BOUNDARY: boundary,
                 STEP_EXTRACTOR: opts.extractor_name}
            )
    if not out:
        raise ChainError("no_steps", "splitting the chain gave no steps")
    if len(out) > opts.max_steps:
        raise ChainError("too_many_steps", f"{len(out)} steps by steps.boundary={opts.boundary}, over "
                         f"steps.max_steps={opts.max_steps}")
    return out


def explode_records(records: list[dict[str, Any]], opts: Options) -> list[dict[str, Any]]:
    """Chains (dicts with the chains fields) -> one EXTRACTED dict each. Plain Python: the job's core.

    All texts of the batch go through one `nlp.pipe`; a chain that fails comes back with `error` set.
    """
    nlp = rcu.load_spacy(opts.spacy)
    units_of = _units_fn(opts)
    plans: list[Any] = []
    texts: list[str] = []
    for rec in records:
        try:
            plan, ctx = _plan(rec, opts)
            plans.append((plan, ctx))
            texts += [t for t, _, _, units in plan if units is None] + ctx
        except ChainError as err:
            plans.append(err)
        except Exception as err:  # a planning bug must quarantine the chain, not fail the night
            plans.append(ChainError("steps_error", f"{type(err).__name__}: {err}"))
    masks = [rcu_math.mask_math(t) for t in texts]
    docs = zip(rcu_math.parse_masked(nlp, masks, opts.batch_size), masks, strict=True)
    out = []
    for rec, planned in zip(records, plans, strict=True):
        row: dict[str, Any] = {C.CHAIN_ID: rec.get(C.CHAIN_ID)}
        if isinstance(planned, ChainError):
            out.append({**row, "error": planned.reason, "detail": str(planned), "raw": _raw(rec)})
            continue
        plan, ctx = planned
        step_docs = [next(docs) for *_, units in plan if units is None]
        ctx_docs = [next(docs) for _ in ctx]
        try:
            steps = _steps_of(plan, step_docs, units_of, opts)
            sentences = [rcu_math.restored_span(m, s)[0] for d, m in ctx_docs for s in rcu.sentence_spans(d)]
            chain_text = rec.get(C.CHAIN_TEXT) or "\n".join(rec.get(C.STEPS) or [])
            answer, rule = rcu.derive_answer(
                rec.get(C.ANSWER), chain_text, steps[-1][S.CONCLUSION_RCU], opts.indicators
            )
            out.append({**row, "steps": steps, S.CONTEXT_SENTENCES: sentences, S.ANSWER: answer, S.ANSWER_RULE: rule})
        except ChainError as err:
            out.append({**row, "error": err.reason, "detail": str(err), "raw": _raw(rec)})
        except Exception as err:
            out.append({**row, "error": "steps_error", "detail": f"{type(err).__name__}: {err}", "raw": _raw(rec)})
    return out


def _raw(rec: dict[str, Any]) -> str:
    return json.dumps({k: _plain(v) for k, v in rec.items()}, ensure_ascii=False, default=str)


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def _records(pdf: pd.DataFrame) -> list[dict[str, Any]]:
    recs = []
    for rec in pdf.to_dict("records"):
        for key, value in rec.items():
            if hasattr(value, "tolist"):  # Arrow arrays arrive as numpy arrays
                rec[key] = value.tolist()
            elif not isinstance(value, (list, str)) and pd.isna(value):
                rec[key] = None
        recs.append(rec)
    return recs


def extract(chains: DataFrame, opts: Options) -> DataFrame:
    """chains -> one EXTRACTED row per chain (steps as an array), via a pandas UDF (mapInPandas)."""
    cols = [F.col(c) if c in chains.columns else F.lit(None).cast(C.SCHEMA[c].dataType).alias(c) for c in _INPUT]
    df = chains.select(*cols)
    spark = chains.sparkSession
    parallelism = spark.sparkContext.defaultParallelism
    if df.rdd.getNumPartitions() < parallelism:
        df = df.repartition(parallelism)  # spaCy is the cost: use every core

    def explode(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for pdf in batches:
            rows = explode_records(_records(pdf), opts)
            for row in rows:
                if row.get("steps") is not None:
                    row["steps"] = json.dumps(row["steps"], ensure_ascii=False)
            # every key present: a missing one becomes NaN, which Arrow cannot put in an array column
            columns = {name: [row.get(name) for row in rows] for name in EXTRACTED.fieldNames()}
            yield pd.DataFrame(columns, columns=EXTRACTED.fieldNames(), dtype=object)

    out = df.mapInPandas(explode, EXTRACTED)
    return out.withColumn("steps", F.from_json("steps", ArrayType(_STEP)))


def split(extracted: DataFrame, opts: Options, scoring_hash: str) -> tuple[DataFrame, DataFrame, DataFrame]:
    """EXTRACTED rows -> (steps, contexts, quarantine rows), keyed by `scoring_hash` (Settings.scoring_hash)."""
    config_hash = F.lit(scoring_hash)
    good = extracted.where(F.col("error").isNull())
    steps = good.select(
        C.CHAIN_ID, F.size("steps").alias(S.N_STEPS), F.posexplode("steps").alias(S.STEP_IDX, "s")
    ).select(
        C.CHAIN_ID,
        config_hash.alias(S.CONFIG_HASH),
        S.STEP_IDX,
        S.N_STEPS,
        F.col(f"s.{S.STEP_TEXT}").alias(S.STEP_TEXT),
        F.col(f"s.{S.PREMISE_RCUS}").alias(S.PREMISE_RCUS),
        F.col(f"s.{S.CONCLUSION_RCU}").alias(S.CONCLUSION_RCU),
        F.col(f"s.{S.BOUNDARY}").alias(S.BOUNDARY),
        F.lit(opts.roles).alias(S.ROLE_RULE),
        F.col(f"s.{STEP_EXTRACTOR}").alias(S.EXTRACTOR),
    )
    contexts = good.select(
        C.CHAIN_ID, config_hash.alias(S.CONFIG_HASH), S.CONTEXT_SENTENCES, S.ANSWER, S.ANSWER_RULE
    )
    bad = extracted.where(F.col("error").isNotNull())
    quarantined = tables.quarantine_rows(
        bad, QUARANTINE_STAGE, F.col("error"), F.col("detail"), chain_id=F.col(C.CHAIN_ID), raw=F.col("raw"), source=None
    )
    return tables.conform(steps, S.SCHEMA), tables.conform(contexts, S.CONTEXTS_SCHEMA), quarantined


def transform(
    chains: DataFrame, cfg: StepsSettings, models: ModelsSettings, rt: RuntimeSettings, scoring_hash: str,
    hold: tables.Held | None = None,
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """chains -> (steps, contexts, quarantine rows) under `scoring_hash` (Settings.scoring_hash). Pure: no table
    reads or writes.

    With `hold`, the per-chain extraction is persisted (lazily, released by the holder) so the three outputs
    share one spaCy pass; without, each output reads the chains again.
    """
    opts = Options.of(cfg, models, rt)
    extracted = extract(chains, opts)
    # Counted as it is extracted: the pipeline's progress moves per finished partition.
    return split(hold(counted(extracted)) if hold is not None else extracted, opts, scoring_hash)


def run(spark: SparkSession, settings: Settings, chains: DataFrame | None = None, run_id: str | None = None) -> dict[str, int]:
    """Explode chains not yet done under this config hash; write steps, contexts, quarantine; reconcile."""
    started = time.time()
    if chains is None:
        chains = tables.read(spark, settings.table("chains"), C.SCHEMA)
    config_hash = settings.scoring_hash()
    done = (
        tables.read(spark, settings.table("contexts"), S.CONTEXTS_SCHEMA)
        .where(F.col(S.CONFIG_HASH) == config_hash)
        .select(C.CHAIN_ID)
    )
    todo = chains.join(done, C.CHAIN_ID, "left_anti")
    with tables.Held() as hold:
        opts = Options.from_settings(settings)
        extracted = hold(counted(extract(todo, opts)))
        steps, contexts, quarantined = split(extracted, opts, config_hash)
        if run_id is not None:
            quarantined = quarantined.withColumn("run_id", F.lit(run_id))
        summary = extracted.agg(
            F.count(F.lit(1)).alias("chains_in"),
            F.sum(F.when(F.col("error").isNull(), 1).otherwise(0)).alias("chains_with_steps"),
            F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)).alias("quarantined"),
            F.sum(F.when(F.col("error").isNull(), F.size("steps")).otherwise(0)).alias("expected_steps"),
        ).first()
        counts = {k: int(summary[k] or 0) for k in ("chains_in", "chains_with_steps", "quarantined", "expected_steps")}
        counts["chains_total"] = chains.count()
        counts["already_done"] = counts["chains_total"] - counts["chains_in"]
        counts["steps_rows"] = steps.count()
        counts["steps_inserted"] = tables.insert_new(
            spark, steps, settings.table("steps"), S.SCHEMA, [S.CHAIN_ID, S.CONFIG_HASH, S.STEP_IDX]
        )
        counts["contexts_inserted"] = tables.insert_new(
            spark, contexts, settings.table("contexts"), S.CONTEXTS_SCHEMA, [S.CHAIN_ID, S.CONFIG_HASH]
        )
        counts["quarantine_inserted"] = tables.append_quarantine(spark, settings, quarantined)
        counts["reconciled"] = int(
            counts["steps_rows"] == counts["expected_steps"]
            and counts["chains_in"] == counts["chains_with_steps"] + counts["quarantined"]
        )
        counts["seconds"] = int(round(time.time() - started))
    log.info(
        f"[steps] chains={counts['chains_total']} done_before={counts['already_done']} "
        f"exploded={counts['chains_with_steps']} quarantined={counts['quarantined']} "
        f"steps={counts['steps_rows']} (sum over chains {counts['expected_steps']}) "
        f"inserted={counts['steps_inserted']} reconciled={bool(counts['reconciled'])}"
    )
    return counts


def _body(job: Job) -> dict[str, int]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    before = {t: tables.version(spark, settings.table(t)) for t in ("steps", "contexts")}
    counts = run(spark, settings, run_id=tracked.local_id)
    after = {t: tables.version(spark, settings.table(t)) for t in ("steps", "contexts")}
    tracked.log_metrics({f"rows_{k}": v for k, v in counts.items()})
    tracked.set_tags(
        {
            "config_hash": settings.scoring_hash(),
            "extractor": Options.from_settings(settings).extractor_name,
            "chains_version": tables.version(spark, settings.table("chains")),
            **{f"{t}_version_before": v for t, v in before.items()},
            **{f"{t}_version_after": v for t, v in after.items()},
        }
    )
    if not counts["reconciled"]:
        raise RuntimeError(f"steps counts do not reconcile: {counts}")
    return counts


STAGE = Stage("steps", __doc__, _body, reads=("chains",), writes=("steps", "contexts", "quarantine"), section="steps")


def main(argv: list[str] | None = None) -> dict[str, int]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
