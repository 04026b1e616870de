"""The `small` model profile and the choice `make run` makes: small once `make models` built it, else offline with
a plain warning in the summary; a profile chosen anywhere by the user always wins."""

from __future__ import annotations

import re
import runpy
import sys
import warnings
from pathlib import Path

import pytest

from jobs.infra import cli, stage
from jobs.infra.config_describe import random_models_note
from jobs.infra.config_layers import load_settings
from jobs.infra.config_paths import PROJECT_ROOT
from jobs.infra.stage import with_built_models
from udfs.model_paths import REGISTRY_PREFIX, SMALL, registry_path, small_built

TRAINED = {"models/nli-small": "train_nli.json", "models/pvi-small/g": "train_pvi.json",
           "models/pvi-small/g_null": "train_pvi.json", "models/gemma3-270m": "model_record.json"}


def build_small(root: Path, skip: str | None = None) -> Path:
    """The folders `make models` leaves (config + the training record), all but `skip`."""
    for folder, record in TRAINED.items():
        if folder != skip:
            (root / folder).mkdir(parents=True)
            (root / folder / "config.json").write_text("{}")
            (root / folder / record).write_text("{}")
    return root


def test_small_built_asks_for_what_make_models_writes_where_the_profile_looks():
    # The Makefile cannot import udfs.model_paths: its `test -f` lines spell the same records, kept equal here.
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    made = dict(m.groups() for m in re.finditer(r"test -f (models/[\w./-]+)/([\w.]+\.json)", makefile))
    assert made == SMALL == TRAINED
    small = load_settings(overrides=["models.profile=small"], environ={}).models
    named = {small.nli.path, small.pvi_g.path, small.pvi_null.path,
             registry_path(small.info_gain.path.removeprefix(REGISTRY_PREFIX), ".").as_posix()}
    assert named == set(SMALL)


def test_small_profile_uses_the_trained_models_and_offline_for_the_rest():
    small = load_settings(overrides=["models.profile=small"], environ={})
    offline = load_settings(environ={})
    assert small.models.nli.path == "models/nli-small" and small.models.nli.family == "nli"
    trained = {"pvi_g": "g", "pvi_null": "g_null"}
    for role, kind in trained.items():
        ref = getattr(small.models, role)
        assert (ref.path, ref.family) == (f"models/pvi-small/{kind}", "seq2seq")
    # information gain: the pretrained Gemma 3 270M by name, a causal LM as in the official code (no training)
    assert (small.models.info_gain.path, small.models.info_gain.family) == ("registry:gemma3-270m", "causal")
    assert small.models.require_trained_pvi and small.pvi.info_gain_family == "causal"
    # the small PVI models are trained by train_pvi from scratch into the folders the profile names
    assert (small.train_pvi.base_model, small.train_pvi.output_dir) == ("scratch", "models/pvi-small")
    same = {"profile", "nli", "require_trained_pvi", "info_gain", *trained}
    assert small.models.model_dump(exclude=same) == offline.models.model_dump(exclude=same)
    assert small.scoring_hash() != offline.scoring_hash()  # scores of the two profiles never mix in the lake


def test_with_built_models_adds_small_only_when_built_and_nobody_chose(tmp_path):
    assert with_built_models(["--set", "pipeline.batch_chains=4"], {}, tmp_path) == ["--set", "pipeline.batch_chains=4"]
    # a folder without train_nli.json is an interrupted run, not a model
    (tmp_path / "models" / "nli-small").mkdir(parents=True)
    (tmp_path / "models" / "nli-small" / "config.json").write_text("{}")
    assert not small_built(tmp_path) and with_built_models([], {}, tmp_path) == []
    # every trained model of the profile is needed: one kind missing is not built
    for missing in TRAINED:
        assert not small_built(build_small(tmp_path / missing.replace("/", "_"), skip=missing)), missing
    root = tmp_path / "built"
    build_small(root)
    assert small_built(root)
    assert with_built_models(["--dry-run"], {}, root) == ["--dry-run", "--set", "models.profile=small"]


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--set", "models.profile=offline"], {}),
        (["--set=models.profile=paper"], {}),
        ([], {"RECEVAL__MODELS__PROFILE": "offline"}),
        (["--config", "CONFIG"], {}),
    ],
)
def test_with_built_models_leaves_a_chosen_profile_alone(tmp_path, argv, environ):
    root = build_small(tmp_path)
    config = tmp_path / "mine.yaml"
    config.write_text("models:\n  profile: offline\n")
    argv = [str(config) if a == "CONFIG" else a for a in argv]
    assert with_built_models(argv, environ, root) == argv


