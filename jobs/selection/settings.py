"""The chain sampling and selection room's settings: select and sample. Composed into `Settings` by
jobs.infra.config (settings_model).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from jobs.infra.config import ModelRef, Section
from schemas import metrics as MR
from udfs.cot_text import AnswerRule


class SelectSettings(Section):
    """ReCEval-guided choice among k sampled chains per question."""

    order: ClassVar[int] = 180

    # correctness = min(intra_entail_min, inter_min); informativeness = info_gain_min;
    # both = mean of the two ranks within the question (scales differ: probabilities vs nats).
    criteria: list[Literal["correctness", "informativeness", "both"]] = Field(
        default_factory=lambda: ["correctness", "informativeness", "both"]
    )
    # chain_scores columns; defaults from the metric registry's selection criteria.
    correctness: list[str] = Field(default_factory=lambda: MR.chain_scores_of(MR.SELECT_CORRECTNESS))
    informativeness: list[str] = Field(default_factory=lambda: MR.chain_scores_of(MR.SELECT_INFORMATIVENESS))
    combine: Literal["rank_mean", "sum"] = "rank_mean"
    greedy_key: str = "sample_idx"  # metadata key; the sample with the smallest value is the greedy one
    # metadata key whose value "true" marks a real greedy decode (sample_chains writes one per question): it is
    # the greedy baseline and never a candidate; a question without one falls back to the greedy_key rule.
    greedy_flag: str = "greedy"
    config_hash: str | None = None
    datasets: list[str] | None = None
    # Each method against greedy: the paired bootstrap over questions (percentile CI; scipy.stats.bootstrap).
    bootstrap_resamples: int = Field(10_000, ge=100)
    confidence: float = Field(0.95, gt=0, lt=1)
    seed: int = 0


class SampleSettings(Section):
    """`python -m jobs.selection.sample_chains`: k sampled chains + one greedy decode per GSM-8K question -> JSONL."""

    order: ClassVar[int] = 190

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
    # An instruct model's own format: the question as the user turn of the tokenizer's chat template, the
    # assistant turn opened with `chat_opening` (Kojima's trigger), instead of `prompt`. A tokenizer without a
    # template keeps `prompt` (logged). The chains' metadata says which (chat_template true/false).
    chat_template: bool = False
    chat_opening: str = "Let's think step by step.\n"
    # The chain's answer (udfs.sampling.final_answer): the last number after the last indicator (else in the whole
    # text). answer_rule `final` first takes the last \boxed{} and reads only the prose outside fenced code blocks:
    # a chat/code model (Qwen2.5-Coder) ends 38 % of its GSM-8K chains with a Python block and its own ```output,
    # whose numbers are not its answer (docs/META_EVAL.md). On plain prose both rules agree; `last_number` is the
    # rule before, kept for comparison.
    answer_indicators: list[str] = Field(default_factory=lambda: ["answer is", "A:"])
    answer_rule: AnswerRule = "final"
    model: ModelRef = ModelRef(path="models/tiny-t5", family="seq2seq")
    max_length: int = Field(512, ge=8)  # prompt + new tokens (causal) / prompt (seq2seq), as udfs.generate
    # Generation batches: the k samples and the greedy decode of many questions share a batch of at most
    # `batch_size` rows and runtime.generation_batch_tokens positions (rows x (prompt + max_new_tokens)); each sampled row draws
    # from its own seeded generator, so the chains do not depend on either (udfs/generate.py). 64 rows: 110 tokens/s
    # for Qwen2.5-0.5B on 2 cores against ~10 one row at a time (bench/RESULTS.md).
    batch_size: int = Field(64, ge=1)
    # Sample only among the top_k most likely tokens (None: the whole vocabulary, as the paper). A departure that
    # makes sampling over a 152k vocabulary cheaper; record it when used.
    top_k: int | None = Field(None, ge=1)
    output: str | None = None  # JSONL folder; None: <paths.lake>/_samples/<dataset>


# Section name -> class: jobs.infra.config composes these into Settings (settings_model).
SECTIONS: dict[str, type[Section]] = {
    "select": SelectSettings,
    "sample": SampleSettings,
}
