"""`receval` (jobs/infra/cli.py): its subcommands are the declared stages and the platform's tools, each calls the
main `python -m <module>` calls and exits as it does, and every stage takes the same --config/--set/--print-config/
--dry-run, parsed by the one definition the tools share (jobs/infra/args.py)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time

import pytest

from jobs.infra import claim, cli
from jobs.infra import stage as stage_module
from jobs.infra.args import settings_arguments
from jobs.infra.stage import declared

STAGES = declared()
RUNNABLE = {name: stage for name, stage in STAGES.items() if stage.body is not None}
COMMON = ("--config", "--set", "--print-config", "--dry-run")


def test_the_subcommands_are_the_declared_stages_each_with_its_module():
    modules = cli.stage_modules()
    # The stages declared() finds, each from the module that declares it.
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


def test_a_stage_runs_as_python_m_runs_it(capsys, monkeypatch):
    # The stage's main runs (print-config exits 0 through it), with --set as the stage reads it, and its arguments
    # go through the model-profile choice `python -m`'s main block makes (stage.command_line).
    chosen = []
    choose = stage_module.with_built_models
    monkeypatch.setattr(stage_module, "with_built_models", lambda argv: chosen.append(argv) or choose(argv))
    assert cli.main(["nli-scores", "--set", "log.level=DEBUG", "--print-config"]) == 0
    assert chosen == [["--set", "log.level=DEBUG", "--print-config"]]
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


def test_a_stage_named_unlike_its_module_runs_too(capsys):
    # cot_eval lives in jobs.cot.evaluate: found among every stage, not by its module's name.
    assert cli.main(["cot-eval", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: receval cot-eval ")


SETTINGS_ARGV = ["--config", "conf/profiles/local.yaml", "--set", "log.level=DEBUG", "--set", "paths.lake=/tmp/x"]


def test_stages_and_tools_parse_config_and_set_with_the_one_definition(capsys):
    # A stage, the claim tool and the pre-parser a stage's model profile is chosen with read the same two flags.
    expected = ("conf/profiles/local.yaml", ["log.level=DEBUG", "paths.lake=/tmp/x"])
    staged = STAGES["aggregate"].parser().parse_args(SETTINGS_ARGV)
    claimed = claim.parser().parse_args(["release", *SETTINGS_ARGV])
    pre = settings_arguments([*SETTINGS_ARGV, "--dry-run", "--force"])
    assert {(a.config, tuple(a.overrides)) for a in (staged, claimed, pre)} == {(expected[0], tuple(expected[1]))}
    # ... and describe them alike in --help.
    assert cli.main(["aggregate", "--help"]) == 0
    stage_help = capsys.readouterr().out
    assert cli.main(["claim", "--help"]) == 0
    claim_help = capsys.readouterr().out
    for flag in ("--config FILE", "--set KEY=VALUE"):
        [line] = {line.strip() for line in stage_help.splitlines() if line.strip().startswith(flag)}
        assert line in {line.strip() for line in claim_help.splitlines()}, flag


def test_the_settings_flags_are_defined_once():
    # Every command line of the project that takes --set takes it from jobs/infra/args.py.
    from conftest import PROJECT_ROOT

    copies = [str(path.relative_to(PROJECT_ROOT)) for folder in ("jobs", "scripts", "bench", "tests")
              for path in (PROJECT_ROOT / folder).rglob("*.py")
              if any(f'add_argument("{flag}"' in path.read_text() for flag in ("--set", "--config"))]
    assert copies == ["jobs/infra/args.py"]


def test_receval_claim_shows_and_releases_the_lakes_claim(tmp_path, capsys):
    assert cli.main(["claim", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: receval claim ") and "{show,release}" in out and "--force" in out
    lake = ["--set", f"paths.lake={tmp_path / 'lake'}"]
    assert cli.main(["claim", *lake]) == 0
    assert capsys.readouterr().out.strip().endswith("never claimed")
    # A live run on another host holds it: refused without --force (exit 75), taken and given back with it.
    where = tmp_path / "lake" / claim.FOLDER
    where.mkdir(parents=True)
    now = time.time()
    (where / f"{0:020d}.json").write_text(json.dumps({"run_id": "run-0", "job": "pipeline", "host": "other-host",
                                                      "pid": 1, "user": "someone", "started": now}))
    (where / f"{0:020d}.beat.json").write_text(json.dumps({"at": now, "released": False}))
    assert cli.main(["claim", "release", *lake]) == claim.EXIT_BUSY == claim.main(["release", *lake])
    assert "held by run run-0 (pipeline) on host other-host" in capsys.readouterr().err
    assert claim.generations(where) == [0]
    assert cli.main(["claim", "release", "--force", *lake]) == 0
    assert "released (generation 1 took the claim from run run-0 with --force" in capsys.readouterr().out
    taken = claim.latest(where)
    assert (taken.generation, taken.job, taken.forced, taken.released) == (1, "claim release", True, True)
    assert cli.main(["claim", "release", *lake]) == 0  # free now: nothing to do
    assert "already free (released)" in capsys.readouterr().out
    assert cli.main(["claim", "show", "--force", *lake]) == 2  # --force goes with release only (argparse's exit)


FAKE_TOOL = """import sys

def main(argv=None, prog=None):
    how = argv[0]
    if how == "message":
        raise SystemExit("fake: it failed")
    return {"status": 3, "none": None, "zero": 0}[how]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("how", ["status", "none", "zero", "message"])
def test_a_subcommand_exits_with_the_status_python_m_gives(how, tmp_path, monkeypatch, capsys):
    (tmp_path / "fake_tool.py").write_text(FAKE_TOOL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.TOOLS, "fake", cli.Tool("fake_tool"))
    python_m = subprocess.run([sys.executable, "-m", "fake_tool", how], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert cli.main(["fake", how]) == python_m.returncode
    assert capsys.readouterr().err == python_m.stderr  # a SystemExit's message printed as the interpreter does


def test_a_stage_exits_as_python_m_on_a_bad_command_line(capsys):
    from jobs.cot import paper_tables

    with pytest.raises(SystemExit) as stop:  # what `python -m jobs.cot.paper_tables` (no --run) ends with
        paper_tables.main([])
    assert cli.main(["paper-tables"]) == stop.value.code == 2
    assert "usage: receval paper-tables " in capsys.readouterr().err