# The flags a stage's command line needs besides the common ones (as tests/test_stages.py).
REQUIRED = {"experiments": ["api_k"], "paper_tables": ["--run", "r1"]}


@pytest.mark.parametrize("built", [True, False], ids=["small-built", "not-built"])
def test_a_stage_started_alone_chooses_the_nights_profile_and_config_hash(built, tmp_path, monkeypatch, capsys):
    # Issue 47: `python -m jobs.receval.nli_scores` scored with the random offline models while the night used the
    # small ones, so its rows landed under another config hash. Every stage's main block, started as `python -m`
    # and as `receval`, must resolve the settings the pipeline resolves. Only the marker files: no training.
    monkeypatch.setenv("RECEVAL_HOME", str(build_small(tmp_path) if built else tmp_path))
    monkeypatch.delenv("RECEVAL__MODELS__PROFILE", raising=False)
    seen: list[tuple[str, str, str]] = []  # (how it started, models.profile, config hash) per --print-config
    describe = stage.describe

    def recorded(settings, sources):
        seen.append((started, settings.models.profile, settings.scoring_hash()))
        return describe(settings, sources)

    monkeypatch.setattr(stage, "describe", recorded)
    for name, module in sorted(cli.stage_modules().items()):
        started = f"receval {name}"
        assert cli.main([name, *REQUIRED.get(name, []), "--print-config"]) == 0, name
        started = f"python -m {module}"
        monkeypatch.setattr(sys, "argv", [module, *REQUIRED.get(name, []), "--print-config"])
        with pytest.raises(SystemExit) as stop, warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is already imported
            runpy.run_module(module, run_name="__main__")
        assert stop.value.code == 0, name
    capsys.readouterr()
    profile = "small" if built else "offline"
    night = load_settings(overrides=[f"models.profile={profile}"], environ={}).scoring_hash()
    assert {"receval pipeline", "python -m jobs.receval.pipeline", "python -m jobs.receval.nli_scores"} <= {
        how for how, _, _ in seen}
    assert [(how, p, h) for how, p, h in seen if (p, h) != (profile, night)] == []
    # Called with an argv (tests, scripts), a stage takes the layers it is given: no profile is added.
    seen.clear()
    started = "main([...])"
    with pytest.raises(SystemExit):
        stage.declared()["nli_scores"].main(["--print-config"])
    assert seen[0][1] == "offline"


def test_random_models_note_only_for_the_tiny_random_nli():
    note = random_models_note(load_settings(environ={}))
    assert note is not None and "RANDOM" in note and "make models" in note
    assert random_models_note(load_settings(overrides=["models.profile=small"], environ={})) is None
    assert random_models_note(load_settings(overrides=["models.nli.path=/models/deberta"], environ={})) is None


def test_pipeline_summary_names_the_models_and_warns_about_random_ones(capsys):
    from jobs.receval.night_summary import Summary, print_summary

    settings = load_settings(overrides=["mlflow.enabled=false"], environ={})
    print_summary(Summary(run_id="r", config_hash="h"), settings)
    out = capsys.readouterr().out
    assert "models: offline (NLI models/tiny-nli)" in out and "RANDOM" in out and "make models" in out
    small = load_settings(overrides=["mlflow.enabled=false", "models.profile=small"], environ={})
    print_summary(Summary(run_id="r", config_hash="h"), small)
    out = capsys.readouterr().out
    assert "models: small (NLI models/nli-small)" in out and "RANDOM" not in out
