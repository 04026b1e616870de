"""NLI pair files -> checked pairs for `train_nli`: each source named in `train_nli.use` read (TSV, CSV, JSONL),
its columns and labels checked, EntailmentBank and ROSCOE refused, and a seeded share held out per source.
Plain Python; the training itself is jobs.training.train_nli.
"""

from __future__ import annotations

import csv
import json
import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.infra.config import Settings
from jobs.infra.config_paths import resolve_path
from jobs.training.settings import NLI_LABELS, NliSourceSettings
from udfs.home import command

log = logging.getLogger(__spec__.name)

LABEL2ID = {name: i for i, name in enumerate(NLI_LABELS)}  # entailment 0, neutral 1, contradiction 2
NO_LABEL = -100  # a pair without a gold label (distillation only); ignored by the cross-entropy
# The metrics' own evaluation data: a model trained on it would be scored on what it learned (issue #16 item 4).
REFUSED = ("entailment_bank", "entailmentbank", "roscoe")


class BadTrainingInput(ValueError):
    """A pair file cannot be trained on; the message names the file and the problem."""


@dataclass
class Pairs:
    """One source's pairs: texts and canonical labels (index into NLI_LABELS, NO_LABEL when unlabelled)."""

    source: str
    premises: list[str] = field(default_factory=list)
    hypotheses: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.premises)

    def take(self, idx: Sequence[int], source: str | None = None) -> Pairs:
        return Pairs(source or self.source, [self.premises[i] for i in idx], [self.hypotheses[i] for i in idx],
                     [self.labels[i] for i in idx])

    def extend(self, other: Pairs) -> None:
        self.premises += other.premises
        self.hypotheses += other.hypotheses
        self.labels += other.labels

    @property
    def labelled(self) -> bool:
        return bool(self.labels) and all(y != NO_LABEL for y in self.labels)


# --- reading and checking pair files (plain Python) ---------------------------------------------------------


def refuse_evaluation_data(path: str | Path, settings: Settings | None = None) -> None:
    """Never train on EntailmentBank or ROSCOE: the EB-challenge and the ROSCOE GSM-8K meta-evaluation are built
    from them. Refused by any folder or file name that says so, and by the configured perturbation and human-label
    inputs wherever they live."""
    resolved = resolve_path(path).resolve()
    named = [p for p in resolved.parts if any(r in p.lower().replace("-", "_") for r in REFUSED)]
    configured: set[Path] = set()
    if settings is not None:
        for p in (settings.perturb.eb_task1_test, settings.perturb.eb_task2_test, settings.human_labels.annotated,
                  settings.human_labels.generated):
            if p:
                configured.add(resolve_path(p).resolve())
    if named or resolved in configured:
        raise BadTrainingInput(
            f"{path}: refused, this is EntailmentBank or ROSCOE data, on which the correctness metrics are "
            "meta-evaluated (EB-challenge, ROSCOE GSM-8K); an NLI model trained on it would be graded on what it "
            "learned. Train on other NLI pairs (train_nli.use)"
        )


def _format(src: NliSourceSettings, path: Path) -> str:
    if src.format != "auto":
        return src.format
    suffix = path.suffix.lower()
    return {".tsv": "tsv", ".txt": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}.get(suffix, "")


