"""The metric registry: every score a table holds, declared once (name, table, definition, direction, aggregations).

Nothing else lists metrics. `chain_scores` has one column per aggregation a `step_scores` metric declares
(`<metric>_min`, `_worst_step`, `_mean`, and API_k from the one metric that declares it); aggregate computes
exactly those, the meta-evaluation evaluates them (and every `baseline_scores` metric), curation and the
nightly report iterate the step scores, the CoT evaluation computes each `cot_metrics` metric from its
predictions column, and the ROSCOE per-step forms say how their chain value aggregates them. A new step score
is one `Metric(...)` below plus the job that writes its `step_scores` column (tests/test_metrics_registry.py
shows one flowing to chain scores, the meta-evaluation and the report). A count (`arith_errors`: lower is better)
is the one exception to "higher is better": its chain score is its total over steps, which curation bounds from
above and the meta-evaluation reads negated.

Pure Python (no pyspark): the settings and udfs/ read it too. Consumers call the functions below at run time
rather than copy the registry at import, so a test that extends `REGISTRY` sees it everywhere it matters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

# The tables a metric lives in (their names in the lake, as `Settings.table` takes them).
STEP_SCORES = "step_scores"
BASELINE_SCORES = "baseline_scores"
STEP_BASELINE_SCORES = "step_baseline_scores"
COT_METRICS = "cot_metrics"
TABLES = (STEP_SCORES, BASELINE_SCORES, STEP_BASELINE_SCORES, COT_METRICS)

# Step-score aggregations, each one `chain_scores` column (jobs.receval.aggregate computes them): MIN is the chain
# score (a chain is as good as its worst step), WORST_STEP the 0-based step that gave it (first on ties), MEAN the
# mean over steps. API_K is the paper's API_k over the metric's values in step order, columns api_1..api_3 after
# every metric's own (named without the metric, as the paper does: so at most one metric declares it).
# TOTAL (counts only) the sum over steps.
MIN, WORST_STEP, MEAN, API_K, TOTAL = "min", "worst_step", "mean", "api_k", "total"
API_KS = (1, 2, 3)
# cot_metrics' `aggregate` values: template: one P3 template; task: all rows of a task; median_template: median
# over a task's templates (T0); macro: mean over tasks of the task value (median over templates for templated
# tasks; CoT Collection); micro: mean over all rows of the dataset (lm-evaluation-harness).
COT_AGGREGATES = ("template", "task", "median_template", "macro", "micro")
# What an aggregation may be, per table: a step_baseline_scores metric names how its chain value in
# baseline_scores aggregates the per-step values (udfs/roscoe.STEP_AGGREGATION); baseline_scores are per chain.
ALLOWED_AGGREGATIONS: dict[str, tuple[str, ...]] = {
    STEP_SCORES: (MIN, WORST_STEP, MEAN, API_K, TOTAL),
    BASELINE_SCORES: (),
    STEP_BASELINE_SCORES: (MIN, MEAN),
    COT_METRICS: COT_AGGREGATES,
}

Direction = Literal["higher", "lower"]


@dataclass(frozen=True)
class Metric:
    """One score. `source`: for a cot_metrics metric, the `cot_predictions` column whose share of true rows it is.
    `sparse`: a null step value means the score does not apply to that step (a step without an equation), not that
    its scoring failed: chain aggregations then go over the steps that have a value (null when none has).
    `detail`: the step_scores column that says why a step scored low (the report shows it beside the value)."""

    name: str
    table: str
    definition: str  # one line: what the number is, its range or unit
    direction: Direction = "higher"
    aggregations: tuple[str, ...] = ()
    source: str | None = None
    sparse: bool = False
    detail: str | None = None

    @property
    def higher_is_better(self) -> bool:
        return self.direction == "higher"

    @property
    def direction_text(self) -> str:
        return f"{self.direction} is better"

    @property
    def is_count(self) -> bool:
        """A per-step count (lower is better) whose chain score is its total."""
        return self.aggregations == (TOTAL,)


INTRA_ENTAIL = "intra_entail"
INTRA_PVI = "intra_pvi"
INTER = "inter"
INFO_GAIN = "info_gain"
ARITH_VALID = "arith_valid"
ARITH_ERRORS = "arith_errors"
ARITH_FAILED = "arith_failed"  # step_scores: the failing equations with their real values, `18 - 6 = 13 (is 12)`
_CHAIN = (MIN, WORST_STEP, MEAN)

# Subsets other settings default to (settings read them at run time, so a test can change one here):
# - the paper's four step scores, in localisation's report order: localise evaluates and combines these (the
#   arithmetic check, this project's addition and sparse, is opt-in there);
# - downstream chain selection's criteria (docs/design/RECEVAL.md "Downstream selection"): correctness from the
#   entailment and contradiction scores, informativeness from information gain, each by its chain score
#   (chain_scores_of).
PAPER_STEP_SCORES = (INTRA_ENTAIL, INTER, INTRA_PVI, INFO_GAIN)
SELECT_CORRECTNESS = (INTRA_ENTAIL, INTER)
SELECT_INFORMATIVENESS = (INFO_GAIN,)

# Registry order is the order of every list derived from it: chain_scores' columns, the meta-evaluation's default
# metrics, the report's sections. The step scores follow the paper: intra-step correctness, intra-step
# informativeness, inter-step correctness, information gain.
STEP_SCORE_METRICS = (
    Metric(
        INTRA_ENTAIL, STEP_SCORES,
        "P_entail(premise = ' and '.join(premise RCUs + earlier conclusions), hypothesis = conclusion RCU); "
        "1.0 when there is no premise text. Range [0, 1].",
        aggregations=_CHAIN,
    ),
    Metric(
        INTRA_PVI, STEP_SCORES,
        "meanlogp_g(conclusion | premises) - meanlogp_g'(conclusion | None): nats of usable information "
        "the premises give about the conclusion.",
        aggregations=_CHAIN,
    ),
    Metric(
        INTER, STEP_SCORES,
        "1 - max P_contradiction(r, conclusion) over r in context sentences + earlier conclusions; "
        "1.0 when that set is empty. Range [0, 1].",
        aggregations=_CHAIN,
    ),
    Metric(
        INFO_GAIN, STEP_SCORES,
        "L(i) - L(i-1), L(k) = meanlogp(' ' + answer | steps 1..k + ' Therefore,'): nats the step adds "
        "towards the predicted answer.",
        aggregations=(*_CHAIN, API_K),
    ),
    # The arithmetic check (udfs/arith.py): no model; every `<expression> = <number>` in the step evaluated exactly.
    Metric(
        ARITH_VALID, STEP_SCORES,
        "share of the step's checkable equations that hold at the precision their number is written at; "
        "null when the step has none (chain aggregations skip it). Range [0, 1].",
        aggregations=_CHAIN, sparse=True, detail=ARITH_FAILED,
    ),
    Metric(
        ARITH_ERRORS, STEP_SCORES,
        "number of the step's checkable equations that do not hold (0 without any); chain score: the total.",
        direction="lower", aggregations=(TOTAL,), detail=ARITH_FAILED,
    ),
)

# ROSCOE (Golovneva et al., 2023, `projects/roscoe/score.py`) and ROUGE-2, per chain, in [0, 1]. align(a, b) =
# (1 + cos(a, b)) / 2 on MiniLM embeddings; x = context sentences, h = chain steps, r = gold steps. The first eight
# are reference-free; the rest need gold steps (baselines.reference_based; rouge2 its own group).
BASELINE_METRICS = tuple(
    Metric(name, BASELINE_SCORES, definition)
    for name, definition in (
        ("roscoe_sa_faithfulness_step", "mean_i max_j align(h_i, x_j)"),
        ("roscoe_sa_faithfulness_token",
         "mean of the step alignments h->x and the token alignments (each chain token to its best context token)"),
        ("roscoe_sa_informativeness_step", "(mean_i max_j align(h_i, x_j) + mean_j max_i align(x_j, h_i)) / 2"),
        ("roscoe_sa_repetition_token",
         "1 - max_t max_{k<t} mean over tokens of h_t of max align to tokens of h_k; 1 for one step"),
        ("roscoe_ss_informativeness_chain", "(1 + align(emb(' . '.join(h)), emb(' . '.join(x)))) / 2"),
        ("roscoe_ss_repetition_step", "(1 - max_t max_{k<t} align(h_t, h_k)) / 2; 0.5 for one step"),
        ("roscoe_li_source_consistency", "1 - max_{i,j} P_contradiction(premise x_j, hypothesis h_i)"),
        ("roscoe_li_self_consistency", "1 - max_{i<j} P_contradiction(premise h_i, hypothesis h_j); 1 for one step"),
        # reference-based (baselines.reference_based, chains with gold_steps)
        ("roscoe_sa_reasoning_alignment", "mean_i max_j align(h_i, r_j)"),
        ("roscoe_sa_hallucination", "1 - max_i (1 - max_j align(h_i, r_j)) * (1 - max_j align(h_i, x_j))"),
        ("roscoe_sa_redundancy", "min_i max_j align(h_i, r_j)"),
        ("roscoe_sa_common_sense", "1 - max_j (1 - max_i align(r_j, h_i)) * (1 - max_i align(r_j, x_i))"),
        ("roscoe_sa_missing_step", "min_j max_i align(r_j, h_i)"),
        ("roscoe_sa_semantic_coverage_step", "1 - |mean_j max_i align(r_j, x_i) - mean_i max_j align(h_i, x_j)|"),
        ("roscoe_ss_semantic_coverage_chain", "(1 + align(emb(chain), emb(gold chain))) / 2"),
        ("rouge2", "ROUGE-2 F1 of ' '.join(h) against ' '.join(r) (rouge-score, stemming on)"),
    )
)

# Per-step forms (baselines.per_step): the value of step t, and how the chain score above aggregates it. Every one
# is higher-is-better, so localisation flags a step scoring below a threshold like any step score.
STEP_BASELINE_METRICS = (
    Metric("roscoe_sa_faithfulness_step", STEP_BASELINE_SCORES, "max_j align(h_t, x_j); absent without context",
           aggregations=(MEAN,)),
    Metric("roscoe_sa_repetition_token", STEP_BASELINE_SCORES,
           "1 - max_{k<t} mean over tokens of h_t of max align to tokens of h_k; 1 for the first step",
           aggregations=(MIN,)),
    Metric("roscoe_ss_repetition_step", STEP_BASELINE_SCORES,
           "(1 - max_{k<t} align(h_t, h_k)) / 2; 0.5 for the first step", aggregations=(MIN,)),
    Metric("roscoe_li_source_consistency", STEP_BASELINE_SCORES,
           "1 - max_j P_contradiction(premise x_j, hypothesis h_t)", aggregations=(MIN,)),
    Metric("roscoe_li_self_consistency", STEP_BASELINE_SCORES,
           "1 - max_{i<t} P_contradiction(premise h_i, hypothesis h_t); 1 for the first step", aggregations=(MIN,)),
)

# CoT evaluation (jobs.cot.metrics.compute_metrics): the share of true `source` rows, per aggregate. `source`
# names a cot_predictions column (schemas/cot.py; tests check it is one); rows where it is null are left out.
COT_METRIC_LIST = tuple(
    Metric(name, COT_METRICS, definition, aggregations=COT_AGGREGATES, source=source)
    for name, source, definition in (
        ("accuracy", "correct", "share of rows with `correct` (classification accuracy; exact match for generation)"),
        ("numeric_match", "numeric_correct", "share of numeric-gold generation rows whose answer is the same number"),
        ("acc_norm_token", "correct_per_token", "classification accuracy ranking options by log-prob per token"),
        ("acc_norm_byte", "correct_per_byte", "classification accuracy ranking options by log-prob per byte"),
        ("random_guess", "chance", "the random-guess baseline: accuracy a uniform guess among the options expects "
         "(1 / options; 0 for generation), aggregated like accuracy"),
    )
)


def validate(registry: Iterable[Metric]) -> tuple[Metric, ...]:
    """The registry as a tuple, or ValueError naming what breaks the consumers' assumptions."""
    out = tuple(registry)
    seen: set[tuple[str, str]] = set()
    for m in out:
        where = f"metric {m.table}.{m.name}"
        if m.table not in TABLES:
            raise ValueError(f"{where}: unknown table (known: {TABLES})")
        if (m.table, m.name) in seen:
            raise ValueError(f"{where}: registered twice")
        seen.add((m.table, m.name))
        if not m.definition.strip():
            raise ValueError(f"{where}: needs a one-line definition")
        # Every consumer ranks by "higher is better": curation keeps chains at or above a bound, localisation flags
        # steps below one, Somers' D > 0 means clean chains rank higher. Negate a lower-is-better score first; the
        # one exception is a step count, whose chain total curation bounds from above and meta-eval negates.
        if m.direction != "higher" and not (m.table == STEP_SCORES and m.is_count):
            raise ValueError(f"{where}: direction {m.direction!r}; every registered score is higher-is-better "
                             f"but a step count (aggregations ({TOTAL!r},))")
        if TOTAL in m.aggregations and not (m.is_count and m.direction == "lower"):
            raise ValueError(f"{where}: {TOTAL!r} is a count's only aggregation, and a count is lower-is-better")
        bad = sorted(set(m.aggregations) - set(ALLOWED_AGGREGATIONS[m.table]))
        if bad:
            raise ValueError(f"{where}: aggregations {bad} not allowed (allowed: {ALLOWED_AGGREGATIONS[m.table]})")
        if m.table == STEP_SCORES and MIN not in m.aggregations and not m.is_count:
            raise ValueError(f"{where}: a step score needs {MIN!r}, its chain score")
        if m.table == STEP_BASELINE_SCORES and len(m.aggregations) != 1:
            raise ValueError(f"{where}: names exactly one chain aggregation (min or mean)")
        if m.table == COT_METRICS and not m.source:
            raise ValueError(f"{where}: needs its cot_predictions source column")
    api = [m.name for m in out if API_K in m.aggregations]
    if len(api) > 1:
        raise ValueError(f"{API_K} declared by {api}: its columns api_<k> hold one metric")
    return out


