"""The ReCEval room's settings: ingest, steps, nli, pvi, aggregate, curation, pipeline and export.

Composed with the platform's sections and the other rooms' into `Settings` by jobs.infra.config (settings_model);
each stage's transform receives its own frozen section.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from jobs.infra.claim import ClaimSettings
from jobs.infra.config import RuntimeSettings, Section
from jobs.receval.ingest_presets import (
    DEFAULT_MAPPING,
    METADATA_PREFIX,
    PRESET_FORMAT,
    PRESETS,
    STEP_KEYS,
    Preset,
    effective_mapping,
)
from udfs import selection as SEL
from udfs.paths import PathSyntaxError, compile_source


class IngestSettings(Section):
    order: ClassVar[int] = 60

    input: str = "tests/data/sample_lake"
    # hf_datasets: a `datasets` save_to_disk folder (its Arrow files, read on the executors).
    format: Literal["auto", "jsonl", "parquet", "delta", "hf_datasets"] = "auto"
    # A producer's row shape (jobs/receval/ingest_presets.py): fills the mapping, records metadata.producer.
    preset: Preset | None = None
    # target field -> source in the input rows (udfs/paths.py: `a.b[0]`, one `[*]` fan-out, `a | b`,
    # `{a}-{b}` templates; None: not present). Merged key by key over the preset's and the default mapping.
    mapping: dict[str, str | None] = Field(default_factory=lambda: dict(DEFAULT_MAPPING))
    # openai_batch: the batch input file (JSONL), joined to the output lines by custom_id.
    batch_input: str | None = None
    # Split `<open>chain<close>answer` (reasoning models) into the chain and the answer after it.
    reasoning: bool = False
    reasoning_tags: tuple[str, str] = ("<think>", "</think>")
    dataset: str = "default"
    max_field_chars: int = Field(200_000, ge=1)
    max_steps: int = Field(2_000, ge=1)
    # A literal U+FFFD in text that is valid UTF-8 (byte-level BPE models emit it when a generation cuts a
    # character): strip_end removes it at the end of a text and keeps it inside, strip removes every one, keep
    # keeps them, quarantine rejects the row (reason replacement_char). Bytes that are not UTF-8 are always
    # quarantined as undecodable_text.
    replacement_char: Literal["strip_end", "keep", "strip", "quarantine"] = "strip_end"
    # The run fails (non-zero exit, FAILED MLflow run) when quarantined / read rows reaches this share; the rows
    # are written to `quarantine` first. 1.0: only a run that quarantines every row it read.
    max_quarantined_share: float = Field(1.0, gt=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def _merge_mapping(cls, data: Any) -> Any:
        # The user's keys override the preset's, which override the defaults: `--set ingest.mapping.answer=x`
        # changes one field, not the whole mapping.
        if not isinstance(data, dict):
            return data
        preset = data.get("preset")
        if preset is not None and preset not in PRESETS:
            return data  # the Literal check names the bad value
        user = data.get("mapping")
        if user is not None and not isinstance(user, Mapping):
            return data
        out = {**data, "mapping": effective_mapping(preset, user)}
        if preset in PRESET_FORMAT and data.get("format", "auto") == "auto":
            out["format"] = PRESET_FORMAT[preset]
        return out

    @field_validator("mapping")
    @classmethod
    def _sources_parse(cls, mapping: dict[str, str | None]) -> dict[str, str | None]:
        fan_outs = []
        for key, source in mapping.items():
            if key not in DEFAULT_MAPPING and not (key.startswith(METADATA_PREFIX) and len(key) > len(METADATA_PREFIX)):
                raise ValueError(f"{key}: not a chains field (one of {sorted(DEFAULT_MAPPING)} or metadata.<name>)")
            if source is None:
                continue
            try:
                compiled = compile_source(source)
            except PathSyntaxError as err:
                raise ValueError(f"{key}: {err}") from None
            if compiled.fans_out:
                if key in STEP_KEYS:
                    raise ValueError(f"{key}: a path inside a step object cannot fan out")
                fan_outs.append(key)
        if len(fan_outs) > 1:
            raise ValueError(f"{' and '.join(fan_outs)} both fan out ([*]); a mapping may fan out once")
        return mapping

    @model_validator(mode="after")
    def _batch_input_given(self) -> IngestSettings:
        if self.preset == "openai_batch" and not self.batch_input:
            raise ValueError(
                "preset openai_batch joins each output line to its request by custom_id: set ingest.batch_input "
                "to the batch input file"
            )
        if not all(tag.strip() for tag in self.reasoning_tags):
            raise ValueError(f"reasoning_tags must be two non-empty tags, got {list(self.reasoning_tags)}")
        return self


class StepsSettings(Section):
    order: ClassVar[int] = 70
    scoring_exclude: ClassVar[frozenset[str] | None] = frozenset({"batch_size", "max_steps"})

    # paragraph: one step per block between blank lines, the unit reasoning models write in (README "Reasoning-model
    # lakes": a 300-paragraph chain is 300 steps, 494 by newline, 1,243 by sentence).
    boundary: Literal["sentence", "newline", "paragraph", "given", "whole"] = "sentence"
    # conjunction (paper): "so/therefore" conclude, "because/since" introduce premises ("C because P" -> C);
    # position (official code): the last unit is the conclusion. docs/design/RECEVAL.md "Roles".
    roles: Literal["position", "conjunction"] = "conjunction"
    # clauses: units cut at connectives and between clauses with their own subject (default; measured against
    # EB gold in bench/RESULTS.md); spacy: verb frames from the parse + the official selection rules; srl: the
    # same rules on frames of a BIO-tagging SRL model (steps.srl_model). docs/design/RECEVAL.md "RCUs".
    extractor: Literal["clauses", "spacy", "srl"] = "clauses"
    srl_model: str | None = None
    batch_size: int = Field(64, ge=1)
    # Missing a_hat: the text after the last of these (case-insensitive), else the last conclusion RCU.
    answer_indicators: list[str] = Field(default_factory=lambda: ["answer is", "[ANSWER]"])
    # GSM-8K "<<3+4=7>>" calculator annotations are tool markup, not reasoning text.
    strip_calculator: bool = True
    # A chain text that splits into more steps goes to quarantine (too_many_steps), as ingest.max_steps sends a
    # longer steps array there: a 200,000-character text split by sentence can make thousands of steps. Not part
    # of the scoring hash: it decides which chains are scored, not their scores.
    max_steps: int = Field(2_000, ge=1)


History = Literal["all", "none"] | int
RELEVANT = "relevant"  # nli.inter_history / intra_history: premises picked by embedding (udfs/candidates.py)


class NliSettings(Section):
    order: ClassVar[int] = 80
    scoring_exclude: ClassVar[frozenset[str] | None] = frozenset({"batch_size"})

    # Earlier conclusions added to the intra premise: all (the official code), none, the last k (k >= 1), or
    # relevant: the intra_top_k earlier conclusions whose embeddings (models.embedding) are closest to the step's
    # conclusion, kept in chain order after the step's own premise RCUs (udfs/candidates.py). Why not all: the
    # official premise grows with the chain and the NLI tokenizer cuts it from its end (nli.max_length), so on a
    # long chain the most recent conclusions are dropped first. A step with <= intra_top_k earlier conclusions
    # gets the official premise exactly, and a chain of only such steps is never embedded.
    intra_history: Literal["all", "none", "relevant"] | Annotated[int, Field(ge=1)] = "relevant"
    intra_top_k: int = Field(8, ge=1)
    # Candidates each conclusion is checked for contradiction against: all context sentences and earlier
    # conclusions (the official code, the paper's best), only the last k conclusions (besides the context), or
    # relevant: the last inter_recent earlier conclusions plus the inter_top_k candidates (context sentences and
    # earlier conclusions) most similar to the step's conclusion, in the official order. Why: `all` costs
    # n^2 / 2 NLI pairs per chain of n steps (300 steps: ~45,000 pairs, hours on a CPU); relevant costs at most
    # inter_top_k + inter_recent pairs per step whatever n is. A step with <= inter_top_k candidates keeps them
    # all, so chains of only such steps score exactly as `all` (and skip the encoder).
    inter_history: Literal["all", "relevant"] | Annotated[int, Field(ge=1)] = "relevant"
    inter_top_k: int = Field(16, ge=1)
    inter_recent: int = Field(2, ge=0)
    batch_size: int | None = Field(None, ge=1)  # None: runtime.batch_size
    max_length: int | None = Field(None, ge=8)  # None: runtime.max_length; the premise is cut first

    def call_sizes(self, rt: RuntimeSettings) -> tuple[int, int]:
        """(batch size, max length) of every call to the NLI model: the scoring job's, the ROSCOE-LI
        baselines' and the logged MLflow model's, so the three score a pair alike."""
        return self.batch_size or rt.batch_size, self.max_length or rt.max_length

    def scoring_dump(self) -> dict[str, Any]:
        """The top_k / recent sizes count only under `relevant`: `all` (and `none`, the last k) hash as before
        they existed, so a lake scored with the official options keeps its config hash and its rows."""
        dump = super().scoring_dump()
        if self.inter_history != RELEVANT:
            del dump["inter_top_k"], dump["inter_recent"]
        if self.intra_history != RELEVANT:
            del dump["intra_top_k"]
        return dump

    def uses_embedding(self) -> bool:
        """Whether a `relevant` option picks premises by sentence embeddings (models.embedding)."""
        return RELEVANT in (self.intra_history, self.inter_history)


class PviSettings(Section):
    order: ClassVar[int] = 90
    scoring_exclude: ClassVar[frozenset[str] | None] = frozenset({"batch_size"})

    # Input format of L(k): causal (a plain LM, the official default) or seq2seq ("Generate final answer:"
    # prefix); must match models.info_gain.family.
    info_gain_family: Literal["causal", "seq2seq"] = "causal"
    # Earlier conclusions joined to g's premises: all (the spec), none, the last k, or relevant: the intra_top_k
    # earlier conclusions closest to the step's conclusion by models.embedding, in chain order (the same rule as
    # nli.intra_history, udfs/candidates.py). Why not all: g's source then grows with the chain, so g costs n^2/2
    # conclusions per chain (160 steps: 389k T5 positions of the 400k the three LMs ran, bench/RESULTS.md "Long
    # chains"), and a T5 with a trained length cuts it. A step with <= intra_top_k earlier conclusions gets the
    # official source exactly, and a chain of only such steps is never embedded.
    intra_history: Literal["all", "none", "relevant"] | Annotated[int, Field(ge=1)] = "relevant"
    intra_top_k: int = Field(8, ge=1)
    batch_size: int | None = Field(None, ge=1)  # None: runtime.batch_size
    # None: each LM's own position limit (config n_positions / max_position_embeddings, else the tokenizer's
    # model_max_length), so sources and targets are scored whole wherever the model allows; a number is a lower
    # cap. A row over the limit is scored with its source cut from the left and flagged (step_scores.pvi_truncated).
    max_length: int | None = Field(None, ge=8)
    # g's source for a step with no premise text: empty_join = the official "Generate entailed sentence:  ->";
    # none = g' own "... None ->" (this project's behaviour before issue #17; docs/PVI.md).
    empty_premises: Literal["empty_join", "none"] = "empty_join"


    def scoring_dump(self) -> dict[str, Any]:
        """intra_top_k counts only under `relevant`: the other options hash as before it existed."""
        dump = super().scoring_dump()
        if self.intra_history != RELEVANT:
            del dump["intra_top_k"]
        return dump


class AggregateSettings(Section):
    order: ClassVar[int] = 120

    api_k: list[int] = Field(default_factory=lambda: [1, 2, 3])


class CurationSettings(Section):
    """Rules a chain must pass to be curated. Keys name a metric (`inter` -> its chain score `inter_min`)
    or any numeric `chain_scores` column (`inter_mean`); a chain passes a rule when its value is >= the
    bound, and a null score fails it."""

    order: ClassVar[int] = 200

    thresholds: dict[str, float] = Field(default_factory=dict)
    # metric -> q: the bound is the q-quantile of that score over the reference set.
    quantiles: dict[str, float] = Field(default_factory=dict)
    # run: the chains curated in this run; all: every chain scored under the config hash;
    # anything else: path of a Delta table with the chain_scores columns.
    quantile_reference: str = "run"
    require_api_k: int | None = Field(None, ge=1)
    max_steps: int | None = Field(None, ge=1)
    histogram_bins: int = Field(20, ge=2)
    # step_scores metric -> threshold (e.g. one `python -m jobs.metaeval.localise` calibrated): every decided
    # chain carries its first flagged step, the first step scoring below the threshold of any metric here, and
    # that metric (curation.first_flagged_step / _metric; -1 = none flagged). A label, not a rule: no chain
    # passes or fails by it. Empty: no flags (null), and the rules hash of the rules before it.
    step_thresholds: dict[str, float] = Field(default_factory=dict)
    # Drop math chains with wrong arithmetic in one setting (issue 45): the rule `arith_errors_total <= 0`
    # (a chain with any equation that does not hold is rejected; a chain scored before the check existed has a
    # null total and fails it, like any null score) and the flag `arith_valid < 1` among the step thresholds, so
    # first_flagged_step / first_flagged_metric name the first step with a wrong equation (unless step_thresholds
    # sets arith_valid itself). Off: neither, and the rules hash of the rules before it.
    reject_arith_errors: bool = False
    # A sampled lake into a training set in one setting (issue 56): per question, keep what a selection method
    # (udfs.selection.METHODS, with `select_params`; e.g. vote, filter_then_vote, oracle) chooses among its sampled
    # chains (the select stage's candidates, its select.criteria scores): `chosen`, the one chain, or
    # `chosen_answer`, every chain of the chosen answer. Every other chain fails the rule `select:<method>:<keep>`,
    # greedy decodes and chains of questions with fewer than two samples included. None: no such rule, and the
    # rules hash of the rules before it.
    select_method: str | None = None
    select_params: dict[str, Any] = Field(default_factory=dict)
    select_keep: Literal["chosen", "chosen_answer"] = "chosen"

    @model_validator(mode="after")
    def _known_method(self) -> CurationSettings:
        if self.select_method is not None:
            SEL.check(self.select_method, self.select_params)
        elif self.select_params:
            raise ValueError(f"select_params {self.select_params} without a select_method")
        return self

    @field_validator("quantiles")
    @classmethod
    def _in_unit_interval(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: q for k, q in value.items() if not 0.0 <= q <= 1.0}
        if bad:
            raise ValueError(f"quantiles must lie in [0, 1]: {bad}")
        return value

    def flag_thresholds(self) -> dict[str, float]:
        """The step thresholds that flag steps: step_thresholds, plus arith_valid < 1 with reject_arith_errors."""
        if self.reject_arith_errors:
            return {"arith_valid": 1.0, **self.step_thresholds}
        return dict(self.step_thresholds)

    def rules_hash(self) -> str:
        """Hash of the rules (not the reporting options): new rules curate every chain again."""
        keyed = self.model_dump(exclude={"histogram_bins"})
        if not keyed["step_thresholds"]:
            del keyed["step_thresholds"]  # chains decided before the setting existed keep their rules hash
        if not keyed["reject_arith_errors"]:
            del keyed["reject_arith_errors"]  # likewise
        if keyed["select_method"] is None:
            for key in ("select_method", "select_params", "select_keep"):
                del keyed[key]  # likewise
        return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


class PipelineSettings(ClaimSettings):
    """The nightly job (`python -m jobs.receval.pipeline`); also the lake claim's settings (on_busy, wait_timeout_s,
    claim_ttl, claim_heartbeat_s, claim_host: jobs.infra.claim.ClaimSettings), which every run that writes the
    lake's tables obeys (docs/OPERATIONS.md, Overlapping runs)."""

    order: ClassVar[int] = 220

    stages: list[Literal["ingest", "steps", "scores", "aggregate", "curate", "report"]] = Field(
        default_factory=lambda: ["ingest", "steps", "scores", "aggregate", "curate", "report"]
    )
    # Delete this config hash's rows and score every chain again (a resumed run must not repeat it).
    rescore: bool = False
    # Chains per committed batch: a killed run loses at most one batch of work per stage.
    batch_chains: int = Field(5_000, ge=1)
    # Skip ingest when no input file changed since the last run (path, size, mtime, and the ingest settings but
    # input: a changed mapping reads the files again).
    skip_unchanged_input: bool = True
    report_worst_n: int = Field(5, ge=0)
    # rich: a live progress bar on a terminal; plain: one line per committed batch (logs, CI).
    progress: Literal["auto", "rich", "plain"] = "auto"


class ExportSettings(Section):
    """`python -m jobs.receval.export`: curated (or rejected) chains with text, scores and reasons, or the
    quarantine table (reasons, raw rows, sources; `datasets` and `config_hash` do not apply to it)."""

    order: ClassVar[int] = 250

    table: Literal["curated", "rejected", "quarantine"] = "curated"
    format: Literal["jsonl", "parquet", "hf"] = "jsonl"
    output: str = "exports/curated"
    datasets: list[str] | None = None  # None: every dataset
    run_id: str | None = None  # only the chains curated by this pipeline run (its run id)
    config_hash: str | None = None  # None: Settings.scoring_hash()


# Section name -> class: jobs.infra.config composes these into Settings (settings_model).
SECTIONS: dict[str, type[Section]] = {
    "ingest": IngestSettings,
    "steps": StepsSettings,
    "nli": NliSettings,
    "pvi": PviSettings,
    "aggregate": AggregateSettings,
    "curation": CurationSettings,
    "pipeline": PipelineSettings,
    "export": ExportSettings,
}
