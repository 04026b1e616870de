"""Deterministic stand-ins for the steps, NLI and PVI transforms: the pipeline's bookkeeping is tested fast.

Scores are plain functions of the step text and position, so two runs over the same chains give the same
rows whatever the batching. Each fake records the chain ids it was given, so tests see which chains a run
actually scored. `with fakes.installed(): pipeline.run(...)` (or `.main`) patches the functions the night
looks up when it runs, and the model check the fakes stand in for, back as they were after the block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.receval import nli_scores, pipeline, pvi_scores, score
from schemas import chains as C
from schemas import step_scores as SS
from schemas import steps as ST

QUARANTINE_MARK = "QUARANTINE-ME"  # a chain whose text holds this fails the fake steps stage


@dataclass
class Fakes:
    seen_steps: list[str] = field(default_factory=list)
    seen_nli: list[str] = field(default_factory=list)
    seen_pvi: list[str] = field(default_factory=list)
    nli_calls: int = 0
    fail_nli_call: int | None = None  # raise on this NLI call (1-based): a crash mid-scoring
    error_chain: str | None = None  # the NLI "model" returns an error for every step of this chain

    def steps(self, chains: DataFrame, settings: Settings, hold: tables.Held) -> tuple[DataFrame, DataFrame, DataFrame]:
        self.seen_steps += [r[0] for r in chains.select(C.CHAIN_ID).collect()]
        h = settings.scoring_hash()
        bad_mark = F.coalesce(F.col(C.CHAIN_TEXT), F.lit("")).contains(QUARANTINE_MARK)
        good = chains.where(~bad_mark)
        texts = F.coalesce(F.col(C.STEPS), F.split(F.col(C.CHAIN_TEXT), "\n"))
        exploded = good.select(
            C.CHAIN_ID, F.size(texts).alias(ST.N_STEPS), F.posexplode(texts).alias(ST.STEP_IDX, ST.STEP_TEXT)
        )
        steps = exploded.select(
            ST.CHAIN_ID,
            F.lit(h).alias(ST.CONFIG_HASH),
            ST.STEP_IDX,
            ST.N_STEPS,
            ST.STEP_TEXT,
            F.array(F.substring(ST.STEP_TEXT, 1, 10)).alias(ST.PREMISE_RCUS),
            F.col(ST.STEP_TEXT).alias(ST.CONCLUSION_RCU),
            F.lit("newline").alias(ST.BOUNDARY),
            F.lit("position").alias(ST.ROLE_RULE),
            F.lit("fake").alias(ST.EXTRACTOR),
        )
        contexts = good.select(
            C.CHAIN_ID,
            F.lit(h).alias(ST.CONFIG_HASH),
            F.split(C.CONTEXT, r"\. ").alias(ST.CONTEXT_SENTENCES),
            F.col(C.ANSWER).alias(ST.ANSWER),
            F.lit("given").alias(ST.ANSWER_RULE),
        )
        bad = tables.quarantine_rows(chains.where(bad_mark), "steps", "fake_failure", "marked", chain_id=F.col(C.CHAIN_ID))
        # Held as the real transform holds its spaCy pass: computed once for the batch's writes.
        return hold(tables.conform(steps, ST.SCHEMA)), hold(tables.conform(contexts, ST.CONTEXTS_SCHEMA)), bad

    def nli(self, steps: DataFrame, contexts: DataFrame, settings: Settings) -> DataFrame:
        self.nli_calls += 1
        if self.fail_nli_call is not None and self.nli_calls == self.fail_nli_call:
            raise RuntimeError("injected failure inside the scoring stage")
        self.seen_nli += sorted({r[0] for r in steps.select(ST.CHAIN_ID).collect()})
        length = F.length(ST.STEP_TEXT)
        out = steps.join(contexts.select(ST.CHAIN_ID, ST.CONTEXT_SENTENCES), ST.CHAIN_ID).select(
            ST.CHAIN_ID,
            ST.STEP_IDX,
            (F.pmod(length, F.lit(7)) / 7.0).alias(SS.INTRA_ENTAIL),
            F.col(ST.STEP_TEXT).alias(SS.INTRA_PREMISE),
            (1.0 - F.pmod(length, F.lit(5)) / 10.0).alias(SS.INTER),
            (F.pmod(length, F.lit(5)) / 10.0).alias(SS.INTER_MAX_CONTRADICTION),
            F.element_at(ST.CONTEXT_SENTENCES, 1).alias(SS.INTER_WORST_PREMISE),
            F.lit("context").alias(SS.INTER_WORST_SOURCE),
            F.when(F.col(ST.CHAIN_ID) == F.lit(self.error_chain), F.lit("fake model error")).alias("error"),
        )
        return out

    def pvi(self, steps: DataFrame, contexts: DataFrame, settings: Settings) -> DataFrame:
        self.seen_pvi += sorted({r[0] for r in steps.select(ST.CHAIN_ID).collect()})
        idx = F.col(ST.STEP_IDX).cast("double")
        return steps.select(
            ST.CHAIN_ID,
            ST.STEP_IDX,
            (F.pmod(F.length(ST.STEP_TEXT), F.lit(5)) - 2.0).alias(SS.INTRA_PVI),
            F.lit(-1.0).alias(SS.PVI_G),
            F.lit(-2.0).alias(SS.PVI_NULL),
            (F.pmod(F.length(ST.STEP_TEXT), F.lit(3)) - 0.5).alias(SS.INFO_GAIN),
            (-idx).alias(SS.IG_L_PREV),
            (-idx + 0.5).alias(SS.IG_L),
        )

    def patches(self) -> dict[tuple[Any, str], Any]:
        """(module, name) -> stand-in. The scores stage keeps its real score_steps (joins, errors, quarantine)
        and gets these NLI and PVI transforms as arguments, as score.run's callers pass them: the rows then name
        the configured models, where score._nli / _pvi patched would name and fingerprint the real ones."""
        real_score_steps = score.score_steps

        def score_steps(steps: DataFrame, contexts: DataFrame, settings: Settings, *_: Any) -> DataFrame:
            return real_score_steps(steps, contexts, settings, self.nli, self.pvi)

        return {
            (pipeline, "_steps"): self.steps,
            (score, "score_steps"): score_steps,
            # No model to check: the fakes stand in for them (pipeline.prepare, before the session starts).
            (nli_scores, "check_models"): lambda settings: None,
            (pvi_scores, "check_models"): lambda settings: None,
        }

    @contextmanager
    def installed(self) -> Iterator[Fakes]:
        with ExitStack() as stack:
            for (module, name), fake in self.patches().items():
                stack.enter_context(mock.patch.object(module, name, fake))
            yield self


if __name__ == "__main__":
    # `python tests/jobs/pipeline_fakes.py --set ...`: the nightly pipeline's own command line (claim, MLflow run,
    # exit codes) with these fakes for the models, as a separate process (tests/jobs/test_overlapping_runs.py).
    import sys
    from pathlib import Path

    assert Path(pipeline.__file__).resolve().is_relative_to(Path(__file__).resolve().parents[2]), pipeline.__file__
    with Fakes().installed():
        pipeline.main(sys.argv[1:])
