"""Config layering (defaults < profile < model profile < file < env < command line) and validation errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from jobs.infra.config import ConfigError
from jobs.infra.config_layers import cli_overrides, env_overrides, load_settings


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
        load_settings(overrides=["steps.boundary=paragraphs"], environ={})


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


def test_overrides_are_typed_by_their_field():
    env = {"RECEVAL__HUMAN_LABELS__OK_VALUE": "no", "RECEVAL__RUNTIME__MAX_LENGTH": "128"}
    s = load_settings(
        overrides=[
            "human_labels.error_value=yes",  # YAML alone makes this `true`: a string field keeps the text
            "ingest.dataset=1e5",  # not the float 100000.0
            "spark.conf.spark.executor.memory=8g",  # a dict key with dots
            "runtime.batch_size=64",
            "nli.intra_history=2",
            "runtime.dedup=no",  # a bool field still reads yes/no
            "cot.custom_path=null",
            "curation.thresholds={intra_entail: 0.3}",
            "pipeline.stages=[ingest, steps]",
        ],
        environ=env,
    )
    assert (s.human_labels.error_value, s.human_labels.ok_value) == ("yes", "no")
    assert s.ingest.dataset == "1e5"
    assert s.spark.conf == {"spark.executor.memory": "8g"}
    assert (s.runtime.batch_size, s.runtime.max_length, s.nli.intra_history, s.runtime.dedup) == (64, 128, 2, False)
    assert s.cot.custom_path is None
    assert s.curation.thresholds == {"intra_entail": 0.3}
    assert s.pipeline.stages == ["ingest", "steps"]


def test_config_file_reads_yes_and_no_as_their_field_types(tmp_path: Path):
    # YAML 1.1 (PyYAML's default) reads yes/no/on/off as booleans before the field's type is known.
    cfg = tmp_path / "labels.yaml"
    cfg.write_text("human_labels:\n  error_value: yes\n  ok_value: 'no'\nruntime:\n  dedup: off\n"
                   "pipeline:\n  skip_unchanged_input: true\n")
    s = load_settings(cfg, environ={})
    assert (s.human_labels.error_value, s.human_labels.ok_value) == ("yes", "no")
    assert s.runtime.dedup is False and s.pipeline.skip_unchanged_input is True


def test_print_config_names_the_layer_of_every_value(tmp_path: Path, capsys, monkeypatch):
    from jobs.infra.stage import Stage

    cfg = tmp_path / "night.yaml"
    cfg.write_text("runtime:\n  batch_size: 8\n")
    monkeypatch.setenv("RECEVAL__HUMAN_LABELS__OK_VALUE", "no")
    with pytest.raises(SystemExit) as stop:
        Stage("x", "a stage").main(["--config", str(cfg), "--set", "human_labels.error_value=yes", "--print-config"])
    assert stop.value.code == 0
    lines = {line.split(":")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["human_labels.error_value"].endswith("# --set human_labels.error_value=yes")
    assert lines["human_labels.error_value"].startswith("human_labels.error_value: yes ")
    assert lines["human_labels.ok_value"].endswith("# env RECEVAL__HUMAN_LABELS__OK_VALUE")
    assert lines["runtime.batch_size"].endswith(f"# --config {cfg}")
    assert lines["spark.master"].endswith("# conf/profiles/local.yaml")
    assert lines["models.nli.path"].endswith("# conf/models/offline.yaml")
    assert lines["runtime.max_length"].endswith("# conf/defaults.yaml")
    # A default names the file that declares its section: a room's settings, or the platform's config.
    assert lines["pipeline.batch_chains"].endswith("# default (jobs/receval/settings.py)")
    assert lines["spark.log_level"].endswith("# default (jobs/infra/config.py)")


def test_quoted_override_is_the_text_inside_the_quotes():
    settings = load_settings(overrides=['human_labels.error_value="yes"', "runtime.batch_size='64'"], environ={})
    assert settings.human_labels.error_value == "yes"  # not '"yes"'
    assert settings.runtime.batch_size == 64


# The defaults and scoring hashes as they were when every room's sections still lived in jobs/infra/config.py
# (commit 34ece97, then main's processbench section and human_labels.companion_labels): composing the settings
# from the rooms (issue 29) must change none of them. A change of a default is a change of behaviour: it updates
# tests/data/config_defaults.json in the same commit, regenerated with `python -c "import json; from
# jobs.infra.config_layers import load_settings; print(json.dumps(load_settings(environ={}).model_dump(mode='json'),
# indent=1, ensure_ascii=False))"`.
DEFAULTS_DUMP = Path(__file__).parent / "data" / "config_defaults.json"
SECTION_ORDER = [
    "profile", "spark", "paths", "mlflow", "models", "runtime", "ingest", "steps", "nli", "pvi", "train_pvi",
    "train_nli", "aggregate", "perturb", "meta_eval", "localise", "processbench", "human_labels", "baselines",
    "select", "sample", "curation", "cot", "pipeline", "log", "maintain", "export",
]


def test_default_settings_dump_equals_the_pinned_one_in_order():
    import json

    pinned = json.loads(DEFAULTS_DUMP.read_text())
    dumped = load_settings(environ={}).model_dump(mode="json")
    assert dumped == pinned
    # print-config and MLflow params list the settings in this order: the order is part of the output.
    assert json.dumps(dumped) == json.dumps(pinned)


def test_settings_sections_keep_their_order():
    from jobs.infra.config import Settings

    assert list(type(load_settings(environ={})).model_fields) == SECTION_ORDER
    assert list(type(Settings()).model_fields) == SECTION_ORDER


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # issue 55: nli.inter_history / intra_history and pvi.intra_history became `relevant` (bounded premises for
        # long chains) with their top_k / recent sizes: every default hash changed. Before: 0682b5bc241c82e1,
        # 890332a38a477099, f970f956f85de430, 2a513410bd72b20c.
        ([], "a02976d03fa97978"),
        # issue 30: the small profile's information-gain model became gemma3-270m (causal); was 5238cd2b3d206975
        (["models.profile=small", "steps.extractor=spacy", "steps.batch_size=8"], "c5980dc060efccd5"),
        (["nli.intra_history=2", "pvi.empty_premises=none", "runtime.max_length=256", "pvi.max_length=128"],
         "73f60421e76f2555"),
        (["models.profile=paper"], "4f98264078238186"),
        # the official options hash as before the relevant ones existed: a lake scored with them keeps its rows
        (["nli.inter_history=all", "nli.intra_history=all", "pvi.intra_history=all"], "0682b5bc241c82e1"),
        (["nli.inter_history=all", "nli.intra_history=2", "pvi.intra_history=all", "pvi.empty_premises=none",
          "runtime.max_length=256", "pvi.max_length=128"], "f970f956f85de430"),
    ],
)
def test_scoring_hash_is_the_pinned_one(overrides, expected):
    # Every table row is keyed by this hash: a change orphans every score already in the lake.
    assert load_settings(overrides=overrides, environ={}).scoring_hash() == expected


def test_settings_without_arguments_hash_as_the_defaults():
    from jobs.infra.config import Settings

    assert Settings().scoring_hash() == "a02976d03fa97978"
    assert Settings(steps={"extractor": "spacy"}).steps.extractor == "spacy"


def test_settings_model_refuses_sections_it_cannot_order_or_hash(monkeypatch):
    # A room's section joins Settings by its ClassVars alone: two in one place, or two hash keys alike, would
    # change print-config or the scoring hash silently.
    from typing import ClassVar

    from jobs.infra import config

    class Twin(config.Section):
        order: ClassVar[int] = config.SparkSettings.order

    class Unplaced(config.Section):
        pass

    class Clash(config.Section):
        order: ClassVar[int] = 5
        scoring_fields: ClassVar[tuple[str, ...]] = ("max_length",)

    for name, section, match in [("twin", Twin, "'twin' needs an `order` of its own"),
                                 ("unplaced", Unplaced, "'unplaced' needs an `order`"),
                                 ("clash", Clash, "same key into the scoring hash")]:
        monkeypatch.setattr(config, "room_sections", lambda name=name, section=section: {name: section})
        with pytest.raises(TypeError, match=match):
            config.settings_model.__wrapped__()
    monkeypatch.undo()
    assert list(config.settings_model.__wrapped__().model_fields) == SECTION_ORDER
