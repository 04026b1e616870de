"""The meta-evaluation room's settings: perturb, meta_eval, localise, processbench, human_labels and baselines.

Composed with the platform's sections and the other rooms' into `Settings` by jobs.infra.config (settings_model).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from jobs.infra.config import Section
from schemas import metrics as MR


class PerturbSettings(Section):
    order: ClassVar[int] = 130

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
    paraphrase_prefix: str = "paraphrase: "  # a seq2seq paraphraser's input is this prefix + the sentence
    # A causal paraphraser (models.paraphrase family causal) must be an instruction-tuned chat model: its input is
    # this message ({sentence} filled in) through the tokenizer's own chat template, and its first reply line is
    # the paraphrase (e.g. registry:qwen2.5-coder-0.5b-instruct).
    paraphrase_instruction: str = (
        "Paraphrase this sentence. Keep its meaning and reply with the paraphrase only.\n\n{sentence}"
    )
    paraphrase_max_new_tokens: int = Field(48, ge=1)
    paraphrase_num_beams: int = Field(4, ge=1)  # return sequences too: the first that differs is used
    # Give each chain the tree's own units (premises = a step's fresh parents, conclusion = its child) as
    # given RCUs, so scores measure the metric and not the extractor; false: the steps job extracts them.
    gold_rcus: bool = False


class MetaEvalSettings(Section):
    order: ClassVar[int] = 140

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

    order: ClassVar[int] = 150

    # The subset whose F1-best threshold every subset is evaluated with (the paper's protocol: GSM8K).
    calibration: str = "processbench_gsm8k"
    # step_scores metrics evaluated (each higher-is-better; a step is flagged when it scores below the threshold).
    # Default: the paper's four, as the metric registry lists them.
    metrics: list[str] = Field(default_factory=lambda: list(MR.PAPER_STEP_SCORES))
    # The combination `receval_rank_min`: these metrics rank-normalised over the calibration subset's steps, then
    # the per-step min. [] = no combination.
    combine: list[str] = Field(default_factory=lambda: list(MR.PAPER_STEP_SCORES))
    # Per-step baseline scores (a lake table of chain_id, step_idx, metric, score, higher-is-better) evaluated
    # beside them, e.g. `step_baseline_scores` (the baselines job with baselines.per_step); None: none.
    step_baselines: str | None = None
    # Checks whose flags come first, {step_scores metric: threshold} (a step is flagged when it scores strictly
    # below its threshold, fixed here, not chosen on the calibration subset), e.g. {arith_valid: 1.0}: an equation
    # that does not hold. Adds `checks` (the first step any check flags, else -1) and, per metric m evaluated,
    # `checks_then_<m>` (that step, else m's prediction at m's own threshold): a precise rule placed before a
    # recall-oriented one. {}: none.
    check_first: dict[str, float] = Field(default_factory=dict)
    datasets: list[str] | None = None  # None: every dataset whose chains carry a first_error_index label
    config_hash: str | None = None  # None: Settings.scoring_hash(), the step scores of the current configuration
    bootstrap_resamples: int = Field(1000, ge=0)
    seed: int = 0
    ci_level: float = Field(0.95, gt=0, lt=1)


class ProcessBenchSettings(Section):
    """`python -m jobs.metaeval.processbench`: ProcessBench subset files -> `chains` and `step_labels`
    (docs/META_EVAL.md "Step-level localisation")."""

    order: ClassVar[int] = 155

    path: str = "${paths.data}/processbench"  # the `processbench` dataset's folder of <subset>.json files
    # Subsets read, each from <path>/<subset>.json; the dataset's optional olympiadbench and omnimath once fetched.
    subsets: list[str] = Field(default_factory=lambda: ["gsm8k", "math"], min_length=1)
    # chains.dataset is <prefix>_<subset>: processbench_gsm8k is localise.calibration's default.
    dataset_prefix: str = "processbench"
    max_items: int | None = Field(None, ge=1)  # the first N items of each subset (smoke runs)


class HumanLabelSettings(Section):
    """Annotated CSV in ROSCOE's shape -> `chains` with labels; every column name comes from here."""

    order: ClassVar[int] = 160

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

    order: ClassVar[int] = 170

    groups: list[Literal["sa", "ss", "li", "rouge"]] = Field(default_factory=lambda: ["sa", "ss", "li", "rouge"])
    reference_based: bool = False  # ROSCOE's reference-based SA/SS scores too (needs gold_steps)
    # The per-step forms of the five scores that are a mean or min over steps, into `step_baseline_scores`
    # (localisation evaluates them: localise.step_baselines=step_baseline_scores). Chains given as steps only.
    per_step: bool = False
    batch_size: int = Field(64, ge=1)
    max_length: int = Field(256, ge=8)
    datasets: list[str] | None = None


# Section name -> class: jobs.infra.config composes these into Settings (settings_model).
SECTIONS: dict[str, type[Section]] = {
    "perturb": PerturbSettings,
    "meta_eval": MetaEvalSettings,
    "localise": LocaliseSettings,
    "processbench": ProcessBenchSettings,
    "human_labels": HumanLabelSettings,
    "baselines": BaselineSettings,
}
