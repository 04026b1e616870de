"""The chain sampling and selection room's settings: select and sample. Composed into `Settings` by
jobs.infra.config (settings_model).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from jobs.infra.config import ModelRef, Section
from schemas import metrics as MR
from udfs import selection as SEL
from udfs.cot_text import AnswerRule


class MethodSpec(Section):
    """One row of the selection table: a method of the registry (udfs.selection.METHODS) with fixed `params`, and
    the `grid` cross-validation tunes over (select.cv_folds): None takes the method's declared grid less the
    parameters `params` fixes; {} tunes nothing."""

    method: str
    params: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] | None = None

    @model_validator(mode="after")
    def _known(self) -> MethodSpec:
        grid = self.tuned_grid()
        empty = [k for k, values in grid.items() if not values]
        if empty:
            raise ValueError(f"{self.method}: empty grid for {empty}")
        SEL.check(self.method, {**self.params, **{k: v[0] for k, v in grid.items()}})
        for k, values in grid.items():
            for v in values:
                SEL.check(self.method, {**self.params, k: v})
        return self

    def tuned_grid(self) -> dict[str, list[Any]]:
        if self.grid is not None:
            return dict(self.grid)
        return {k: list(v) for k, v in SEL.METHODS[self.method].grid.items() if k not in self.params}


def declared(method: str) -> dict[str, list[Any]]:
    """The grid udfs.selection declares for `method`."""
    return {k: list(v) for k, v in SEL.METHODS[method].grid.items()}


def _default_methods() -> dict[str, MethodSpec]:
    """Today's rows (self-consistency, the oracle) and the methods of issue 56, each on the "both" criterion."""
    both = {"score": "both"}
    return {
        "self_consistency": MethodSpec(method=SEL.VOTE),
        "oracle": MethodSpec(method=SEL.ORACLE),
        # the arithmetic check alone: no parameter to tune
        "vote_arith_checked": MethodSpec(method=SEL.FILTER_THEN_VOTE, grid={}),
        # the arithmetic check and a score threshold (cross-validated over the method's declared grid, written out
        # so that --print-config and the MLflow params show it)
        "filter_then_vote": MethodSpec(method=SEL.FILTER_THEN_VOTE, params=both, grid=declared(SEL.FILTER_THEN_VOTE)),
        "weighted_vote": MethodSpec(method=SEL.WEIGHTED_VOTE, params=both, grid=declared(SEL.WEIGHTED_VOTE)),
        # a weight between correctness and informativeness, and the temperature, tuned together
        "weighted_vote_mix": MethodSpec(method=SEL.WEIGHTED_VOTE,
                                        params={"score": "correctness", "mix_with": "informativeness"},
                                        grid={"weight": [0.0, 0.5, 1.0], "temperature": [0.1, 1.0]}),
        "group_mean": MethodSpec(method=SEL.GROUP_SCORE, params={**both, "agg": "mean"}),
        "group_max": MethodSpec(method=SEL.GROUP_SCORE, params={**both, "agg": "max"}),
    }


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
    # Rows beside greedy and the criteria's argmax (issue 56): name -> a method of udfs.selection.METHODS with its
    # parameters. A parameter with a grid is chosen by k-fold cross-validation over the questions (seeded by
    # cv_seed); each fold is answered with the value chosen on the other folds and only held-out answers are
    # reported (jobs/selection/cross_validation.py).
    methods: dict[str, MethodSpec] = Field(default_factory=_default_methods)
    cv_folds: int = Field(5, ge=2)
    cv_seed: int = 0

    @model_validator(mode="after")
    def _distinct_rows(self) -> SelectSettings:
        clash = sorted(set(self.methods) & {*self.criteria, "greedy"})
        if clash:
            raise ValueError(f"select.methods {clash} would share a table row with greedy or a criterion")
        return self


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
