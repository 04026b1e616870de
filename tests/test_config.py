"""Config layering (defaults < profile < model profile < file < env < command line) and validation errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from jobs.config import ConfigError, cli_overrides, env_overrides, load_settings


def test_load_settings_defaults_are_local_and_offline():
    s = load_settings(environ={})
    assert s.profile == "local"
    assert s.spark.master == "local[*]"
    assert s.models.profile == "offline"
    assert s.models.nli.path == "models/tiny-nli"
    assert s.runtime.on_row_error == "quarantine"


def test_load_settings_layers_file_env_and_cli(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nli:\n  intra_history: 2\nruntime:\n  batch_size: 8\n  max_length: 128\n")
    env = {"RECEVAL__RUNTIME__BATCH_SIZE": "16", "RECEVAL__RUNTIME__MAX_LENGTH": "256"}
    s = load_settings(cfg, ["runtime.max_length=64"], environ=env)
    assert s.nli.intra_history == 2  # file
    assert s.runtime.batch_size == 16  # env beats file
    assert s.runtime.max_length == 64  # command line beats env


def test_load_settings_model_profile_paper_and_profile_cluster():
    s = load_settings(overrides=["models.profile=paper", "profile=cluster"], environ={})
    assert s.models.nli.path == "MoritzLaurer/DeBERTa-v3-large-mnli-fever-anli-ling-wanli"
    assert s.models.info_gain.path == "gpt2-xl"
    assert s.spark.master.startswith("spark://")


def test_load_settings_bad_type_names_the_key():
    with pytest.raises(ConfigError, match=r"runtime\.batch_size"):
        load_settings(overrides=["runtime.batch_size=many"], environ={})


def test_load_settings_unknown_key_names_the_key():
    with pytest.raises(ConfigError, match=r"nli\.intra_histroy"):
        load_settings(overrides=["nli.intra_histroy=all"], environ={})


def test_load_settings_bad_literal_names_the_key():
    with pytest.raises(ConfigError, match=r"steps\.boundary"):
        load_settings(overrides=["steps.boundary=paragraph"], environ={})


def test_load_settings_unknown_profile_is_clear():
    with pytest.raises(ConfigError, match="unknown profile 'nowhere'"):
        load_settings(overrides=["profile=nowhere"], environ={})
    with pytest.raises(ConfigError, match="unknown model profile 'huge'"):
        load_settings(overrides=["models.profile=huge"], environ={})


def test_load_settings_missing_file_is_clear(tmp_path: Path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "absent.yaml", environ={})


def test_overrides_parse_yaml_scalars():
    assert cli_overrides(["a.b=3", "a.c=true", "d=null", "e=[1, 2]"]) == {
        "a": {"b": 3, "c": True},
        "d": None,
        "e": [1, 2],
    }
    assert env_overrides({"RECEVAL__SPARK__MASTER": "local[2]", "OTHER": "x"}) == {"spark": {"master": "local[2]"}}
    with pytest.raises(ConfigError, match="section.key=value"):
        cli_overrides(["novalue"])


def test_settings_are_frozen():
    s = load_settings(environ={})
    with pytest.raises(ValidationError):
        s.runtime.batch_size = 3  # type: ignore[misc]


def test_scoring_hash_changes_with_models_not_with_paths():
    base = load_settings(environ={})
    moved = load_settings(overrides=["paths.lake=/elsewhere", "runtime.batch_size=3"], environ={})
    other_model = load_settings(overrides=["models.nli.path=models/other-nli"], environ={})
    assert base.scoring_hash() == moved.scoring_hash()
    assert base.scoring_hash() != other_model.scoring_hash()
