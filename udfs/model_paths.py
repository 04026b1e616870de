"""Where models live, what marks one complete, and when the `small` profile is built.

Relative model folders resolve against udfs.home.home(). Three writers leave a record file in a model's folder once
its weights are saved, so a folder without one is an interrupted run, never a model: `jobs.infra.models fetch`
(REGISTRY_RECORD in models/<name>, the folder of `registry:<name>`), `jobs.training.train_nli` (NLI_RECORD) and
`jobs.training.train_pvi` (PVI_RECORD, naming the kind). No Spark, no job: `udfs.runtime` resolves `registry:`
paths on the executors with it, the platform chooses the model profile with it (small_built).
"""

from __future__ import annotations

import os
from pathlib import Path

from udfs.home import home

MODELS = "models"  # the folder under home() that registry fetches, `make models` and the tiny models fill
REGISTRY_PREFIX = "registry:"  # `registry:<name>`: a model of conf/model_registry.yaml, in models/<name>
REGISTRY_RECORD = "model_record.json"
NLI_RECORD = "train_nli.json"
PVI_RECORD = "train_pvi.json"

# The small profile's models (conf/models/small.yaml names the same folders), each with the record that says it is
# built: the NLI model and g / g' trained by `make models`, the information-gain model fetched by name.
SMALL_NLI = f"{MODELS}/nli-small"
SMALL_PVI = f"{MODELS}/pvi-small"  # <dir>/g and <dir>/g_null
SMALL_INFO_GAIN = "gemma3-270m"  # a registry name
SMALL = {
    SMALL_NLI: NLI_RECORD,
    f"{SMALL_PVI}/g": PVI_RECORD,
    f"{SMALL_PVI}/g_null": PVI_RECORD,
    f"{MODELS}/{SMALL_INFO_GAIN}": REGISTRY_RECORD,
}


def registry_path(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """models/<name> under `root` (home() when None): where `registry:<name>` is fetched to and read from."""
    return (home() if root is None else Path(root)) / MODELS / name


def small_built(root: str | os.PathLike[str] | None = None) -> bool:
    """True once `make models` has built every model of the small profile under `root` (home() when None): each
    folder has its config.json and its record."""
    base = home() if root is None else Path(root)
    return all(
        (base / folder / "config.json").exists() and (base / folder / record).exists()
        for folder, record in SMALL.items()
    )
