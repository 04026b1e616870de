"""The CoT evaluation room's settings: `cot`, with the official protocol's values (OFFICIAL_COT) and the lenient
preset (LENIENT_COT). Composed into `Settings` by jobs.infra.config (settings_model).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from jobs.infra.config import Section


class CotSettings(Section):
    """CoT Collection evaluation (jobs/cot/evaluate.py); defaults follow the official protocol, deviations are options."""

    order: ClassVar[int] = 210

    data_root: str = "${paths.data}/cot"
    datasets: list[Literal["bbh", "mgsm", "p3"]] = Field(default_factory=lambda: ["bbh", "mgsm", "p3"])
    modes: list[Literal["direct", "cot"]] = Field(default_factory=lambda: ["direct", "cot"])
    # First N examples of each (dataset, task, template): quick runs; None = all.
    max_examples_per_task: int | None = Field(None, ge=1)
    # A seeded choice (cot.seed) of this many examples of each (dataset, task, template), in file order: a sample
    # that stands for the task, for real models on small machines (docs/COT_TABLES_*.md); None = all.
    sample_per_task: int | None = Field(None, ge=1)
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
    # The first N templates of each task in that list (None: all, as T0): with cot.sample_per_task, a run small
    # enough for a real model on a CPU still takes a median over several templates.
    p3_templates_per_task: int | None = Field(None, ge=1)
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
    dtype: Literal["auto", "fp32", "bf16", "fp16", "int8"] = "fp32"  # official: fp32; auto = runtime.dtype
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
    # Decoder-only instruct models (a departure: the official code is T5-only): the source goes through the
    # tokenizer's chat template as the user turn and the suffix (the Direct "[ANSWER] " or the CoT trigger, its
    # leading newlines dropped) opens the assistant turn; the rationale is that turn, options continue it after
    # "[ANSWER]". A tokenizer without a chat template keeps the plain prompt. The rendered prompt is stored per
    # example (cot_predictions.prompt). docs/COT_PROTOCOL.md "Decoder-only instruct models".
    chat_template: bool = False

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
        if self.chat_template:
            out["chat_template"] = (True, False)
        return out

    def fewshot_keys(self) -> dict[str, Any]:
        """The few-shot keys for the protocol fingerprint: none when zero-shot (the fingerprint stays as before)."""
        keys = {"fewshot": self.fewshot, "mgsm_exemplars": self.mgsm_exemplars} if self.fewshot else {}
        return keys | ({"chat_template": True} if self.chat_template else {})


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


# Section name -> class: jobs.infra.config composes these into Settings (settings_model).
SECTIONS: dict[str, type[Section]] = {
    "cot": CotSettings,
}
