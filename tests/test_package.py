"""The wheel (`pip wheel .`): it carries the config layers and the sample lake (the checkout's very files: one
source), and installed, or shipped as a zip, it reads them from itself and resolves every writable path against
the working directory or RECEVAL_HOME, never its install location; what is missing is named with the command
that provides it. The install into a fresh virtual environment and a whole pipeline run from an empty folder:
tests/test_install.py (slow)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from setuptools import find_packages
from setuptools.config.pyprojecttoml import read_configuration

from jobs.infra.config_paths import PROJECT_ROOT

# The checkout's folders the wheel carries as package data, and where they are in it (udfs.home.BUNDLED).
SHIPPED = {"conf": "jobs/infra/conf", "tests/data/sample_lake": "jobs/infra/sample_lake"}
# What a wheel build needs of the checkout (pyproject.toml's packages and package-dir).
BUILD_INPUTS = ("pyproject.toml", "README.md", "jobs", "udfs", "schemas", "conf", "tests/data/sample_lake")


def build_wheel(out: Path) -> Path:
    """`pip wheel --no-deps` of a copy of the checkout's build inputs (the build leaves build/ and *.egg-info
    in the tree it builds: not in the checkout other tests read)."""
    src = out / "src"
    for name in BUILD_INPUTS:
        source = PROJECT_ROOT / name
        if source.is_dir():
            shutil.copytree(source, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(out / "dist"), str(src)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = (out / "dist").glob("receval_spark-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> Path:
    """The wheel unpacked as pip lays it out in site-packages (the dependencies are this interpreter's)."""
    folder = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(folder)
    return folder


def test_pyproject_lists_every_code_package_and_maps_the_data_folders():
    config = read_configuration(PROJECT_ROOT / "pyproject.toml", expand=False)["tool"]["setuptools"]
    code = set(find_packages(str(PROJECT_ROOT), include=["jobs", "jobs.*", "udfs", "schemas"]))
    data = {p for p in config["packages"] if p.startswith(("jobs.infra.conf", "jobs.infra.sample_lake"))}
    # A new room must be added to the list (else the wheel lacks it); nothing else may be listed.
    assert set(config["packages"]) - data == code
    assert config["package-dir"] == {"jobs.infra.conf": "conf", "jobs.infra.sample_lake": "tests/data/sample_lake"}


def test_the_wheel_carries_the_checkouts_conf_and_sample_lake_byte_for_byte(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for folder, inside in SHIPPED.items():
            files = {p.relative_to(PROJECT_ROOT / folder).as_posix() for p in (PROJECT_ROOT / folder).rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts}
            packed = {n[len(inside) + 1:] for n in names if n.startswith(inside + "/")}
            assert packed == files, folder
            for rel in files:
                assert zf.read(f"{inside}/{rel}") == (PROJECT_ROOT / folder / rel).read_bytes(), rel
        entry = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "receval = jobs.infra.cli:main" in entry


# What the installed package says about itself, from a folder with nothing in it (printed as JSON).
PROBE = r"""
import json, os, sys
from jobs.infra import config
from jobs.infra.config_describe import describe
from jobs.infra.config_layers import load_settings, load_settings_with_sources
from jobs.infra.config_paths import CONF_DIR, default_tracking_uri, resolve_path
from udfs import home
settings, sources = load_settings_with_sources(environ={})
print(json.dumps({
    "jobs": os.path.dirname(os.path.dirname(config.__file__)),
    "checkout": str(home.checkout()),
    "conf": str(CONF_DIR),
    "lake": settings.table("chains"),
    "checkpoints": str(resolve_path(settings.paths.checkpoints)),
    "models": str(resolve_path(settings.paths.models)),
    "data": str(resolve_path(settings.paths.data)),
    "artifacts": str(resolve_path(settings.mlflow.artifact_location)),
    "store": default_tracking_uri(),
    "input": str(resolve_path(settings.ingest.input)),
    "inputs": sorted(os.listdir(resolve_path(settings.ingest.input))),
    "templates": str(resolve_path(load_settings(environ={}).cot.p3_template_list)),
    "describe": describe(settings, sources),
}))
"""


def probe(tmp_path: Path, pythonpath: Path, **env: str) -> dict:
    cwd = tmp_path / "empty"
    cwd.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RECEVAL", "MLFLOW_TRACKING_URI"))}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True, timeout=120,
                         env={**clean, "PYTHONPATH": str(pythonpath), **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_installed_reads_its_own_conf_and_writes_under_the_working_directory(site, tmp_path):
    got = probe(tmp_path, site)
    cwd = tmp_path / "empty"
    assert got["jobs"] == str(site / "jobs") and got["checkout"] == "None"  # the wheel's code, not the checkout
    assert got["conf"] == str(site / "jobs" / "infra" / "conf")
    assert got["lake"] == str(cwd / "lake" / "chains")
    assert got["checkpoints"] == str(cwd / "lake" / "_checkpoints")
    assert (got["models"], got["data"], got["artifacts"]) == (str(cwd / "models"), str(cwd / "data"),
                                                              str(cwd / "mlartifacts"))
    assert got["store"] == f"sqlite:///{cwd / 'mlruns.db'}"
    # What the project ships and the folder lacks: the package's own copy.
    assert got["input"] == str(site / "jobs" / "infra" / "sample_lake")
    assert got["inputs"] == ["bad_rows.jsonl", "entailment_bank_sample.jsonl", "gsm8k_sample.jsonl"]
    assert got["templates"] == str(site / "jobs" / "infra" / "conf" / "p3_templates" / "t0_eval.yaml")
    lines = {line.split(":")[0]: line for line in got["describe"].splitlines()}
    assert got["describe"].startswith(f"# config layers: {site / 'jobs/infra/conf'} (the installed package's data)")
    assert f"# relative paths resolve against {cwd} (the working directory;" in got["describe"]
    assert lines["paths.lake"].endswith(f"# conf/defaults.yaml -> {cwd / 'lake'}")
    assert lines["mlflow.tracking_uri"].endswith(f"-> sqlite:///{cwd / 'mlruns.db'}")
    assert lines["ingest.input"].endswith(f"-> {site / 'jobs/infra/sample_lake'} (shipped with the package)")
    assert not any((tmp_path / "empty").iterdir())  # reading the config wrote nothing


def test_installed_with_receval_home_writes_there(site, tmp_path):
    home = tmp_path / "home"
    got = probe(tmp_path, site, RECEVAL_HOME=str(home))
    assert got["lake"] == str(home / "lake" / "chains")
    assert got["store"] == f"sqlite:///{home / 'mlruns.db'}"
    assert f"# relative paths resolve against {home} ($RECEVAL_HOME)" in got["describe"]
    assert got["input"] == str(site / "jobs" / "infra" / "sample_lake")  # still the shipped one: home has none
    (home / "tests" / "data" / "sample_lake").mkdir(parents=True)
    assert probe(tmp_path, site, RECEVAL_HOME=str(home))["input"] == str(home / "tests" / "data" / "sample_lake")


def test_the_wheel_as_a_zip_on_the_path_reads_its_conf_too(wheel, tmp_path):
    # spark-submit --py-files puts the wheel itself on the path: its files are extracted once per process.
    got = probe(tmp_path, wheel)
    assert got["jobs"].startswith(str(wheel))
    assert Path(got["conf"]).name == "conf" and "receval-pkg-" in got["conf"]
    assert got["inputs"] == ["bad_rows.jsonl", "entailment_bank_sample.jsonl", "gsm8k_sample.jsonl"]
    assert got["lake"] == str(tmp_path / "empty" / "lake" / "chains")


def test_the_checkout_resolves_against_its_root_as_before(tmp_path, monkeypatch):
    # make run / make test: the checkout's root, from whatever folder the code runs.
    from jobs.infra.config_layers import load_settings
    from jobs.infra.config_paths import CONF_DIR, default_tracking_uri, resolve_path

    monkeypatch.delenv("RECEVAL_HOME", raising=False)
    monkeypatch.delenv("RECEVAL_PROJECT_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert CONF_DIR == PROJECT_ROOT / "conf"
    assert resolve_path("lake") == PROJECT_ROOT / "lake"
    assert default_tracking_uri() == f"sqlite:///{PROJECT_ROOT / 'mlruns.db'}"
    assert resolve_path(load_settings(environ={}).ingest.input) == PROJECT_ROOT / "tests" / "data" / "sample_lake"


# -- bad input: what is missing is named, with the path tried and the command that provides it ---------------
BAD = r"""
import sys
from jobs.infra.config import ConfigError
from jobs.infra.config_layers import load_settings
from jobs.infra.config_paths import dataset_file
from udfs.runtime import ModelUnavailable, check_available, resolve_model_path
for call in (lambda: check_available("models/tiny-nli", "nli"),
             lambda: resolve_model_path("registry:gemma3-270m"),
             lambda: dataset_file("${paths.data}/sick/SICK.txt", "train_nli.sources.sick.path", "sick"),
             lambda: load_settings("night.yaml", environ={}),
             lambda: load_settings(overrides=["models.profile=huge"], environ={})):
    try:
        call()
    except (ConfigError, ModelUnavailable, FileNotFoundError) as err:
        print(err)
"""


def bad_messages(tmp_path: Path, pythonpath: Path | None) -> list[str]:
    cwd = tmp_path / "empty"
    cwd.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RECEVAL")}
    env = ({**clean, "PYTHONPATH": str(pythonpath)} if pythonpath
           else {**clean, "PYTHONPATH": str(PROJECT_ROOT), "RECEVAL_HOME": str(cwd)})
    out = subprocess.run([sys.executable, "-c", BAD], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()


def test_installed_names_what_is_missing_and_the_receval_command(site, tmp_path):
    cwd = tmp_path / "empty"
    model, registry, dataset, config, profile = bad_messages(tmp_path, site)
    assert model.startswith(f"models.nli.path: the tiny offline model 'models/tiny-nli' is not built here "
                            f"(looked for {cwd / 'models/tiny-nli'}); build it with `receval setup`")
    assert f"({cwd / 'models/gemma3-270m'} has no model_record.json): run `receval models fetch gemma3-270m`" \
        in registry
    assert dataset == (f"train_nli.sources.sick.path: {cwd / 'data/sick/SICK.txt'} is missing; fetch it with "
                       "`receval data fetch sick`")
    assert config == f"--config: config file not found: {cwd / 'night.yaml'} (relative paths resolve against {cwd})"
    assert profile.startswith("models.profile: unknown model profile 'huge' (no ")
    assert profile.endswith("model profiles: offline, paper, small)")


def test_a_checkout_names_the_python_m_command(tmp_path):
    # RECEVAL_HOME an empty folder: nothing built there; the checkout's commands are python -m (and make).
    cwd = tmp_path / "empty"
    model, registry, dataset, config, _ = bad_messages(tmp_path, None)
    assert "build it with `python -m jobs.infra.tiny_models --out models` (or make setup)" in model
    assert "run `python -m jobs.infra.models fetch gemma3-270m`" in registry
    assert dataset.endswith("`python -m jobs.infra.data fetch sick` (or make data)")
    assert config.startswith(f"--config: config file not found: {cwd / 'night.yaml'}")


def test_an_unreadable_config_file_names_it(tmp_path):
    from jobs.infra.config import ConfigError
    from jobs.infra.config_layers import load_settings

    broken = tmp_path / "broken.yaml"
    broken.write_text("runtime: [unclosed\n")
    with pytest.raises(ConfigError, match=f"--config: config file {broken} is not valid YAML"):
        load_settings(broken, environ={})
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    with pytest.raises(ConfigError, match=f"--config: config file not found: {folder}"):
        load_settings(folder, environ={})
