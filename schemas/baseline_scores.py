"""`baseline_scores`: ROSCOE (SA, SS, LI, REP) and ROUGE-2 chain scores, long format, keyed by chain and metric;
`step_baseline_scores`: the per-step forms of five of them (STEP_METRICS), keyed by chain, step and metric.

Every score is higher-is-better in [0, 1]. align(a, b) = (1 + cos(a, b)) / 2 on MiniLM embeddings; x = context
sentences, h = chain steps, r = gold steps. Definitions follow ROSCOE (Golovneva et al., 2023) and its
`projects/roscoe/score.py`; docs/META_EVAL.md lists where this implementation differs.
"""

from __future__ import annotations

from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType, TimestampType

CHAIN_ID = "chain_id"
STEP_IDX = "step_idx"  # 0-based position in chains.steps (the steps job's step_idx for chains given as steps)
METRIC = "metric"
SCORE = "score"
MODEL = "model"  # embedding model, NLI model or "rouge-score", whichever produced the score
COMPUTED_AT = "computed_at"

SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(METRIC, StringType(), False),
        StructField(SCORE, DoubleType(), True),
        StructField(MODEL, StringType(), True),
        StructField(COMPUTED_AT, TimestampType(), True),
    ]
)

STEP_SCHEMA = StructType(
    [
        StructField(CHAIN_ID, StringType(), False),
        StructField(STEP_IDX, IntegerType(), False),
        StructField(METRIC, StringType(), False),
        StructField(SCORE, DoubleType(), True),
        StructField(MODEL, StringType(), True),
        StructField(COMPUTED_AT, TimestampType(), True),
    ]
)
STEP_KEYS = [CHAIN_ID, STEP_IDX, METRIC]

# metric -> (definition, direction)
METRICS: dict[str, tuple[str, str]] = {
    "roscoe_sa_faithfulness_step": ("mean_i max_j align(h_i, x_j)", "higher is better"),
    "roscoe_sa_faithfulness_token": (
        "mean of the step alignments h->x and the token alignments (each chain token to its best context token)",
        "higher is better",
    ),
    "roscoe_sa_informativeness_step": ("(mean_i max_j align(h_i, x_j) + mean_j max_i align(x_j, h_i)) / 2",
                                       "higher is better"),
    "roscoe_sa_repetition_token": (
        "1 - max_t max_{k<t} mean over tokens of h_t of max align to tokens of h_k; 1 for one step",
        "higher is better",
    ),
    "roscoe_ss_informativeness_chain": ("(1 + align(emb(' . '.join(h)), emb(' . '.join(x)))) / 2", "higher is better"),
    "roscoe_ss_repetition_step": ("(1 - max_t max_{k<t} align(h_t, h_k)) / 2; 0.5 for one step", "higher is better"),
    "roscoe_li_source_consistency": ("1 - max_{i,j} P_contradiction(premise x_j, hypothesis h_i)", "higher is better"),
    "roscoe_li_self_consistency": ("1 - max_{i<j} P_contradiction(premise h_i, hypothesis h_j); 1 for one step",
                                   "higher is better"),
    # reference-based (baselines.reference_based, chains with gold_steps)
    "roscoe_sa_reasoning_alignment": ("mean_i max_j align(h_i, r_j)", "higher is better"),
    "roscoe_sa_hallucination": ("1 - max_i (1 - max_j align(h_i, r_j)) * (1 - max_j align(h_i, x_j))",
                                "higher is better"),
    "roscoe_sa_redundancy": ("min_i max_j align(h_i, r_j)", "higher is better"),
    "roscoe_sa_common_sense": ("1 - max_j (1 - max_i align(r_j, h_i)) * (1 - max_i align(r_j, x_i))",
                               "higher is better"),
    "roscoe_sa_missing_step": ("min_j max_i align(r_j, h_i)", "higher is better"),
    "roscoe_sa_semantic_coverage_step": ("1 - |mean_j max_i align(r_j, x_i) - mean_i max_j align(h_i, x_j)|",
                                         "higher is better"),
    "roscoe_ss_semantic_coverage_chain": ("(1 + align(emb(chain), emb(gold chain))) / 2", "higher is better"),
    "rouge2": ("ROUGE-2 F1 of ' '.join(h) against ' '.join(r) (rouge-score, stemming on)", "higher is better"),
}

REFERENCE_FREE = [m for m in list(METRICS)[:8]]
REFERENCE_BASED = [m for m in list(METRICS)[8:] if m != "rouge2"]

# Summary rows of the correlation table: the best metric of each ROSCOE family, as the ReCEval paper reports them.
GROUPS: dict[str, list[str]] = {
    "ROSCOE-SA": [m for m in METRICS if m.startswith("roscoe_sa_")],
    "ROSCOE-SS": [m for m in METRICS if m.startswith("roscoe_ss_")],
    "ROSCOE-LI": [m for m in METRICS if m.startswith("roscoe_li_")],
    "ROSCOE-REP": ["roscoe_sa_repetition_token", "roscoe_ss_repetition_step"],
}

# Per-step forms (baselines.per_step): metric -> (the value of step t, how the chain score above aggregates it).
# Every one is higher-is-better, so localisation flags a step scoring below a threshold like any step score.
STEP_METRICS: dict[str, tuple[str, str]] = {
    "roscoe_sa_faithfulness_step": ("max_j align(h_t, x_j); absent without context", "mean over steps"),
    "roscoe_sa_repetition_token": (
        "1 - max_{k<t} mean over tokens of h_t of max align to tokens of h_k; 1 for the first step", "min over steps"
    ),
    "roscoe_ss_repetition_step": ("(1 - max_{k<t} align(h_t, h_k)) / 2; 0.5 for the first step", "min over steps"),
    "roscoe_li_source_consistency": ("1 - max_j P_contradiction(premise x_j, hypothesis h_t)", "min over steps"),
    "roscoe_li_self_consistency": ("1 - max_{i<t} P_contradiction(premise h_i, hypothesis h_t); 1 for the first step",
                                   "min over steps"),
}
