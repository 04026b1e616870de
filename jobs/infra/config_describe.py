"""Describing settings to people and to MLflow: `describe` (--print-config: every value with the layer that set
it, and where a path setting points), `flatten` (dotted keys, MLflow params) and the note summaries print when the
scores come from the tiny random models.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from jobs.infra.config import Settings
from jobs.infra.config_paths import CONF_DIR, default_tracking_uri, resolve_path
from udfs.home import bundled, checkout, home_and_reason


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
    """The file of the class that declares a top-level section: a room's settings.py or jobs/infra/config.py
    (the platform's sections, and `profile`, a field of Settings itself)."""
    section = getattr(settings, key.split(".")[0], None)
    module = type(section).__module__ if isinstance(section, BaseModel) else Settings.__module__
    return module.replace(".", "/") + ".py"


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
