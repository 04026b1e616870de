"""Where this code runs from and where its relative paths go: a checkout, or an installed package (a wheel).

Two kinds of files, two places:

- What the project ships and nobody writes (the config layers under conf/, the bundled sample lake): in a checkout,
  the files people edit (`conf/`, `tests/data/sample_lake/`); installed, the same files as package data of the
  wheel (`pyproject.toml` maps those folders into it: one source, no copy), found with importlib.resources.
- What jobs write (the lake, checkpoints, the MLflow store and artifacts, models, datasets, the jar cache):
  relative to `home()`: `RECEVAL_HOME` when set, else the checkout this code runs from (so `make run` and
  `make test` write where they always did), else the working directory. Never the install location.

No Spark, no job: `udfs.runtime` resolves model folders on the executors with it, `jobs.infra.config_paths` every
relative path in config.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from importlib import resources
from pathlib import Path

HOME_ENV = "RECEVAL_HOME"
# The older name (a checkout's folder shared with executors): no script here sets it any more, but cluster configs
# and wrappers written before RECEVAL_HOME may, and their relative paths must not move.
LEGACY_HOME_ENV = "RECEVAL_PROJECT_ROOT"
# The folder above udfs/: a checkout's root, or site-packages (or a zip shipped to executors) when installed.
CODE_ROOT = Path(__file__).resolve().parent.parent
# The package whose data holds what a checkout keeps in its own folders (pyproject.toml's package-dir).
PACKAGE = "jobs.infra"
# A checkout's folder -> its name inside PACKAGE in the wheel.
BUNDLED = {"conf": "conf", "tests/data/sample_lake": "sample_lake"}

_lock = threading.Lock()
_extracted: dict[str, Path] = {}


def checkout() -> Path | None:
    """The checkout this code runs from (its pyproject.toml and conf/ beside jobs/), or None when installed."""
    if (CODE_ROOT / "pyproject.toml").is_file() and (CODE_ROOT / "conf" / "defaults.yaml").is_file():
        return CODE_ROOT
    return None


def home() -> Path:
    """The folder relative paths in config resolve against (see the module docstring)."""
    return home_and_reason()[0]


def home_and_reason() -> tuple[Path, str]:
    """home() and why it is that folder, for --print-config."""
    for name in (HOME_ENV, LEGACY_HOME_ENV):
        value = os.environ.get(name)
        if value:
            return Path(value).expanduser().resolve(), f"${name}"
    root = checkout()
    if root is not None:
        return root, "the checkout this code runs from"
    return Path.cwd(), f"the working directory; set ${HOME_ENV} to choose another"


def bundled(relative: str) -> Path | None:
    """The shipped copy of a checkout folder or file (`conf/defaults.yaml`, `tests/data/sample_lake`) as a real
    path: the checkout's own file when running from one, else the package data, extracted to a temporary folder
    when the package is a zip (spark-submit --py-files) because Spark and open() need real files. None: not
    shipped, or absent."""
    relative = relative.strip("/")
    for folder, name in BUNDLED.items():
        if relative == folder or relative.startswith(folder + "/"):
            inner = name + relative[len(folder):]
            break
    else:
        return None
    root = checkout()
    if root is not None:
        return root / relative if (root / relative).exists() else None
    found = resources.files(PACKAGE)
    for part in inner.split("/"):
        found = found / part
    if isinstance(found, Path):  # installed as files (pip install)
        return found if found.exists() else None
    if not (found.is_dir() or found.is_file()):
        return None
    return _extract(inner, found)


def _extract(inner: str, found) -> Path:
    """A package-data file or folder inside a zip, copied once per process to a temporary folder."""
    with _lock:
        if inner not in _extracted:
            folder = tempfile.mkdtemp(prefix="receval-pkg-")
            atexit.register(shutil.rmtree, folder, True)
            target = Path(folder) / inner
            _copy(found, target)
            _extracted[inner] = target
        return _extracted[inner]


def _copy(source, target: Path) -> None:
    if source.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with source.open("rb") as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        return
    target.mkdir(parents=True, exist_ok=True)
    for child in source.iterdir():
        _copy(child, target / child.name)


def command(module_args: str, cli_args: str) -> str:
    """How to run a tool here: `python -m <module_args>` in a checkout, `receval <cli_args>` (the console script
    the installed package provides) elsewhere."""
    return f"python -m {module_args}" if checkout() is not None else f"receval {cli_args}"
