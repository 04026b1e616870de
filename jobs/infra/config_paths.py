"""Where configured paths point: the config layers' folder (CONF_DIR), home-relative paths (resolve_path), the
dataset folder a leading ${paths.data} names, dataset files with a fetch hint, and the default MLflow store.

Below the settings classes (jobs.infra.config imports it, it imports no config module): PathSettings checks its
folders with resolve_path, so this module knows paths.data's default as DATA_FOLDER rather than by the class.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from udfs.home import CODE_ROOT, bundled, checkout, command, home

# The folder above jobs/ and udfs/: a checkout's root (tests and scripts find their files under it), or
# site-packages when installed. Relative paths in config never resolve against it but against udfs.home.home().
PROJECT_ROOT = CODE_ROOT
# The config layers: the checkout's conf/ (the files people edit), else the installed package's data (the same
# files, mapped into the wheel by pyproject.toml). Missing only in a broken install; conf_file then says so.
CONF_DIR = bundled("conf") or PROJECT_ROOT / "conf"
DATA_TOKEN = "${paths.data}"  # dataset paths in config start with it (see resolve_path)
DATA_FOLDER = "data"  # paths.data's default (PathSettings.data): what ${paths.data} means before settings are read


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
        text = os.fspath(data if data is not None else DATA_FOLDER) + text[len(DATA_TOKEN):]
    p = Path(text).expanduser()
    if p.is_absolute():
        return p
    here = home() / p
    if not here.exists() and (shipped := bundled(p.as_posix())) is not None:
        return shipped
    return here


def dataset_file(path: str | os.PathLike[str], setting: str, dataset: str) -> Path:
    """resolve_path(path), or a FileNotFoundError that names the setting and the dataset to fetch: a fresh clone
    has no datasets until `python -m jobs.infra.data fetch` lays them out."""
    resolved = resolve_path(path)
    if not resolved.exists():
        how = command(f"jobs.infra.data fetch {dataset}", f"data fetch {dataset}")
        raise FileNotFoundError(f"{setting}: {resolved} is missing; fetch it with "
                                f"`{how}`{' (or make data)' if checkout() is not None else ''}")  # fmt: skip
    return resolved


def with_data_folder(model: BaseModel, data: str) -> BaseModel:
    """The model with every ${paths.data} prefix in its (nested) string fields replaced by `data`."""
    updates: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, str) and value.startswith(DATA_TOKEN):
            updates[name] = data + value[len(DATA_TOKEN):]
        elif isinstance(value, BaseModel):
            replaced = with_data_folder(value, data)
            if replaced is not value:
                updates[name] = replaced
        elif isinstance(value, dict) and any(isinstance(v, BaseModel) for v in value.values()):
            # A dict of sections (train_nli.sources): each section's paths too.
            entries = {k: with_data_folder(v, data) if isinstance(v, BaseModel) else v for k, v in value.items()}
            if any(entries[k] is not value[k] for k in value):
                updates[name] = entries
    return model.model_copy(update=updates) if updates else model


def default_tracking_uri() -> str:
    """The MLflow store when neither MLFLOW_TRACKING_URI nor mlflow.tracking_uri names one: a sqlite file in home()."""
    return f"sqlite:///{home() / 'mlruns.db'}"
