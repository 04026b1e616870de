"""Layering: conf/defaults.yaml < conf/profiles/<profile>.yaml < conf/models/<models.profile>.yaml < --config FILE
< environment (RECEVAL__SECTION__KEY) < --set, merged and validated into the one `Settings` (jobs.infra.config
composes its model), with the layer each value came from.

`load_settings` is the entry point; `load_settings_with_sources` also says, per dotted key, which layer set it
(jobs.infra.config_describe shows that for --print-config). An override's text is typed by the field it sets.
Errors are ConfigErrors that name the bad key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from jobs.infra.config import ConfigError, Settings, conf_file, settings_model
from jobs.infra.config_describe import flatten
from jobs.infra.config_paths import CONF_DIR, resolve_path, with_data_folder
from udfs.home import home

ENV_PREFIX = "RECEVAL__"  # RECEVAL__NLI__BATCH_SIZE=32 sets nli.batch_size


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


def _profile_layer(folder: str, name: str, setting: str, noun: str) -> dict[str, Any]:
    """conf/<folder>/<name>.yaml, the layer a profile setting (`profile`, `models.profile`) names; an unknown name
    is a ConfigError that lists the known ones."""
    path = CONF_DIR / folder / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"{setting}: unknown {noun} {name!r} (no {path}; {noun}s: "
                          f"{', '.join(_names(CONF_DIR / folder))})")
    return _read_yaml(path, setting)


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
    profile_layer = _profile_layer("profiles", profile, "profile", "profile")
    layered = deep_merge(layered, profile_layer)
    sources.update(_layer_sources(profile_layer, f"conf/profiles/{profile}.yaml"))
    models_profile = (
        top.get("models", {}).get("profile")
        or layered.get("models", {}).get("profile", "offline")
    )
    models_layer = _profile_layer("models", models_profile, "models.profile", "model profile")
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
    return with_data_folder(settings, settings.paths.data), sources


def _names(folder: Path) -> list[str]:
    """The layer names a conf/ folder offers (its YAML files' stems)."""
    return sorted(p.stem for p in folder.glob("*.yaml"))
