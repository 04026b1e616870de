"""`receval` (jobs/infra/cli.py): its subcommands are the declared stages and the platform's tools, each runs what
`python -m <module>` runs, and every stage takes the same --config/--set/--print-config/--dry-run."""

from __future__ import annotations

import importlib

import pytest

from jobs.infra import cli
from jobs.infra.stage import declared

STAGES = declared()
RUNNABLE = {name: stage for name, stage in STAGES.items() if stage.body is not None}
COMMON = ("--config", "--set", "--print-config", "--dry-run")


def test_the_subcommands_are_the_declared_stages_each_with_its_module():
    modules = cli.stage_modules()
    # Read from the sources without importing: the same stages declared() imports, each from its own module.
    assert set(modules) == set(RUNNABLE)
    for name, module in modules.items():
        assert importlib.import_module(module).STAGE is STAGES[name], name
    assert "scores" not in modules  # a pipeline part only: `python -m` has nothing to run


def test_help_lists_every_stage_and_tool_with_its_purpose(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    for name, stage in RUNNABLE.items():
        assert lines[name].split(None, 1)[1] == cli._first_line(stage.doc), name
    for tool in ("setup", "models", "data", "jars", "tiny-models", "tracking"):
        assert tool in lines, tool
    assert lines["data"].split(None, 1)[1].startswith("Public datasets by name")
    assert out.index("  pipeline ") < out.index("  ingest ")  # the night first
    assert cli.main([]) == 2  # no command: the same list, as a usage error


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_every_stage_subcommand_takes_the_common_flags(name, capsys):
    assert cli.main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: receval {name} "), out[:200]
    assert all(flag in out for flag in COMMON), out


def test_a_stage_runs_as_python_m_runs_it(capsys):
    # The module's own main block runs (print-config exits 0 through it), with --set as the stage reads it.
    assert cli.main(["nli-scores", "--set", "log.level=DEBUG", "--print-config"]) == 0
    lines = {line.split(":")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["log.level"].endswith("# --set log.level=DEBUG")
    assert lines["nli.intra_history"].endswith("# conf/defaults.yaml")


def test_a_bad_setting_fails_with_the_stages_own_message(capsys):
    from jobs.infra.config import ConfigError

    with pytest.raises(ConfigError, match="runtime.batch_size"):
        cli.main(["aggregate", "--set", "runtime.batch_size=0", "--print-config"])


def test_tools_run_their_own_command_line(capsys):
    assert cli.main(["models", "--help"]) == 0
    assert "fetch" in capsys.readouterr().out
    assert cli.main(["data", "--help"]) == 0
    assert "usage: python -m jobs.infra.data" in capsys.readouterr().out  # the tool names itself as it runs here


def test_an_unknown_command_names_the_commands(capsys):
    assert cli.main(["pipelines"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'pipelines'" in err and "pipeline, " in err and "models" in err
