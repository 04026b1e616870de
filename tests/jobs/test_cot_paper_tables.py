"""jobs.cot.paper_tables: the paper's tables from cot_metrics rows, hand-made predictions, values by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from tolerance import exact

from jobs.cot import paper_tables as P
from jobs.cot.metrics import compute_metrics
from schemas import cot as S


def _pred(dataset, task, template, mode, correct):
    return [{S.DATASET: dataset, S.TASK: task, S.TEMPLATE: template, S.MODE: mode, S.MODEL: "m", S.CORRECT: c,
             S.NUMERIC_CORRECT: None, S.CORRECT_PER_TOKEN: None, S.CORRECT_PER_BYTE: None} for c in correct]  # fmt: skip


@pytest.fixture(scope="module")
def metrics():
    rows = (
        _pred("bbh", "snarks", None, "direct", [True, True, True, False])  # 3/4
        + _pred("bbh", "navigate", None, "direct", [True, False])  # 1/2
        + _pred("bbh", "snarks", None, "cot", [True, False, False, False])  # 1/4
        + _pred("p3", "rte", "a", "direct", [True, False])  # templates: 1/2, 1, 0 -> median 1/2
        + _pred("p3", "rte", "b", "direct", [True, True])
        + _pred("p3", "rte", "c", "direct", [False, False])
        + _pred("mgsm", "en", None, "cot", [True, False, True])
    )
    return compute_metrics(pd.DataFrame(rows), resamples=50, confidence=0.95, seed=0)


def _wilson_by_hand(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_wilson_interval_equals_the_formula():
    for k, n in [(3, 4), (0, 5), (250, 250), (17, 40)]:
        assert P.wilson(k, n) == pytest.approx(_wilson_by_hand(k, n), abs=1e-9)


def test_bbh_table_cells_rows_and_average(metrics):
    bbh = {t.name: t for t in P.paper_tables([("m", metrics)])}["bbh"]
    assert bbh.columns == ["Direct", "CoT"]
    assert [row for row, _ in bbh.rows] == ["navigate", "snarks", "Average"]  # BBH's task order, then Average
    (navigate, snarks, average) = (cells for _, cells in bbh.rows)
    assert (snarks[0].value, snarks[0].n) == (0.75, 4)
    assert (snarks[0].low, snarks[0].high) == pytest.approx(_wilson_by_hand(3, 4), abs=1e-9)
    assert (snarks[1].value, snarks[1].n) == (0.25, 4)
    assert navigate[1].value is None and navigate[1].text() == "–"  # no CoT row for navigate
    assert (average[0].value, average[0].n) == (exact(0.625), 6)  # macro mean of 3/4 and 1/2
    macro = metrics[(metrics[S.DATASET] == "bbh") & (metrics[S.MODE] == "direct") & (metrics[S.AGGREGATE] == "macro")
                    & (metrics[S.METRIC_NAME] == "accuracy")].iloc[0]  # fmt: skip
    assert (average[0].low, average[0].high) == (macro[S.CI_LOW], macro[S.CI_HIGH])  # the bootstrap CI
    low, high = _wilson_by_hand(3, 4)
    assert snarks[0].text() == f"75.0 [{100 * low:.1f}, {100 * high:.1f}] n=4"


def test_p3_table_median_over_templates_and_hellaswag_not_available(metrics):
    p3 = {t.name: t for t in P.paper_tables([("m", metrics)])}["p3"]
    assert p3.columns == ["Direct"]
    rows = dict(p3.rows)
    assert list(rows) == ["hellaswag", "rte", "Average"]
    assert (rows["rte"][0].value, rows["rte"][0].n) == (0.5, 6)  # median of 1/2, 1, 0 over 6 rows
    assert rows["hellaswag"][0].value is None and rows["hellaswag"][0].text() == "n/a"
    assert len(p3.footnotes) == 1 and "HellaSwag: not available" in p3.footnotes[0]


def test_mgsm_table_and_markdown(metrics):
    mgsm = {t.name: t for t in P.paper_tables([("m", metrics)])}["mgsm"]
    low, high = _wilson_by_hand(2, 3)
    cell = f"66.7 [{100 * low:.1f}, {100 * high:.1f}] n=3"
    avg = dict(mgsm.rows)["Average"][0]
    assert mgsm.markdown() == "\n".join([
        "**MGSM: exact-match accuracy per language** (accuracy %, 95% CI, n)",
        "",
        "| language | CoT |",
        "|---|---|",
        f"| en | {cell} |",
        f"| Average | {avg.text()} |",
    ])  # fmt: skip


def test_two_runs_side_by_side(metrics):
    other = metrics.assign(**{S.VALUE: metrics[S.VALUE] * 0.5})
    bbh = {t.name: t for t in P.paper_tables([("A", metrics), ("B", other)])}["bbh"]
    assert bbh.columns == ["A Direct", "B Direct", "A CoT", "B CoT"]
    snarks = dict(bbh.rows)["snarks"]
    assert [c.value for c in snarks] == [0.75, 0.375, 0.25, 0.125]
    assert bbh.title.endswith(": A vs B")


def test_write_csv_md_html_png(metrics, tmp_path):
    tables = P.paper_tables([("m", metrics)])
    paths = P.write(tables, tmp_path, "<b>model</b>")
    csv = pd.read_csv(paths["csv"])
    assert set(csv["table"]) == {"bbh", "p3", "mgsm"}
    snarks = csv[(csv["table"] == "bbh") & (csv["row"] == "snarks") & (csv["column"] == "Direct")].iloc[0]
    assert (snarks["accuracy"], snarks["n"]) == (0.75, 4)
    html = paths["html"].read_text()
    assert "&lt;b&gt;model&lt;/b&gt;" in html and "<b>model</b>" not in html  # labels are escaped
    assert html.count("<table>") == 3 and "data:image/png;base64," in html
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
