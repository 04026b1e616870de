"""Driver logs: one line format and levels for every job (`log.level`), set up once per process."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _CurrentStderr(logging.StreamHandler):
    """Writes to sys.stderr as it is at each record: pytest and notebooks swap it after the handler is made."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging(level: str = "INFO") -> None:
    """The `jobs` and `udfs` loggers at `level`, one handler, one format; py4j's chatter stays at WARNING."""
    for name in ("jobs", "udfs"):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(isinstance(h, _CurrentStderr) for h in logger.handlers):
            handler = _CurrentStderr()
            handler.setFormatter(logging.Formatter(FORMAT, datefmt="%Y-%m-%dT%H:%M:%S"))
            logger.addHandler(handler)
            # Not also through the root logger: a notebook or test that set one up would print it twice.
            logger.propagate = False
    logging.getLogger("py4j").setLevel(logging.WARNING)
