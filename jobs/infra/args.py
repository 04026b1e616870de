"""The two flags that choose the settings, defined once: `--config FILE` and `--set KEY=VALUE`.

Every stage (jobs.infra.stage.Stage.parser), every tool that reads the settings (claim, models, data, jars, the
benchmarks) and the pre-parsing that looks at the settings before a stage parses its own command line (the model
profile a run chooses, jobs.infra.stage.with_built_models) take them from here, so all of them read
`args.config` and `args.overrides` the same way and pass them to jobs.infra.config_layers.load_settings.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config FILE` (dest `config`) and `--set KEY=VALUE`, repeatable (dest `overrides`) to `parser`."""
    parser.add_argument("--config", metavar="FILE", help="YAML file layered over conf/defaults.yaml and the profiles")
    parser.add_argument(
        "--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
        help="one setting (section.key=value), over --config and the environment; repeatable")


def settings_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """The `config` and `overrides` of a command line; its other flags and arguments are left alone."""
    parser = argparse.ArgumentParser(add_help=False)
    add_settings_arguments(parser)
    return parser.parse_known_args(list(argv))[0]
