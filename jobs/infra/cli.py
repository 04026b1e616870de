"""`receval`: one command for every stage and tool, the console script of the installed package.

    receval --help                           # every stage and tool, each with its one-line purpose
    receval setup                            # the Delta jars and the tiny offline models into the home folder
    receval pipeline [--config FILE] [--set KEY=VALUE] [--print-config] [--dry-run]
    receval ingest --set ingest.input=/data/outputs/*.jsonl
    receval models fetch gemma3-270m         # python -m jobs.infra.models fetch gemma3-270m
    receval data fetch entailment_bank       # python -m jobs.infra.data fetch entailment_bank

The subcommands are generated: every stage a module under `jobs` declares (`STAGE = Stage(...)`,
jobs.infra.stage.declared, with a main block: `scores` runs only inside the pipeline), plus the platform's
tools (TOOLS). `receval NAME ARGS` runs exactly what `python -m <its module> ARGS` runs: the module as __main__,
so the two can never differ (the model profile they choose included: jobs.infra.stage.command_line), and `make`
and `python -m` keep working as they are. Every stage takes the same --config/--set/--print-config/--dry-run
(jobs.infra.stage.Stage.parser). Stage names take `-` for `_` (`receval nli-scores`).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import runpy
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from udfs.model_paths import MODELS

PROG = "receval"
# The platform's tools: command -> module (each has its own sub-commands and --help).
TOOLS = {
    "models": "jobs.infra.models",
    "data": "jobs.infra.data",
    "jars": "jobs.infra.jars",
    "tiny-models": "jobs.infra.tiny_models",
    "tracking": "jobs.infra.tracking",
}
# `receval setup`: what `make setup` does after installing the Python packages, into the home folder. The jars
# step takes the command line's --config/--set (spark.jars_dir); the tiny models go where the offline profile
# names them (models/tiny-*, relative to the home folder).
SETUP = (("jobs.infra.jars", True), ("jobs.infra.tiny_models", False))
SETUP_PURPOSE = "the Delta jars (Maven Central -> .jars/) and the tiny offline models (-> models/), as make setup"
_PACKAGE = __package__.rpartition(".")[0]  # "jobs"


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    purpose: str
    kind: str  # "stage" or "tool"


def _declared_name(source: str) -> str | None:
    """The name in a module's `STAGE = Stage("name", ...)`, read from its source without importing it."""
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "STAGE" for t in node.targets)
                and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "Stage"
                and node.value.args and isinstance(node.value.args[0], ast.Constant)):
            return node.value.args[0].value
    return None


def stage_modules(package: str = _PACKAGE) -> dict[str, str]:
    """Stage name -> module of every stage that runs on its own, from the modules' sources (no module is imported
    but the packages): `receval NAME` starts as fast as `python -m`. tests/test_cli.py checks it against
    jobs.infra.stage.declared()."""
    found: dict[str, str] = {}
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, prefix=f"{package}."):
        if info.ispkg:
            continue
        spec = importlib.util.find_spec(info.name)
        source = spec.loader.get_source(info.name) if spec is not None and spec.loader is not None else None
        # A stage `python -m` runs has a main block; one without (`scores`) runs only inside the pipeline.
        runnable = source and "STAGE" in source and '__name__ == "__main__"' in source
        if runnable and (name := _declared_name(source)) is not None:
            found[name] = info.name
    return found


def _first_line(doc: str | None) -> str:
    return next((line.strip() for line in (doc or "").splitlines() if line.strip()), "")


def commands() -> dict[str, Command]:
    """Every command `receval` offers, stages first (the pipeline first among them), then the tools. Imports every
    stage's module (jobs.infra.stage.declared), for their docstrings."""
    from jobs.infra.stage import declared

    modules = stage_modules()
    with warnings.catch_warnings():  # what importing every room's libraries says has no place in --help
        warnings.simplefilter("ignore")
        stages = {name: stage for name, stage in declared().items() if name in modules}
    order = sorted(stages, key=lambda n: (n != "pipeline", modules[n], n))
    out = {n: Command(n, modules[n], _first_line(stages[n].doc), "stage") for n in order}
    out["setup"] = Command("setup", "", SETUP_PURPOSE, "tool")
    for name, module in TOOLS.items():
        out[name] = Command(name, module, _first_line(importlib.import_module(module).__doc__), "tool")
    return out


def usage() -> str:
    listed = commands()
    width = max(len(n) for n in listed) + 2
    lines = [f"usage: {PROG} COMMAND [ARGS...]   ({PROG} COMMAND --help: its own flags)", "",
             "Stages (each takes --config FILE, --set KEY=VALUE, --print-config, --dry-run):"]
    lines += [f"  {c.name:<{width}}{c.purpose}" for c in listed.values() if c.kind == "stage"]
    lines += ["", "Tools:"]
    lines += [f"  {c.name:<{width}}{c.purpose}" for c in listed.values() if c.kind == "tool"]
    lines += ["", "Relative paths in config resolve against $RECEVAL_HOME, else a checkout's root, else the working "
              "directory; --print-config shows where each setting points."]
    return "\n".join(lines)


def run_module(module: str, prog: str, args: Sequence[str]) -> int:
    """`python -m module args` in this process: the module runs as __main__ (its own `if __name__ == "__main__"`
    block, as python -m runs it), with sys.argv[0] = prog so its --help names `receval NAME`."""
    saved = sys.argv
    sys.argv = [prog, *args]
    try:
        with warnings.catch_warnings():
            # Where the module was imported before (receval --help in the same process, a test), runpy warns that
            # it runs a second copy as __main__: what `python -m` does too when another module imports it.
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    except SystemExit as stop:
        code = stop.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)  # SystemExit("message"), as the interpreter prints it
        return 1
    finally:
        sys.argv = saved
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "setup":
        for module, takes_settings in SETUP:
            code = run_module(module, f"{PROG} setup", rest if takes_settings else ["--out", MODELS])
            if code:
                return code
        return 0
    if name in TOOLS:
        return run_module(TOOLS[name], f"{PROG} {name}", rest)
    modules = stage_modules()
    stage = name.replace("-", "_")
    if stage in modules:
        return run_module(modules[stage], f"{PROG} {name}", rest)
    known = sorted([*modules, "setup", *TOOLS])
    print(f"{PROG}: unknown command {name!r}; commands: {', '.join(known)} ({PROG} --help says what each does)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
