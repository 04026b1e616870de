"""`receval`: one command for every stage and tool, the console script of the installed package.

    receval --help                           # every stage and tool, each with its one-line purpose
    receval setup                            # the Delta jars and the tiny offline models into the home folder
    receval pipeline [--config FILE] [--set KEY=VALUE] [--print-config] [--dry-run]
    receval ingest --set ingest.input=/data/outputs/*.jsonl
    receval models fetch gemma3-270m         # python -m jobs.infra.models fetch gemma3-270m
    receval data fetch entailment_bank       # python -m jobs.infra.data fetch entailment_bank
    receval claim show                       # who holds the lake's claim; `release` gives it back

An argparse parser with a subcommand per stage a module under `jobs` declares (`STAGE = Stage(...)`,
jobs.infra.stage.declared, with a body: `scores` runs only inside the pipeline) and per platform tool (TOOLS).
`receval NAME ARGS` calls that command's own `main` with ARGS, untouched: a stage's `STAGE.main`, with the model
profile `python -m` chooses (jobs.infra.stage.with_built_models), a tool's module's `main`; it exits with the
status `python -m <its module> ARGS` exits with. `make` and `python -m` keep working as they are. Every stage
takes the same --config/--set/--print-config/--dry-run (jobs.infra.stage.Stage.parser). Stage names take `-` for
`_` (`receval nli-scores`).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from udfs.model_paths import MODELS

if TYPE_CHECKING:  # imported where a stage is needed: `receval claim` starts without Spark's modules
    from jobs.infra.stage import Stage

PROG = "receval"
_PACKAGE = __package__.rpartition(".")[0]  # "jobs"


@dataclass(frozen=True)
class Tool:
    """A platform tool: its module's `main(argv)` is its command line (sub-commands and --help of its own) and
    returns the exit status its main block gives `python -m` (None: 0)."""

    module: str
    # Its main also takes `prog`, the name its --help shows (`receval NAME`); data and models name themselves
    # `python -m jobs.infra.<tool>` wherever they run.
    takes_prog: bool = True

    def main(self, args: list[str], prog: str) -> int | None:
        main = importlib.import_module(self.module).main
        return main(args, prog) if self.takes_prog else main(args)


TOOLS = {
    "models": Tool("jobs.infra.models", takes_prog=False),
    "data": Tool("jobs.infra.data", takes_prog=False),
    "jars": Tool("jobs.infra.jars"),
    "tiny-models": Tool("jobs.infra.tiny_models"),
    "tracking": Tool("jobs.infra.tracking"),
    "claim": Tool("jobs.infra.claim"),
}
SETUP_PURPOSE = "the Delta jars (Maven Central -> .jars/) and the tiny offline models (-> models/), as make setup"


@dataclass(frozen=True)
class Command:
    name: str
    purpose: str
    run: Callable[[list[str], str], int]  # (its arguments, the name its --help shows) -> exit status


def _first_line(doc: str | None) -> str:
    return next((line.strip() for line in (doc or "").splitlines() if line.strip()), "")


def run_stage(stage: Stage, args: list[str], prog: str) -> int:
    """`receval NAME ARGS` for a stage: what `python -m <its module> ARGS` runs, whose main block reads
    sys.argv[1:] through with_built_models (jobs.infra.stage.command_line), so both score with the same models."""
    from jobs.infra.stage import with_built_models

    stage.main(with_built_models(args), prog)
    return 0  # the main block, `main()`, drops what the stage returns


def run_tool(tool: Tool, args: list[str], prog: str) -> int:
    return tool.main(args, prog) or 0


def setup(args: list[str], prog: str) -> int:
    """`receval setup`: what `make setup` does after installing the Python packages, into the home folder. The jars
    take the command line's --config/--set (spark.jars_dir); the tiny models go where the offline profile names
    them (models/tiny-*, relative to the home folder)."""
    from jobs.infra import jars, tiny_models

    jars.main(args, prog)  # a failed fetch exits with its message
    tiny_models.main(["--out", MODELS], prog)
    return 0


def stage_modules(package: str = _PACKAGE) -> dict[str, str]:
    """Stage name -> module of every stage that runs on its own (it has a body: `scores` runs only inside the
    pipeline), the pipeline first, then by module. Imports every module under `package`."""
    from jobs.infra.stage import declaring_modules

    with warnings.catch_warnings():  # what importing every room's libraries says has no place in --help
        warnings.simplefilter("ignore")
        modules = declaring_modules(package)
        runnable = {n: m for n, m in modules.items() if importlib.import_module(m).STAGE.body is not None}
    return dict(sorted(runnable.items(), key=lambda item: (item[0] != "pipeline", item[1], item[0])))


def stage_command(stage: Stage) -> Command:
    return Command(stage.name, _first_line(stage.doc), partial(run_stage, stage))


def tool_command(name: str) -> Command:
    if name == "setup":
        return Command(name, SETUP_PURPOSE, setup)
    tool = TOOLS[name]
    return Command(name, _first_line(importlib.import_module(tool.module).__doc__), partial(run_tool, tool))


def commands() -> dict[str, Command]:
    """Every command `receval` offers, stages first (the pipeline first among them), then the tools. Imports every
    stage's module, for their docstrings."""
    stages = {name: importlib.import_module(module).STAGE for name, module in stage_modules().items()}
    return {**{n: stage_command(s) for n, s in stages.items()}, **{n: tool_command(n) for n in ("setup", *TOOLS)}}