REGISTRY: tuple[Metric, ...] = validate((*STEP_SCORE_METRICS, *BASELINE_METRICS, *STEP_BASELINE_METRICS,
                                         *COT_METRIC_LIST))


def extended(*extra: Metric) -> tuple[Metric, ...]:
    """The registry with `extra` appended, validated (tests: `monkeypatch.setattr(MR, "REGISTRY", extended(m))`)."""
    return validate((*REGISTRY, *extra))


def of_table(table: str) -> tuple[Metric, ...]:
    """The metrics of one table, in registry order (read at call time)."""
    if table not in TABLES:
        raise ValueError(f"unknown metric table {table!r} (known: {TABLES})")
    return tuple(m for m in REGISTRY if m.table == table)


def names(table: str) -> list[str]:
    return [m.name for m in of_table(table)]


def ranked_step_scores() -> tuple[Metric, ...]:
    """The higher-is-better step scores (chain score: the min), in registry order: what localisation thresholds,
    the report's worst chains and curation's score keys rank by. Not the counts."""
    return tuple(m for m in of_table(STEP_SCORES) if not m.is_count)


def step_counts() -> tuple[Metric, ...]:
    """The per-step counts (lower is better; chain score: the total), e.g. arith_errors."""
    return tuple(m for m in of_table(STEP_SCORES) if m.is_count)


