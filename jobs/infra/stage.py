"""A stage, declared once, and the one command line every stage runs through.

Every job module exports `STAGE = Stage(...)`: its name, the Delta tables it reads and writes, its settings
section, its own flags and its body. `Stage.main(argv)` gives every stage the same entry point: `--config`,
`--set`, `--print-config`, `--dry-run` and `--help`, one Spark session, one MLflow run (jobs.infra.tracking)
with the tables it read and wrote as dataset lineage (jobs.infra.lineage), logs and the heartbeat.

Started as a program (`python -m <module>`: every module's main block is `main()`; `receval <name>`, which calls
`STAGE.main` with its arguments, jobs.infra.cli), a stage chooses its model profile as the night does
(`with_built_models`: the `small` profile once `make models` built it, unless a layer chose one), so a stage run
alone writes its rows under the night's config hash; an expected failure (`StageFailed`) ends it with one line and
exit status 1. The nightly
pipeline builds its plan, its dry-run and the lineage its child runs record from the stages it is made of
(`parts`), so a stage's tables are written down in one place.

The platform finds the stages without knowing them: `declared()` walks the `jobs` package and collects every
module's `STAGE`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from jobs.infra import claim, lineage, tables
from jobs.infra.args import add_settings_arguments, settings_arguments
from jobs.infra.config import ConfigError, Settings
from jobs.infra.config_describe import describe, source_of
from jobs.infra.config_layers import load_settings_with_sources
from jobs.infra.tracking import JobRun, job_run, skipped_run
from udfs.model_paths import small_built

Tables = tuple[str, ...] | Callable[[Settings], tuple[str, ...]]


class StageFailed(RuntimeError):
    """A failure a stage expects and has already logged (its MLflow run ended FAILED): `Stage.main` ends with
    `error: <message>` and exit status 1, no traceback (ingest's QuarantineLimitError)."""


def with_built_models(
    argv: Sequence[str], environ: Mapping[str, str] | None = None, root: str | os.PathLike[str] | None = None
) -> list[str]:
    """A job's command line with `--set models.profile=small` added when the small profile's models are built
    (udfs.model_paths.small_built) and no layer but conf/defaults.yaml chooses a model profile: `make run` then
    scores with real models once `make models` has run, and any profile chosen on the command line, in the
    environment or a --config file still wins."""
    known = settings_arguments(argv)
    try:
        _, sources = load_settings_with_sources(known.config, known.overrides, environ)
    except ConfigError:
        return list(argv)  # the job itself reports the bad configuration
    # The default profile's own file repeats its name: only those two layers mean "nobody chose".
    chosen = not source_of("models.profile", sources).startswith(("conf/defaults.yaml", "conf/models/"))
    return list(argv) if chosen or not small_built(root) else [*argv, "--set", "models.profile=small"]


def command_line(argv: Sequence[str] | None = None) -> list[str]:
    """The arguments a stage runs with: `argv` as given (a test or a caller chooses every layer itself), or, when
    None, this process's command line (sys.argv[1:]) with the model profile the night chooses (with_built_models;
    `receval NAME ARGS` passes its ARGS through it too): `python -m`, `receval` and the pipeline then score with
    the same models, under the same config hash."""
    return list(argv) if argv is not None else with_built_models(sys.argv[1:])


@dataclass(frozen=True)
class Job:
    """What a stage's body gets: the session (None for a stage that needs no Spark), the settings, its MLflow
    run and its parsed command line (the stage's own flags included)."""

    spark: SparkSession | None
    settings: Settings
    tracked: JobRun
    args: argparse.Namespace


@dataclass(frozen=True)
class Stage:
    """One job, declared once.

    `reads`/`writes` are table names, or a function of the settings where a setting decides (curate reads
    `step_scores` only with curation.step_thresholds). `check` runs before any session or run (a missing model
    or a refused split fails with nothing touched); `plan` adds the stage's own dry-run lines (what it would
    do) above the table lines; `run_name` names the MLflow run from the flags (`maintain_restore`). A stage
    with `parts` is a composition (the pipeline): its dry-run and lineage are its parts'; one without a body
    runs only as a part.
    """

    name: str
    doc: str
    body: Callable[[Job], Any] | None = None
    reads: Tables = ()
    writes: Tables = ()
    section: str | None = None
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    check: Callable[[Settings, argparse.Namespace], None] | None = None
    plan: Callable[[SparkSession | None, Settings, argparse.Namespace], list[str]] | None = None
    run_name: Callable[[argparse.Namespace], str] | None = None
    uses_spark: bool = True
    parts: tuple[Stage, ...] = field(default=())
    # False for a stage that only rewrites tables that exist (maintain): its dry-run says an absent table is left
    # alone rather than created.
    creates_tables: bool = True

    def inputs(self, settings: Settings) -> tuple[str, ...]:
        return self.reads(settings) if callable(self.reads) else self.reads

    def outputs(self, settings: Settings) -> tuple[str, ...]:
        return self.writes(settings) if callable(self.writes) else self.writes

    def written(self, settings: Settings) -> tuple[str, ...]:
        """Every table a run of the stage writes: its own, and its parts' for a composition (the pipeline)."""
        names = [*self.outputs(settings), *(n for part in self.parts for n in part.written(settings))]
        return tuple(dict.fromkeys(names))

    def parser(self, prog: str | None = None) -> argparse.ArgumentParser:
        """The command line: the stage's own flags, then the ones every stage has. `prog` names the command in
        --help (`receval NAME`; None: argparse's own, from sys.argv[0])."""
        epilog = f"settings: the `{self.section}` section (see --print-config)" if self.section else None
        parser = argparse.ArgumentParser(
            prog=prog, description=self.doc, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        if self.arguments is not None:
            self.arguments(parser)
        add_settings_arguments(parser)
        parser.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")
        parser.add_argument(
            "--dry-run", action="store_true", help="print what the stage would read, do and write; change nothing"
        )
        if self.writes or self.parts:
            parser.add_argument(
                "--force", action="store_true",
                help="take the lake's claim even from a live run (logged; docs/OPERATIONS.md, Overlapping runs)")
        return parser

    def main(self, argv: Sequence[str] | None = None, prog: str | None = None) -> Any:
        """`python -m <the stage's module>`, `receval NAME`: parse, check, then run the body inside one MLflow run.
        `argv` None: this process's command line, with the night's model profile (command_line); `prog`: the
        command its --help names."""
        args = self.parser(prog).parse_args(command_line(argv))
        settings, sources = load_settings_with_sources(args.config, args.overrides)
        if args.print_config:
            print(describe(settings, sources))
            raise SystemExit(0)
        if self.check is not None:
            self.check(settings, args)
        if self.body is None and not args.dry_run:
            raise SystemExit(f"{self.name} runs only as a part of a composed stage (the pipeline)")
        # A run that writes the lake's tables holds the lake's claim while it runs, taken before Spark starts: a
        # busy lake costs a second run no JVM, and it writes nothing (jobs.infra.claim).
        run_id = uuid.uuid4().hex
        held = None
        if not args.dry_run and self.written(settings):
            name = self.run_name(args) if self.run_name is not None else self.name
            try:
                held = take_claim(settings, self.name, run_id, getattr(args, "force", False), name)
            except claim.LakeBusy as busy:
                print(f"{self.name}: {busy}", file=sys.stderr, flush=True)
                raise SystemExit(claim.EXIT_BUSY) from None
        try:
            return self._run(args, settings, run_id, held)
        except (tables.CommitConflict, claim.ClaimLost) as err:  # the job's log and MLflow run say more
            raise SystemExit(f"{self.name}: error: {err}") from None
        except StageFailed as err:  # already logged, and the MLflow run ended FAILED: no traceback
            raise SystemExit(f"error: {err}") from None
        finally:
            if held is not None:
                claim.release(held)

    def _run(self, args: argparse.Namespace, settings: Settings, run_id: str, held: claim.Claim | None) -> Any:
        spark = None
        if self.uses_spark:
            from jobs.infra.session import build_session

            spark = build_session(settings.spark)
        if args.dry_run:
            print(dry_run(spark, settings, self, args))
            raise SystemExit(0)
        assert self.body is not None
        name = self.run_name(args) if self.run_name is not None else self.name
        # A composition's parts record their own tables (the pipeline's child runs); without Spark, no tables.
        records = spark is not None and not self.parts
        with job_run(settings, name, local_id=run_id) as tracked:
            if held is not None:
                tracked.set_tags(claim_tags(held.holder))
            if records:
                lineage.log_tables(spark, settings, tracked, self.inputs(settings), "input")
            result = self.body(Job(spark, settings, tracked, args))
            if records:
                lineage.log_tables(spark, settings, tracked, self.outputs(settings), "output")
        return result


def take_claim(
    settings: Settings, job: str, run_id: str, force: bool = False, run_name: str | None = None
) -> claim.Claim:
    """The lake's claim for a run that writes its tables, taken as every such run takes it (jobs.infra.claim.take;
    its lines, waiting or taking over, in the jobs' log format). A live holder raises claim.LakeBusy, once the
    skipped run is recorded in MLflow as `run_name` (None: the run would have opened none, so none is recorded):
    `Stage.main` ends with its one line and exit EXIT_BUSY, a caller from code (score_chains) gets the exception."""
    from jobs.infra.logs import setup_logging

    setup_logging(settings.log.level)
    try:
        return claim.take(settings, job, run_id, force=force)
    except claim.LakeBusy as busy:
        if run_name is not None:
            skipped_run(settings, run_name, run_id, str(busy), {
                "lake_claim.holder_run": busy.holder.run_id, "lake_claim.holder_host": busy.holder.host,
                "lake_claim.holder_job": busy.holder.job})
        raise


def claim_tags(holder: claim.Holder) -> dict[str, Any]:
    """The MLflow tags of the run that holds the lake's claim: which generation, on which host, and how it got it."""
    return {"lake_claim.generation": holder.generation, "lake_claim.host": holder.host,
            **({"lake_claim.took_over": holder.took_over} if holder.took_over else {}),
            **({"lake_claim.forced": "true"} if holder.forced else {})}


def settings_of(argv: Sequence[str]) -> Settings:
    """The settings a stage's command line (`--config`, `--set`) resolves to; its other flags are ignored."""
    args = settings_arguments(argv)
    return load_settings_with_sources(args.config, args.overrides)[0]


def table_lines(spark: SparkSession | None, settings: Settings, stage: Stage) -> list[str]:
    """The `reads`/`writes` lines of a stage's dry-run: each table's version and rows (reads Delta logs only)."""
    def line(name: str) -> str:
        return name if spark is None else lineage.table_line(spark, settings, name, stage.creates_tables)

    return [f"  reads  {line(n)}" for n in stage.inputs(settings)] + [
        f"  writes {line(n)}" for n in stage.outputs(settings)
    ]


def dry_run(spark: SparkSession | None, settings: Settings, stage: Stage, args: argparse.Namespace) -> str:
    """What a stage would do: its plan lines, then (unless it is a composition) the tables it would read and
    write with their versions and rows. Reads Delta logs and counts; writes nothing, starts no MLflow run."""
    lines = [f"[dry-run] {stage.name}, config hash {settings.scoring_hash()}: nothing is written; "
             "no MLflow run is created"]
    if stage.plan is not None:
        lines += stage.plan(spark, settings, args)
    if not stage.parts:
        lines += table_lines(spark, settings, stage)
    return "\n".join(lines)


def declaring_modules(package: str = "jobs") -> dict[str, str]:
    """Every stage's name -> the module that declares it (its `STAGE`), for each module under `package` (imports
    them all)."""
    root = importlib.import_module(package)
    found: dict[str, str] = {}
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        stage = getattr(importlib.import_module(info.name), "STAGE", None)
        if isinstance(stage, Stage):
            if stage.name in found:
                raise ValueError(f"two stages named {stage.name!r}: {found[stage.name]} and {info.name}")
            found[stage.name] = info.name
    return found


def declared(package: str = "jobs") -> dict[str, Stage]:
    """Every stage of the project by name: the `STAGE` of each module under `package` (imports them all)."""
    return {name: importlib.import_module(module).STAGE for name, module in declaring_modules(package).items()}