def _alone(name: str, package: str = _PACKAGE) -> Stage | None:
    """The stage `name` from the module named like it, imported alone (None: no such module or stage, or it runs
    only inside the pipeline): `receval ingest` then imports what `python -m jobs.receval.ingest` imports, not
    every stage's libraries (torch, MLflow: seconds)."""
    from jobs.infra.stage import Stage

    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, prefix=f"{package}."):
        if info.name.rpartition(".")[2] == name:
            stage = getattr(importlib.import_module(info.name), "STAGE", None)
            if isinstance(stage, Stage) and stage.name == name and stage.body is not None:
                return stage
    return None


def command(name: str) -> Command | None:
    """The command `name` runs, importing what it needs: a tool its module, a stage its module (a stage named
    unlike its module, such as cot_eval in jobs.cot.evaluate, every stage's)."""
    if name == "setup" or name in TOOLS:
        return tool_command(name)
    stage_name = name.replace("-", "_")
    alone = _alone(stage_name)
    return stage_command(alone) if alone is not None else commands().get(stage_name)


class _HelpFormatter(argparse.RawTextHelpFormatter):
    """Each purpose on its command's line, as written (unwrapped). argparse measures subcommand names at their
    parent's indent, two columns short of where it prints them, so a name over 11 characters (`paper_tables`)
    got its purpose on the next line."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        for sub in self._iter_indented_subactions(action):
            printed = len(self._format_action_invocation(sub)) + self._current_indent + self._indent_increment
            self._action_max_length = max(self._action_max_length, printed)


def parser(listed: Iterable[Command]) -> argparse.ArgumentParser:
    """receval's command line: a subcommand per command, in order. A subcommand parses nothing itself: what follows
    its name goes to its main, whose own parser says what it means (and answers its --help)."""
    top = argparse.ArgumentParser(
        prog=PROG, description="Every stage and tool of receval-spark, each by name (python -m <its module> too).",
        formatter_class=_HelpFormatter,
        epilog="Relative paths in config resolve against $RECEVAL_HOME, else a checkout's root, else the working "
               "directory; --print-config shows where each setting points.")
    subcommands = top.add_subparsers(
        title="commands", metavar="COMMAND", required=True,
        description=f"The stages first (each takes --config FILE, --set KEY=VALUE, --print-config, --dry-run),\n"
                    f"then the tools ({', '.join(('setup', *TOOLS))}).\n{PROG} COMMAND --help: its own flags.")
    for c in listed:
        # argparse %-formats help text: a purpose's own % sign stays one.
        subcommands.add_parser(c.name, help=c.purpose.replace("%", "%%"), add_help=False).set_defaults(run=c.run)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        parser(commands().values()).print_help()
        return 0 if argv else 2
    found = command(argv[0])
    if found is None:
        known = ", ".join(commands())
        print(f"{PROG}: unknown command {argv[0]!r}; commands: {known} ({PROG} --help says what each does)",
              file=sys.stderr)
        return 2
    # The parser holds the one command named: a run imports that command's module, not every stage's.
    args, rest = parser([found]).parse_known_args([found.name, *argv[1:]])
    try:
        return args.run(rest, f"{PROG} {argv[0]}")
    except SystemExit as stop:  # what `python -m` makes of it
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)  # SystemExit("message"), as the interpreter prints it
        return 1


if __name__ == "__main__":
    sys.exit(main())
