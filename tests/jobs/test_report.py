"""HTML run report: escaping of untrusted chain text, worst-step highlighting, rendering in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from jobs.receval import report
from jobs.receval.curate import CurationResult
from schemas import chain_scores as CS
from schemas import step_scores as SS
from schemas import steps as ST

HOSTILE = '<script>alert("x")</script><img src=x onerror="alert(1)">'


def _chain(chain_id: str, texts: list[str], worst: int, ie: float) -> tuple[dict, dict]:
    row = {CS.CHAIN_ID: chain_id, CS.N_STEPS: len(texts)}
    for m in CS.metric_names():
        row[CS.min_col(m)] = ie
        row[CS.worst_step_col(m)] = worst
    steps = {
        i: {ST.STEP_TEXT: t, ST.PREMISE_RCUS: [f"premise {i} {HOSTILE}"], ST.CONCLUSION_RCU: f"conclusion {i}"}
        for i, t in enumerate(texts)
    }
    scores = {
        i: {SS.INTRA_ENTAIL: 0.5, SS.INTRA_PREMISE: "p", SS.INTER: 0.2, SS.INTER_MAX_CONTRADICTION: 0.8,
            SS.INTER_WORST_PREMISE: f"context says {HOSTILE}", SS.INTER_WORST_SOURCE: "context",
            SS.INTRA_PVI: -0.1, SS.PVI_G: -1.0, SS.PVI_NULL: -0.9, SS.INFO_GAIN: 0.1 * (i - 1),
            SS.IG_L_PREV: -2.0 + 0.1 * i, SS.IG_L: -1.9 + 0.1 * i,
            SS.ARITH_VALID: 0.5, SS.ARITH_ERRORS: 1, SS.ARITH_FAILED: f"18 - 6 = 13 (is 12) {HOSTILE}"}
        for i in range(len(texts))
    }
    detail = {"chain": {"context": f"Context {HOSTILE}", "question": "Q?", "answer": "7", "gold_answer": "8"},
              "steps": steps, "scores": scores}
    return row, detail


def _page() -> str:
    row, detail = _chain("chain-<1>", ["She had 3 apples.", f"Then {HOSTILE} happened.", "So 7."], 1, 0.12)
    curation = CurationResult(
        counts={"batch": 10, "run_passed": 6, "run_failed": 4},
        rules=[{"id": "threshold:intra_entail_min>=0.5", "kind": "threshold", "column": "intra_entail_min",
                "bound": 0.5}],
        pass_rates={"all": 0.6, "threshold:intra_entail_min>=0.5": 0.6},
        labels={"clean": {"precision": 0.75, "recall": 0.5, "n": 10.0}},
        histograms={},
    )
    return report.render(
        title="ReCEval nightly scoring report",
        meta=[("run", "r1"), ("input", f"/lake/{HOSTILE}")],
        table_rows=[("chains", 10, 3, "0", "1")],
        stage_rows=[("scores", 10, 2.5, 4.0)],
        curation=curation,
        scope_note="chains curated in this run",
        worst={m: [row] for m in CS.metric_names()},
        details={"chain-<1>": detail},
    )


def test_render_escapes_untrusted_text():
    page = _page()
    assert "<script" not in page and "onerror=\"" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "chain-&lt;1&gt;" in page


def test_render_highlights_worst_step_and_explains_it():
    page = _page()
    # One chain block per metric, each with exactly its worst step (index 1) highlighted.
    worst_items = re.findall(r'<li class="worst">([^<]*)</li>', page)
    assert worst_items == ["Then &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x "
                           "onerror=&quot;alert(1)&quot;&gt; happened."] * 5
    assert page.count("Why step 1 scored low") == 5  # intra_entail, intra_pvi, inter, info_gain, arith_valid
    # The arithmetic check's failing equation, once per "why" table, escaped like every chain text.
    assert page.count("<tr><td>arith_valid</td><td>0.5000 — 18 - 6 = 13 (is 12) &lt;script&gt;") == 5
    assert page.count("<tr><td>arith_errors</td><td>1</td></tr>") == 5
    assert "conclusion 1" in page and "context says &lt;script&gt;" in page
    assert "P(contradiction) = 0.8000" in page
    assert "-0.1000 = -1.0000 - -0.9000" in page  # intra_pvi = log p_g - log p_g'
    assert page.count("<svg") == 5  # the information-gain curve of each block


def test_curve_svg_marks_point_after_worst_step():
    svg = report.curve_svg([-2.0, -1.5, -1.6, -1.0], highlight=1)
    circles = re.findall(r'<circle [^>]*r="([\d.]+)" fill="([^"]+)"', svg)
    assert [c[1] for c in circles] == ["#4c72b0", "#4c72b0", "#d33", "#4c72b0"]
    assert "no information-gain curve" in report.curve_svg([None, None], highlight=0)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="headless Chromium is not installed (apt-get install -y chromium)")
def test_render_in_headless_chromium_screenshot(tmp_path: Path):
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(_page())
    shot = tmp_path / "report.png"
    cmd = [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
        "--window-size=1200,1600", page.as_uri(),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    image = Image.open(shot).convert("L")
    assert image.size == (1200, 1600)
    # Rendered text and tables: many dark pixels, and the highlighted worst step's pink background.
    dark = sum(1 for v in image.getdata() if v < 100)
    assert dark > 2000
    rgb = Image.open(shot).convert("RGB")
    assert any(px == (255, 227, 227) for px in rgb.getdata())


def test_night_quantiles_per_scoring_date_and_chart(spark):
    import datetime as dt

    rows = []
    for day, values in ((29, [0.1, 0.2, 0.3, 0.4, 0.5]), (30, [0.6, 0.7, 0.8, 0.9, 1.0])):
        for i, v in enumerate(values):
            row = {f.name: None for f in CS.SCHEMA.fields}
            row.update({CS.CHAIN_ID: f"{day}-{i}", CS.CONFIG_HASH: "h", CS.N_STEPS: 1, CS.min_col("inter"): v,
                        CS.SCORED_AT: dt.datetime(2026, 11, day, 23, 30)})
            rows.append(row)
    got = report.night_quantiles(spark.createDataFrame(rows, CS.SCHEMA))
    # percentile_approx over 5 values returns one of them: 5 % -> the 1st, 25 % -> 2nd, median 3rd, ...
    assert got["inter"] == [("2026-11-29", [0.1, 0.2, 0.3, 0.4, 0.5]), ("2026-11-30", [0.6, 0.7, 0.8, 0.9, 1.0])]
    assert got["intra_entail"] == []  # no values: no box
    assert report.nights_png(got)[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.nights_png({m: [] for m in got}) is None