def read_rows(path: Path, fmt: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, rows) of a header-row TSV/CSV or a JSONL file (columns: the union of the first 1,000 rows' keys)."""
    if fmt in ("tsv", "csv"):
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t" if fmt == "tsv" else ",")
            rows = list(reader)
            return list(reader.fieldnames or []), rows
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise BadTrainingInput(f"{path}: line {n} is not JSON ({err.msg})") from None
                if not isinstance(row, dict):
                    raise BadTrainingInput(f"{path}: line {n} is not a JSON object")
                rows.append(row)
    columns: dict[str, None] = {}
    for row in rows[:1000]:
        columns.update(dict.fromkeys(row))
    return list(columns), rows


def load_source(name: str, src: NliSourceSettings, settings: Settings | None = None,
                teacher: bool = False) -> tuple[Pairs, Pairs]:
    """(pairs to train on, the source's own test-split pairs), checked: every problem names the file."""
    path = resolve_path(src.path, settings.paths.data if settings is not None else None)
    refuse_evaluation_data(path, settings)
    if not path.is_file():
        how = f"data fetch {src.dataset}"
        fetch = f" ({command(f'jobs.infra.{how}', how)})" if src.dataset else ""
        raise BadTrainingInput(f"{path}: source {name!r} file not found{fetch}")
    fmt = _format(src, path)
    if not fmt:
        raise BadTrainingInput(f"{path}: source {name!r}: unknown file type; set train_nli.sources.{name}.format")
    columns, rows = read_rows(path, fmt)
    if not rows:
        raise BadTrainingInput(f"{path}: source {name!r} has no rows (empty file)")
    if src.label is None and not teacher:
        raise BadTrainingInput(f"{path}: source {name!r} has no label field: unlabelled pairs need train_nli.teacher")
    wanted = [src.premise, src.hypothesis, *([src.label] if src.label else []),
              *([src.split_field] if src.split_field else [])]
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise BadTrainingInput(f"{path}: source {name!r} lacks column(s) {missing}; it has {columns[:20]}")
    if src.max_rows is not None:
        rows = rows[: src.max_rows]
    unknown: Counter[str] = Counter()
    empty: list[int] = []
    train, test = Pairs(name), Pairs(f"{name}:test")
    for n, row in enumerate(rows, 1):
        split = str(row.get(src.split_field, "")) if src.split_field else None
        if split is not None and split not in src.train_values and split not in src.test_values:
            continue
        premise, hypothesis = str(row.get(src.premise) or "").strip(), str(row.get(src.hypothesis) or "").strip()
        if not premise or not hypothesis:
            empty.append(n)
            continue
        label = NO_LABEL
        if src.label is not None:
            raw = str(row.get(src.label, "")).strip()
            if raw not in src.labels:
                unknown[raw] += 1
                continue
            label = LABEL2ID[src.labels[raw]]
        target = test if split is not None and split in src.test_values else train
        target.premises.append(premise)
        target.hypotheses.append(hypothesis)
        target.labels.append(label)
    if unknown:
        raise BadTrainingInput(
            f"{path}: source {name!r} has label(s) not in train_nli.sources.{name}.labels: "
            f"{dict(unknown.most_common(10))} (known: {sorted(src.labels)})"
        )
    if empty:
        raise BadTrainingInput(f"{path}: source {name!r}: empty premise or hypothesis in row(s) {empty[:10]}")
    if not train:
        raise BadTrainingInput(f"{path}: source {name!r} has no pairs to train on (split {src.split_field} in "
                               f"{src.train_values})")
    return train, test


def split(pairs: Pairs, holdout: float, seed: int) -> tuple[Pairs, Pairs]:
    """(train, held out): a seeded `holdout` share of the pairs, drawn per source so each is measured."""
    idx = list(range(len(pairs)))
    random.Random(f"{seed}:{pairs.source}").shuffle(idx)  # a str seed hashes stably across runs and machines
    cut = round(len(idx) * holdout)
    return pairs.take(sorted(idx[cut:])), pairs.take(sorted(idx[:cut]), pairs.source)


def load_all(settings: Settings) -> tuple[Pairs, dict[str, Pairs]]:
    """All training pairs and the held-out sets by name (`<source>` holdout, `<source>:test` own test split)."""
    cfg = settings.train_nli
    teacher = cfg.teacher is not None
    train, held = Pairs("train"), {}
    for name in cfg.use:
        pairs, test = load_source(name, cfg.sources[name], settings, teacher)
        kept, out = split(pairs, cfg.holdout, cfg.seed)
        train.extend(kept)
        if len(out):
            held[name] = out
        if len(test):
            held[test.source] = test
        log.info("[train_nli] %s: %d pairs to train on, %d held out, %d in its test split", name, len(kept),
                 len(out), len(test))
    return train, held
