"""`chain_scores` + `step_scores` + `steps` + `chains` + `quarantine` (one pipeline run) -> a self-contained HTML report
for MLflow and `<lake>/_reports/`.

Chains are untrusted model output: every piece of text goes through `html.escape`, images are inline
base64 PNGs and the information-gain curves inline SVG built from numbers only, so the file opens offline
and nothing in a chain can add markup or script.
"""

from __future__ import annotations

import base64
import html
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from schemas import chain_scores as CS
from schemas import chains as C
from schemas import curation as CU
from schemas import metrics as MR
from schemas import quarantine as Q
from schemas import step_scores as SS
from schemas import steps as ST

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.hist{display:inline-block;margin:4px}
.chain{border:1px solid #ccc;border-radius:6px;padding:8px 12px;margin:10px 0;background:#fcfcfc}
.chain ol{margin:4px 0 4px 18px;padding:0}.chain li{margin:2px 0}
.worst{background:#ffe3e3;border-left:4px solid #d33;padding-left:4px}
.why{font-size:13px;margin:6px 0}.why td:first-child{width:220px;color:#555}
.muted{color:#777;font-size:12px}.ctx{font-size:13px;color:#333;white-space:pre-wrap}
.pass{color:#1a7f37}.fail{color:#c62828}
"""


def esc(value: Any) -> str:
    """Text for HTML: escaped, quotes included (chains are untrusted)."""
    return html.escape("" if value is None else str(value), quote=True)


def num(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return esc(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    head = f"<tr>{head}</tr>" if headers else ""
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{num(v)}</td>' if isinstance(v, (int, float)) and not isinstance(v, bool)
            else f"<td>{esc(v)}</td>"
            for v in row
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def png_img(data: bytes, alt: str) -> str:
    return f'<img class="hist" alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def curve_svg(values: Sequence[float | None], highlight: int | None, width: int = 260, height: int = 70) -> str:
    """L(k) for k = 0..n as an inline SVG line; the point after the highlighted step in red. Numbers only."""
    pts = [(i, v) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    if len(pts) < 2:
        return '<span class="muted">(no information-gain curve)</span>'
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    span = (hi - lo) or 1.0
    n = max(len(values) - 1, 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        return 8 + (width - 16) * i / n, 6 + (height - 12) * (1 - (v - lo) / span)

    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in pts))
    dots = []
    for i, v in pts:
        x, y = xy(i, v)
        hot = highlight is not None and i == highlight + 1
        dots.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{4 if hot else 2.5}" fill="{"#d33" if hot else "#4c72b0"}"/>')
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="L(k) over steps">'
        f'<polyline fill="none" stroke="#4c72b0" stroke-width="1.5" points="{line}"/>{"".join(dots)}'
        f'<text x="{width - 8}" y="{height - 2}" font-size="9" text-anchor="end" fill="#777">k = 0..{n}</text></svg>'
    )


def _scope(spark: SparkSession, settings: Settings, run_id: str) -> tuple[DataFrame, str]:
    """This run's chains (decided by curation in this run), else every chain under the config hash."""
    config_hash = settings.scoring_hash()
    scores = tables.read(spark, settings.table("chain_scores"), CS.SCHEMA).where(F.col(CS.CONFIG_HASH) == config_hash)
    this_run = (
        tables.read(spark, settings.table("curation"))
        .where((F.col(CU.RUN_ID) == run_id) & (F.col(CU.CONFIG_HASH) == config_hash))
        .select(CU.CHAIN_ID)
        if tables.exists(spark, settings.table("curation"))
        else None
    )
    if this_run is not None and this_run.limit(1).count():
        return scores.join(this_run, CS.CHAIN_ID, "left_semi"), "chains curated in this run"
    return scores, "no chain was curated in this run: all chains scored under this config hash"


def worst_chains(scores: DataFrame, n: int) -> dict[str, list[dict[str, Any]]]:
    """metric -> the n chains with the lowest chain score (nulls last, then chain_id for a stable order)."""
    out = {}
    for metric in CS.metric_names():
        col = CS.min_col(metric)
        rows = scores.where(F.col(col).isNotNull()).orderBy(F.col(col).asc(), F.col(CS.CHAIN_ID)).limit(n).collect()
        out[metric] = [r.asDict() for r in rows]
    return out


def _details(spark: SparkSession, settings: Settings, ids: list[str]) -> dict[str, dict[str, Any]]:
    """chain_id -> chain row, its steps and step scores (only the few chains shown reach the driver)."""
    if not ids:
        return {}
    config_hash = settings.scoring_hash()
    id_df = spark.createDataFrame([(i,) for i in ids], "chain_id string")
    chains = tables.read(spark, settings.table("chains"), C.SCHEMA).join(id_df, C.CHAIN_ID, "left_semi").collect()
    steps = (
        tables.read(spark, settings.table("steps"), ST.SCHEMA)
        .where(F.col(ST.CONFIG_HASH) == config_hash)
        .join(id_df, ST.CHAIN_ID, "left_semi")
        .collect()
    )
    scores = (
        tables.read(spark, settings.table("step_scores"), SS.SCHEMA)
        .where(F.col(SS.CONFIG_HASH) == config_hash)
        .join(id_df, SS.CHAIN_ID, "left_semi")
        .collect()
    )
    out: dict[str, dict[str, Any]] = {r[C.CHAIN_ID]: {"chain": r.asDict(), "steps": {}, "scores": {}} for r in chains}
    for r in steps:
        out.setdefault(r[ST.CHAIN_ID], {"chain": {}, "steps": {}, "scores": {}})["steps"][r[ST.STEP_IDX]] = r.asDict()
    for r in scores:
        out.setdefault(r[SS.CHAIN_ID], {"chain": {}, "steps": {}, "scores": {}})["scores"][r[SS.STEP_IDX]] = r.asDict()
    return out


def _why(metric: str, step: dict[str, Any], score: dict[str, Any]) -> str:
    rows = [
        ("premise RCUs", " | ".join(step.get(ST.PREMISE_RCUS) or []) or "(none)"),
        ("conclusion RCU", step.get(ST.CONCLUSION_RCU)),
        ("intra-step premise used", score.get(SS.INTRA_PREMISE) or "(none: score 1.0 by definition)"),
        (SS.INTRA_ENTAIL, num(score.get(SS.INTRA_ENTAIL))),
        ("inter (1 - max contradiction)", num(score.get(SS.INTER))),
        (
            "most contradicting premise",
            f"{score.get(SS.INTER_WORST_PREMISE) or '(none)'}  [{score.get(SS.INTER_WORST_SOURCE) or '-'}, "
            f"P(contradiction) = {num(score.get(SS.INTER_MAX_CONTRADICTION))}]",
        ),
        (
            "intra_pvi = log p_g - log p_g'",
            f"{num(score.get(SS.INTRA_PVI))} = {num(score.get(SS.PVI_G))} - {num(score.get(SS.PVI_NULL))}",
        ),
        (
            "info_gain = L(i) - L(i-1)",
            f"{num(score.get(SS.INFO_GAIN))} = {num(score.get(SS.IG_L))} - {num(score.get(SS.IG_L_PREV))}",
        ),
    ]
    # A registered step score the rows above do not explain part by part still shows its value at this step, and
    # what its registry entry names as the reason (arith_valid, arith_errors: `18 - 6 = 13 (is 12)`).
    others = [m for m in MR.of_table(MR.STEP_SCORES) if m.name not in _EXPLAINED]
    shown: set[str] = set()
    for m in others:
        detail = score.get(m.detail) if m.detail and m.detail not in shown else None
        shown.add(m.detail or "")
        rows.append((m.name, num(score.get(m.name)) + (f" — {esc(detail)}" if detail else "")))
    numeric = _NUMERIC_ROWS | {m.name for m in others}  # num() and esc() have escaped them already
    body = "".join(f"<tr><td>{esc(k)}</td><td>{v if k in numeric else esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="why">{body}</table>'


_NUMERIC_ROWS = {SS.INTRA_ENTAIL, "inter (1 - max contradiction)"}
# The step scores the rows of `_why` explain with the numbers they came from.
_EXPLAINED = {SS.INTRA_ENTAIL, SS.INTER, SS.INTRA_PVI, SS.INFO_GAIN}


def _worst_cls(hot: bool) -> str:
    return ' class="worst"' if hot else ""


def _chain_block(metric: str, row: dict[str, Any], detail: dict[str, Any] | None) -> str:
    worst = row.get(CS.worst_step_col(metric))
    head = (
        f"<b>{esc(row[CS.CHAIN_ID])}</b> — {esc(metric)} = {num(row.get(CS.min_col(metric)))} "
        f"(worst step {esc(worst)} of {esc(row.get(CS.N_STEPS))})"
    )
    if not detail:
        return f'<div class="chain">{head}<div class="muted">chain text not found</div></div>'
    chain, steps, scores = detail["chain"], detail["steps"], detail["scores"]
    context = chain.get(C.CONTEXT) or ""
    question = chain.get(C.QUESTION)
    items = []
    for idx in sorted(steps):
        items.append(f"<li{_worst_cls(idx == worst)}>{esc(steps[idx].get(ST.STEP_TEXT))}</li>")
    if not items and chain.get(C.STEPS):
        items = [f"<li{_worst_cls(i == worst)}>{esc(s)}</li>" for i, s in enumerate(chain[C.STEPS])]
    # L(0) is the first step's L(i-1); L(k) the k-th step's L(i).
    ordered = [scores[i] for i in sorted(scores)]
    curve = ([ordered[0].get(SS.IG_L_PREV)] + [s.get(SS.IG_L) for s in ordered]) if ordered else []
    why = _why(metric, steps.get(worst, {}), scores.get(worst, {})) if worst is not None else ""
    return (
        f'<div class="chain">{head}'
        f'<div class="ctx"><b>Context:</b> {esc(context)}</div>'
        + (f'<div class="ctx"><b>Question:</b> {esc(question)}</div>' if question else "")
        + f"<ol start=\"0\">{''.join(items)}</ol>"
        f"<div><b>Predicted answer:</b> {esc(chain.get(C.ANSWER))} &nbsp; <b>Gold:</b> {esc(chain.get(C.GOLD_ANSWER))}</div>"
        f"<div class=\"why\"><b>Why step {esc(worst)} scored low</b>{why}</div>"
        f"<div><b>Information gain curve</b> L(k), k = 0..n (red: after the worst step)<br>"
        f"{curve_svg(curve, worst)}</div></div>"
    )


def render(
    *,
    title: str,
    meta: Sequence[tuple[str, Any]],
    table_rows: Sequence[Sequence[Any]],
    stage_rows: Sequence[Sequence[Any]],
    curation: Any,
    scope_note: str,
    worst: dict[str, list[dict[str, Any]]],
    details: dict[str, dict[str, Any]],
    quarantine: Sequence[Sequence[Any]] = (),
    nights_png: bytes | None = None,
) -> str:
    """The HTML page from plain values (no Spark): every text escaped. `quarantine`: (stage, reason, rows in
    this run, rows in all); `nights_png`: the chain-score distributions night over night."""
    parts = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        table([], meta),
        "<h2>Counts</h2>",
        table(["table", "rows", "new rows", "version before", "version after"], table_rows),
        "<h2>Stages</h2>",
        table(["stage", "chains", "seconds", "chains/s"], stage_rows),
        "<h2>Curation</h2>",
    ]
    if curation is None or not curation.counts.get("batch"):
        parts.append('<p class="muted">No chains were curated in this run.</p>')
    else:
        c = curation.counts
        parts.append(
            f"<p>{c['batch']} chains: <span class=\"pass\">{c['run_passed']} curated</span>, "
            f"<span class=\"fail\">{c['run_failed']} rejected</span> "
            f"(pass rate {curation.pass_rates.get('all', 0.0):.1%}).</p>"
        )
        if not curation.rules:
            parts.append('<p class="muted">No rules configured (curation.*): every chain passes.</p>')
        parts.append(
            table(
                ["rule", "bound", "pass rate"],
                [(r["id"], r["bound"], curation.pass_rates.get(r["id"])) for r in curation.rules],
            )
        )
        if curation.labels:
            parts.append("<h3>Filter against labels (positive = label 1, clean)</h3>")
            parts.append(
                table(
                    ["label", "precision", "recall", "chains"],
                    [(k, v["precision"], v["recall"], int(v["n"])) for k, v in sorted(curation.labels.items())],
                )
            )
        parts.append("<h3>Score distributions (chain score = min over steps; dashed: rule bounds)</h3>")
        parts.extend(png_img(png, f"histogram of {m}") for m, png in curation.histograms.items())
    parts.append("<h2>Quarantine by reason</h2>")
    if quarantine:
        parts.append(table(["stage", "reason", "this run", "all runs"], quarantine))
    else:
        parts.append('<p class="muted">The quarantine is empty.</p>')
    parts.append("<h2>Chain scores night over night</h2>")
    if nights_png is not None:
        parts.append('<p class="muted">Per night (UTC date the chains were scored, this config hash): '
                     "box 25-75 %, line median, whiskers 5-95 %.</p>")
        parts.append(png_img(nights_png, "chain-score distributions per night"))
    else:
        parts.append('<p class="muted">No chains scored under this config hash yet.</p>')
    parts.append(f"<h2>Worst chains per metric</h2><p class=\"muted\">Scope: {esc(scope_note)}.</p>")
    for metric, rows in worst.items():
        parts.append(f"<h3>{esc(metric)}</h3>")
        if not rows:
            parts.append('<p class="muted">no scored chains</p>')
        parts.extend(_chain_block(metric, r, details.get(r[CS.CHAIN_ID])) for r in rows)
    parts.append("</body></html>")
    return "\n".join(parts)


def build(spark: SparkSession, settings: Settings, summary: Any) -> str:
    """The report of one pipeline run (`night_summary.Summary`)."""
    scores, scope_note = _scope(spark, settings, summary.run_id)
    worst = worst_chains(scores, settings.pipeline.report_worst_n)
    ids = sorted({r[CS.CHAIN_ID] for rows in worst.values() for r in rows})
    details = _details(spark, settings, ids)
    m = settings.models
    meta = [
        ("run", summary.run_id),
        ("date", time.strftime("%Y-%m-%d %H:%M:%S %Z")),
        ("config hash", summary.config_hash),
        ("models", f"profile {m.profile}: NLI {m.nli.path}, PVI g {m.pvi_g.path}, g' {m.pvi_null.path}, "
                   f"info gain {m.info_gain.path}"),
        ("input", settings.ingest.input),
        ("lake", settings.table("")),
    ]
    table_rows = [
        (name, summary.rows_after.get(name, 0), summary.rows_after.get(name, 0) - summary.rows_before.get(name, 0),
         "-" if summary.versions_before.get(name) is None else str(summary.versions_before[name]),
         "-" if summary.versions_after.get(name) is None else str(summary.versions_after[name]))
        for name in summary.rows_after
    ]
    stage_rows = [(s.name, s.chains, s.seconds, s.rate) for s in summary.stages]
    config_hash = settings.scoring_hash()
    all_scores = tables.read(spark, settings.table("chain_scores"), CS.SCHEMA).where(F.col(CS.CONFIG_HASH) == config_hash)
    return render(
        title="ReCEval nightly scoring report",
        meta=meta,
        table_rows=table_rows,
        stage_rows=stage_rows,
        curation=summary.curation,
        scope_note=scope_note,
        worst=worst,
        details=details,
        quarantine=quarantine_by_reason(spark, settings, summary.run_id),
        nights_png=nights_png(night_quantiles(all_scores)),
    )


def quarantine_by_reason(spark: SparkSession, settings: Settings, run_id: str) -> list[tuple[str, str, int, int]]:
    """(stage, reason, rows this run quarantined, rows in the table), most frequent first."""
    path = settings.table("quarantine")
    if not tables.exists(spark, path):
        return []
    rows = (
        tables.read(spark, path).groupBy(Q.STAGE, Q.REASON)
        .agg(F.count(F.when(F.col(Q.RUN_ID) == run_id, 1)).alias("run"), F.count(F.lit(1)).alias("all"))
        .orderBy(F.col("run").desc(), F.col("all").desc(), Q.STAGE, Q.REASON).collect()
    )
    return [(r[Q.STAGE], r[Q.REASON], int(r["run"]), int(r["all"])) for r in rows]


QUANTILES = [0.05, 0.25, 0.5, 0.75, 0.95]


def night_quantiles(scores: DataFrame, nights: int = 14) -> dict[str, list[tuple[str, list[float]]]]:
    """metric -> [(night, its chain-score quantiles QUANTILES)] for the last `nights` nights (UTC scoring date)."""
    night = F.date_format(F.col(CS.SCORED_AT), "yyyy-MM-dd").alias("night")
    metrics = CS.metric_names()
    aggs = [F.percentile_approx(CS.min_col(m), QUANTILES).alias(m) for m in metrics]
    rows = scores.groupBy(night).agg(*aggs).orderBy(F.col("night").desc()).limit(nights).collect()
    out: dict[str, list[tuple[str, list[float]]]] = {m: [] for m in metrics}
    for r in sorted(rows, key=lambda r: r["night"] or ""):
        for m in metrics:
            if r["night"] is not None and r[m] is not None:
                out[m].append((r["night"], [float(v) for v in r[m]]))
    return out


def nights_png(quantiles: dict[str, list[tuple[str, list[float]]]]) -> bytes | None:
    """One box per night and metric from precomputed quantiles (matplotlib's bxp; no raw scores needed)."""
    if not any(quantiles.values()):
        return None
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(quantiles), figsize=(4 * len(quantiles), 3), squeeze=False)
    for ax, (metric, per_night) in zip(axes[0], quantiles.items(), strict=True):
        stats = [{"label": n[5:], "whislo": q[0], "q1": q[1], "med": q[2], "q3": q[3], "whishi": q[4], "fliers": []}
                 for n, q in per_night]
        if stats:
            ax.bxp(stats, showfliers=False)
        ax.set_title(f"{metric} (chain min)", fontsize=9)
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


def save(settings: Settings, run_id: str, html_text: str) -> str:
    """The report next to the lake (`<lake>/_reports/`), readable without MLflow."""
    from jobs.infra.config_paths import resolve_path

    folder = resolve_path(settings.paths.lake) / "_reports"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%S')}_{run_id}.html"
    path.write_text(html_text)
    return str(path)
