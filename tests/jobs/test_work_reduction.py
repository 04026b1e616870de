"""Work reduction leaves every score unchanged: pair/pass deduplication, length sorting, prefix sharing, on and off.

The tiny random models from the helper score a few chains whose context sentences and conclusions recur
(as they do across a night's chains), so deduplication removes real work; each optimisation is switched off
on its own and the step scores must equal the optimised run's within float32 rounding (tests/tolerance.py:
log-likelihoods relative to themselves, intra_pvi / info_gain relative to their two terms, probabilities
absolute).
"""

from __future__ import annotations

import pytest
from conftest import folder_settings
from tolerance import assert_scores_close

from jobs.receval import nli_scores, pvi_scores
from schemas import steps as S

SHARED = ["Plants need sunlight to grow.", "The sun is a star.", "A star gives off light."]
CHAINS = [
    # id, context sentences, answer, steps (premise RCUs, conclusion); sentences and conclusions recur
    ("c1", SHARED, "light", [(["The sun is a star.", "A star gives off light."], "The sun gives off light."),
                             (["Plants need sunlight to grow."], "Plants need the sun.")]),
    ("c2", SHARED, "light", [(["The sun is a star.", "A star gives off light."], "The sun gives off light.")]),
    ("c3", [*SHARED, "Leaves are green and wide."], "the sun",
     [(["Leaves are green and wide."], "Leaves catch light."), ([], "The sun gives off light."),
      (["Plants need sunlight to grow.", "The sun is a star."], "Plants need the sun.")]),
]


def _frames(spark):
    step_rows, ctx_rows = [], []
    for chain_id, context, answer, steps in CHAINS:
        for i, (premises, conclusion) in enumerate(steps):
            text = f"{' and '.join(premises)}, so {conclusion}." if premises else conclusion
            step_rows.append((chain_id, "h", i, len(steps), text, premises, conclusion, "given", "position", "t"))
        ctx_rows.append((chain_id, "h", context, answer, "given"))
    return spark.createDataFrame(step_rows, S.SCHEMA), spark.createDataFrame(ctx_rows, S.CONTEXTS_SCHEMA)


def _settings(make_settings, *extra):
    # batch size 2: several batches, so sorting changes which inputs share a batch (and its padding)
    return make_settings("runtime.batch_size=2", "runtime.on_row_error=fail", *extra)


# Each optimisation off on its own runs in the default set; all of them off together (`neither`) in the slow
# set: it checks that they do not interact, and costs as much again (docs/TESTING.md).
NEITHER = pytest.param(("runtime.dedup=false", "runtime.sort_by_length=false"), id="neither", marks=pytest.mark.slow)
VARIANTS = [pytest.param(("runtime.dedup=false",), id="no-dedup"),
            pytest.param(("runtime.sort_by_length=false",), id="no-sort"), NEITHER]
PVI_VARIANTS = [*VARIANTS, pytest.param(("runtime.share_prefix=false",), id="no-share")]


@pytest.fixture(scope="module")
def optimised(spark, tiny_models, tmp_path_factory) -> dict[str, list]:
    """The scores with every optimisation on (NLI and PVI step rows, collected), computed once for all variants."""
    settings = folder_settings(tmp_path_factory.mktemp("optimised"), "runtime.batch_size=2",
                               "runtime.on_row_error=fail")
    steps, contexts = _frames(spark)
    nli = nli_scores.transform(steps, contexts, settings.nli, settings.models.nli, settings.runtime)
    return {"nli": nli.drop("error").collect(),
            "pvi": pvi_scores.transform(steps, contexts, settings.pvi, settings.models, settings.runtime).collect()}


def _complete(rows: list, *cols: str) -> int:
    return sum(all(r[c] is not None for c in cols) for r in rows)


@pytest.mark.parametrize("variant", VARIANTS)
def test_nli_scores_identical_without_each_optimisation(spark, make_settings, tiny_models, optimised, variant):
    steps, contexts = _frames(spark)
    base = _settings(make_settings)
    off = _settings(make_settings, *variant)
    want = optimised["nli"]
    got = nli_scores.transform(steps, contexts, off.nli, off.models.nli, off.runtime).drop("error")
    assert_scores_close(got, want, keys=[S.CHAIN_ID, S.STEP_IDX])
    assert _complete(want, "intra_entail", "inter") == sum(len(c[3]) for c in CHAINS)
    pairs = nli_scores.plan(steps, contexts, base.nli, base.models.nli, base.runtime).pairs
    total, distinct = pairs.count(), pairs.select("premise", "hypothesis").distinct().count()
    assert distinct < total  # the chains share pairs: deduplication has work to remove
    assert _sent(spark, steps, contexts, base) == distinct
    assert _sent(spark, steps, contexts, off) == (distinct if off.runtime.dedup else total)


def _sent(spark, steps, contexts, settings) -> int:
    """Pairs the model is given in one evaluation of the scored pairs."""
    sent = spark.sparkContext.accumulator(0)
    nli_scores.plan(steps, contexts, settings.nli, settings.models.nli, settings.runtime,
                    accumulators=(sent,)).scored.write.format("noop").mode("overwrite").save()
    return sent.value


@pytest.mark.parametrize("variant", PVI_VARIANTS)
def test_pvi_scores_identical_without_each_optimisation(spark, make_settings, tiny_models, optimised, variant):
    steps, contexts = _frames(spark)
    want = optimised["pvi"]
    settings = _settings(make_settings, *variant)
    got = pvi_scores.transform(steps, contexts, settings.pvi, settings.models, settings.runtime)
    assert_scores_close(got, want, keys=[S.CHAIN_ID, S.STEP_IDX])
    assert _complete(want, "info_gain", "intra_pvi") == sum(len(c[3]) for c in CHAINS)