def chain_score_column(metric: Metric) -> str:
    """A step score's chain score: `<metric>_min`, or a count's `<metric>_total`."""
    return chain_column(metric.name, TOTAL if metric.is_count else MIN)


def chain_scores_of(names: Iterable[str]) -> list[str]:
    """The chain scores of the named step scores, e.g. [intra_entail_min, inter_min] (KeyError for a name the
    registry does not hold as a step score)."""
    return [chain_score_column(get(STEP_SCORES, name)) for name in names]


def lower_is_better_columns() -> set[str]:
    """The chain_scores columns a ranking consumer reads negated (the counts' totals)."""
    return {chain_score_column(m) for m in step_counts()}


def get(table: str, name: str) -> Metric:
    for m in of_table(table):
        if m.name == name:
            return m
    raise KeyError(f"{name!r} is not a {table} metric ({names(table)})")


def chain_column(metric: str, aggregation: str) -> str:
    """The `chain_scores` column of a step score's aggregation: `<metric>_<aggregation>`, e.g. intra_entail_min."""
    return f"{metric}_{aggregation}"


def api_column(k: int) -> str:
    return f"api_{k}"


def api_metric() -> Metric | None:
    """The step score whose API_k chain_scores holds (info_gain), or None."""
    return next((m for m in of_table(STEP_SCORES) if API_K in m.aggregations), None)


def chain_score_columns() -> list[str]:
    """The chain scores the meta-evaluation evaluates by default: each step score's chain score (its min, a
    count's total), then API_k (as 0/1)."""
    api = [api_column(k) for k in API_KS] if api_metric() is not None else []
    return [chain_score_column(m) for m in of_table(STEP_SCORES)] + api
