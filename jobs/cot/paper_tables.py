"""`cot_metrics` rows (one run, or two to compare) -> the CoT Collection paper's tables: BBH per task, P3 held-out
per dataset (median over T0 templates), MGSM per language, each x (Direct, CoT) with the average.

Every cell carries its n and a confidence interval: a Wilson score interval for a single task's accuracy (a
binomial proportion: k correct of n), the bootstrap interval `compute_metrics` stored for a median over templates
and for the average (macro mean over tasks: not a proportion). Rendered as rich (printed at the end of the job),
Markdown and CSV (MLflow artifacts), a bar chart (PNG) and a self-contained HTML report (jinja2, autoescaped).

    python -m jobs.cot.paper_tables --run RUN_ID [--run OTHER_RUN_ID] [--out FOLDER]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from jobs.cot.data import BBH_TASKS, MGSM_LANGUAGES
from jobs.infra.config import Settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.stage import Job, Stage
from schemas import cot as S

MODES = ("direct", "cot")
MODE_NAMES = {"direct": "Direct", "cot": "CoT"}
P3_ORDER = ("anli_r1", "anli_r2", "anli_r3", "cb", "copa", "hellaswag", "rte", "story_cloze", "wic", "wsc", "winogrande")
NOT_AVAILABLE = {  # (dataset, row) -> why the paper's row has no value here; the cell says "n/a", a footnote why
    ("p3", "hellaswag"): "HellaSwag: not available. Its validation set is not in the dataset mirror (conf/datasets.yaml, "
    "p3_heldout: the public GitHub copies are Git-LFS pointers or too large to mirror); the Average is over the "
    "datasets present.",
}
TABLES = {  # name -> (dataset in cot_metrics, title, row label, fixed row order)
    "bbh": ("bbh", "BIG-Bench Hard: accuracy per task", "task", BBH_TASKS),
    "p3": ("p3", "P3 held-out (T0): accuracy per dataset, median over T0 templates", "dataset", P3_ORDER),
    "mgsm": ("mgsm", "MGSM: exact-match accuracy per language", "language", MGSM_LANGUAGES),
}
AVERAGE = "Average"
# The random-guess baseline (cot_metrics metric random_guess, the same for every mode and run): one column "Random"
# beside the accuracies, without a CI.
RANDOM_METRIC, RANDOM_COLUMN = "random_guess", "Random"


@dataclass(frozen=True)
class Cell:
    value: float | None  # accuracy in [0, 1]
    low: float | None
    high: float | None
    n: int
    note: str | None = None  # why there is no value

    def text(self, digits: int = 1) -> str:
        if self.value is None:
            return "n/a" if self.note else "–"
        ci = f" [{100 * self.low:.{digits}f}, {100 * self.high:.{digits}f}]" if self.low is not None else ""
        return f"{100 * self.value:.{digits}f}{ci} n={self.n}"


@dataclass
class PaperTable:
    name: str
    title: str
    row_label: str
    columns: list[str]  # "Direct", "CoT" or "A Direct", "B Direct", ...
    rows: list[tuple[str, list[Cell]]] = field(default_factory=list)
    footnotes: list[str] = field(default_factory=list)

    def frame(self) -> pd.DataFrame:
        """Long form: one row per cell (the CSV)."""
        out = []
        for row, cells in self.rows:
            for column, c in zip(self.columns, cells, strict=True):
                out.append({"table": self.name, self.row_label: row, "column": column, "accuracy": c.value,
                            "ci_low": c.low, "ci_high": c.high, "n": c.n, "note": c.note})  # fmt: skip
        return pd.DataFrame(out).rename(columns={self.row_label: "row"})

    def markdown(self) -> str:
        head = f"| {self.row_label} | " + " | ".join(self.columns) + " |"
        rule = "|---|" + "---|" * len(self.columns)
        body = [f"| {row} | " + " | ".join(c.text().replace("|", "/") for c in cells) + " |" for row, cells in self.rows]
        notes = ["", *(f"_{n}_" for n in self.footnotes)] if self.footnotes else []
        return "\n".join([f"**{self.title}** (accuracy %, 95% CI, n)", "", head, rule, *body, *notes])

    def rich(self):  # -> rich.table.Table
        from rich.table import Table

        table = Table(title=self.title, title_justify="left", caption="\n".join(self.footnotes) or None,
                      caption_justify="left")  # fmt: skip
        table.add_column(self.row_label)
        for column in self.columns:
            table.add_column(column, justify="right")
        for i, (row, cells) in enumerate(self.rows):
            table.add_row(row, *(c.text() for c in cells), end_section=i == len(self.rows) - 2)  # rule above Average
        return table


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (scipy's BinomTestResult.proportion_ci)."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def _cell(rows: pd.DataFrame, aggregate: str, group: str, confidence: float, ci: bool = True) -> Cell | None:
    hit = rows[(rows[S.AGGREGATE] == aggregate) & (rows[S.GROUP] == group)]
    if hit.empty:
        return None
    r = hit.iloc[0]
    value, n = float(r[S.VALUE]), int(r[S.N])
    if not ci:  # a baseline, not an estimate
        return Cell(value, None, None, n)
    if aggregate == "task":  # a proportion: k of n
        low, high = wilson(round(value * n), n, confidence)
    else:
        low = None if pd.isna(r[S.CI_LOW]) else float(r[S.CI_LOW])
        high = None if pd.isna(r[S.CI_HIGH]) else float(r[S.CI_HIGH])
    return Cell(value, low, high, n)


def _column(metrics: pd.DataFrame, dataset: str, mode: str, order: Sequence[str], confidence: float,
            metric: str = "accuracy") -> dict[str, Cell]:  # fmt: skip
    rows = metrics[(metrics[S.DATASET] == dataset) & (metrics[S.MODE] == mode) & (metrics[S.METRIC_NAME] == metric)]
    ci = metric != RANDOM_METRIC
    cells: dict[str, Cell] = {}
    groups = set(rows.loc[rows[S.AGGREGATE] == "task", S.GROUP])
    for group in [g for g in order if g in groups] + sorted(groups - set(order)):
        # A templated task (P3) counts with its median over templates, as T0 reports.
        cell = _cell(rows, "median_template", group, confidence, ci) or _cell(rows, "task", group, confidence, ci)
        if cell is not None:
            cells[group] = cell
    average = _cell(rows, "macro", "*", confidence, ci)
    if average is not None:
        cells[AVERAGE] = average
    return cells


def paper_tables(
    runs: Sequence[tuple[str, pd.DataFrame]], confidence: float = 0.95, names: Sequence[str] = tuple(TABLES)
) -> list[PaperTable]:
    """[(label, that run's cot_metrics rows)] -> one table per dataset present; two runs side by side per mode."""
    out = []
    for name in names:
        dataset, title, row_label, order = TABLES[name]
        columns, per_column = [], []
        for mode in MODES:
            for label, metrics in runs:
                cells = _column(metrics, dataset, mode, order, confidence)
                if cells:
                    columns.append(MODE_NAMES[mode] if len(runs) == 1 else f"{label} {MODE_NAMES[mode]}")
                    per_column.append(cells)
        if not per_column:
            continue
        chance = next((c for m in MODES if (c := _column(runs[0][1], dataset, m, order, confidence, RANDOM_METRIC))), {})
        if chance:
            columns.append(RANDOM_COLUMN)
            per_column.append(chance)
        present = {g for cells in per_column for g in cells if g != AVERAGE}
        missing = [g for g in order if (dataset, g) in NOT_AVAILABLE and g not in present]
        groups = [g for g in order if g in present or g in missing] + sorted(present - set(order))
        table = PaperTable(name, title if len(runs) == 1 else f"{title}: " + " vs ".join(lbl for lbl, _ in runs),
                           row_label, columns)  # fmt: skip
        for group in [*groups, AVERAGE]:
            note = NOT_AVAILABLE.get((dataset, group))
            table.rows.append(
                (group, [cells.get(group, Cell(None, None, None, 0, note)) for cells in per_column])
            )
            if note:
                table.footnotes.append(note)
        out.append(table)
    return out


def bar_chart(tables: Sequence[PaperTable]) -> bytes | None:
    """One panel per table: accuracy per row and column with the CI as error bars (PNG)."""
    if not tables:
        return None
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(len(tables), 1, figsize=(12, 3.2 * len(tables)), squeeze=False)
    for ax, table in zip(axes[:, 0], tables, strict=True):
        labels = [row for row, _ in table.rows]
        x = np.arange(len(labels))
        width = 0.8 / max(1, len(table.columns))
        for j, column in enumerate(table.columns):
            cells = [cells[j] for _, cells in table.rows]
            values = [100 * c.value if c.value is not None else 0.0 for c in cells]
            err = [[100 * (c.value - c.low) if c.low is not None else 0.0 for c in cells],
                   [100 * (c.high - c.value) if c.high is not None else 0.0 for c in cells]]  # fmt: skip
            ax.bar(x + j * width, values, width, yerr=err, capsize=2, label=column)
        ax.set_xticks(x + width * (len(table.columns) - 1) / 2, labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("accuracy %")
        ax.set_title(table.title, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


_HTML = """<!doctype html><html><head><meta charset="utf-8"><title>CoT evaluation: {{ heading }}</title>
<style>
body{font-family:system-ui,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:6px 0 18px;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px}th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.avg td{font-weight:600;border-top:2px solid #999}.muted{color:#777;font-size:12px}
</style></head><body>
<h1>CoT evaluation: {{ heading }}</h1>
<p class="muted">{{ note }}</p>
{% for t in tables %}<h2>{{ t.title }}</h2>
<table><tr><th>{{ t.row_label }}</th>{% for c in t.columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for row, cells in t.rows %}<tr{% if row == average %} class="avg"{% endif %}><td>{{ row }}</td>
{% for c in cells %}<td class="num">{{ c.text() }}</td>{% endfor %}</tr>
{% endfor %}</table>{% for n in t.footnotes %}<p class="muted">{{ n }}</p>{% endfor %}{% endfor %}
{% if chart %}<h2>Chart</h2><img alt="accuracy per row, CI as error bars" src="data:image/png;base64,{{ chart }}">{% endif %}
</body></html>"""


def html_report(tables: Sequence[PaperTable], heading: str, note: str, chart: bytes | None) -> str:
    import base64

    from jinja2.sandbox import SandboxedEnvironment

    # Task names and labels come from data and config: escaped, and the template runs sandboxed.
    env = SandboxedEnvironment(autoescape=True)
    return env.from_string(_HTML).render(
        tables=tables, heading=heading, note=note, average=AVERAGE,
        chart=base64.b64encode(chart).decode() if chart else None,
    )  # fmt: skip


NOTE = ("Accuracy in %, [95% CI], n = examples. A task's CI is a Wilson score interval; a P3 dataset's value is "
        "the median over its T0 templates and the Average is the macro mean over tasks, both with a bootstrap "
        "percentile CI (cot.bootstrap_resamples).")  # fmt: skip


def write(tables: Sequence[PaperTable], folder: Path, heading: str, note: str = NOTE) -> dict[str, Path]:
    """tables.md, tables.csv, tables.png, tables.html under `folder`; returns their paths by kind."""
    folder.mkdir(parents=True, exist_ok=True)
    chart = bar_chart(tables)
    paths = {"md": folder / "cot_tables.md", "csv": folder / "cot_tables.csv", "html": folder / "cot_tables.html"}
    paths["md"].write_text(f"{note}\n\n" + "\n\n".join(t.markdown() for t in tables) + "\n")
    records = [r for t in tables for r in t.frame().to_dict("records")]  # one frame: no concat of all-NA columns
    pd.DataFrame(records).to_csv(paths["csv"], index=False)
    paths["html"].write_text(html_report(tables, heading, note, chart))
    if chart:
        paths["png"] = folder / "cot_tables.png"
        paths["png"].write_bytes(chart)
    return paths


def print_tables(tables: Sequence[PaperTable], header: str | None = None) -> None:
    from rich.console import Console

    console = Console(width=160)
    if header:
        console.print(header)
    for table in tables:
        console.print(table.rich())


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", action="append", required=True, help="run id (cot_metrics.run_id); twice to compare")
    parser.add_argument("--label", action="append", help="a label per run (default: A, B)")
    parser.add_argument("--out", default=None, help="folder for md/csv/png/html (default: <lake>/_reports/cot)")


def _check(settings: Settings, args: argparse.Namespace) -> None:
    if len(args.run) > 2:
        raise SystemExit("paper_tables: at most two runs")


def _body(job: Job) -> list[PaperTable]:
    """Tables of one run, or two side by side, from the `cot_metrics` Delta table."""
    from pyspark.sql import functions as F

    settings, args = job.settings, job.args
    metrics = job.spark.read.format("delta").load(settings.table("cot_metrics"))
    labels = args.label or ["A", "B"][: len(args.run)]
    runs = []
    for label, run in zip(labels, args.run, strict=False):
        frame = metrics.where(F.col(S.RUN_ID) == run).toPandas()
        if frame.empty:
            raise SystemExit(f"no cot_metrics rows for run {run!r} in {settings.table('cot_metrics')}")
        runs.append((label, frame))
    tables = paper_tables(runs, settings.cot.confidence)
    print_tables(tables)
    folder = Path(args.out) if args.out else resolve_path(settings.paths.lake) / "_reports" / "cot"
    paths = write(tables, folder, " vs ".join(f"{lbl}={r}" for lbl, r in zip(labels, args.run, strict=False)))
    print(f"written: {', '.join(str(p) for p in paths.values())}")
    return tables


STAGE = Stage("paper_tables", __doc__, _body, reads=("cot_metrics",), section="cot", arguments=_arguments,
              check=_check)


def main(argv: list[str] | None = None) -> list[PaperTable]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()

