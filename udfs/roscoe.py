"""ROSCOE baseline scores (SA, SS, LI, REP) and ROUGE-2 for one chain: numpy maths plus MiniLM/NLI calls.

Definitions: schemas/metrics.py (after ROSCOE's `score.py`). Embeddings are mean-pooled MiniLM
token states (all-MiniLM-L6-v2's own pooling); token embeddings are the same model's token states without
[CLS]/[SEP]. No Spark and no tables here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas import metrics as MR

# (premises, hypotheses) -> P(contradiction) per pair
ContradictFn = Callable[[list[str], list[str]], np.ndarray]


def align_matrix(hypo: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """align(h_i, r_j) = (1 + cos) / 2 for every pair: shape (len(hypo), len(ref))."""
    h = hypo / np.clip(np.linalg.norm(hypo, axis=1, keepdims=True), 1e-12, None)
    r = ref / np.clip(np.linalg.norm(ref, axis=1, keepdims=True), 1e-12, None)
    return (1.0 + h @ r.T) / 2.0


def alignment(hypo: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """For each hypothesis item, its best alignment to any reference item (ROSCOE's embedding_alignment)."""
    if len(hypo) == 0 or len(ref) == 0:
        return np.zeros(0)
    return align_matrix(hypo, ref).max(axis=1)


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else 0.0


def earlier_repetition(items: Sequence[np.ndarray], tokens: bool) -> np.ndarray:
    """Per step t, its alignment to its most similar earlier step (token-level: mean token alignment); 0 for the
    first step and for a step with nothing to compare (an empty token list)."""
    best = np.zeros(len(items))
    for t in range(1, len(items)):
        for k in range(t):
            if len(items[t]) == 0 or len(items[k]) == 0:
                continue
            if tokens:
                value = _mean(alignment(items[t], items[k]))
            else:
                value = float(align_matrix(items[t][None, :], items[k][None, :])[0, 0])
            best[t] = max(best[t], value)
    return best


def repetition(items: Sequence[np.ndarray], tokens: bool) -> float:
    """max over steps t of the alignment to its most similar earlier step (token-level: mean token alignment)."""
    return float(earlier_repetition(items, tokens).max(initial=0.0))


@dataclass(frozen=True)
class ChainEmbeddings:
    steps: np.ndarray  # (n_steps, d)
    context: np.ndarray  # (n_sentences, d)
    chain: np.ndarray  # (d,) the steps joined
    whole_context: np.ndarray  # (d,)
    step_tokens: list[np.ndarray]  # per step (n_tokens, d)
    context_tokens: list[np.ndarray]
    gold: np.ndarray | None = None  # (n_gold, d)
    gold_chain: np.ndarray | None = None


def embedding_scores(e: ChainEmbeddings, reference_based: bool) -> dict[str, float]:
    y_x = alignment(e.steps, e.context)
    x_y = alignment(e.context, e.steps)
    tokens_y = np.concatenate([t for t in e.step_tokens if len(t)] or [np.zeros((0, e.steps.shape[1]))])
    tokens_x = np.concatenate([t for t in e.context_tokens if len(t)] or [np.zeros((0, e.steps.shape[1]))])
    chain_vs_context = float(align_matrix(e.chain[None, :], e.whole_context[None, :])[0, 0])
    scores = {
        "roscoe_sa_faithfulness_step": _mean(y_x),
        "roscoe_sa_faithfulness_token": _mean(np.append(y_x, alignment(tokens_y, tokens_x))),
        "roscoe_sa_informativeness_step": (_mean(y_x) + _mean(x_y)) / 2.0,
        # One step cannot repeat an earlier one: the formula's best value, not ROSCOE's off-scale 1.0 for SS.
        "roscoe_sa_repetition_token": 1.0 - repetition(e.step_tokens, tokens=True),
        "roscoe_ss_informativeness_chain": (1.0 + chain_vs_context) / 2.0,
        "roscoe_ss_repetition_step": (1.0 - repetition(list(e.steps), tokens=False)) / 2.0,
    }
    if reference_based and e.gold is not None and len(e.gold):
        y_r = alignment(e.steps, e.gold)
        r_y = alignment(e.gold, e.steps)
        r_x = alignment(e.gold, e.context)
        scores.update(
            {
                "roscoe_sa_reasoning_alignment": _mean(y_r),
                "roscoe_sa_hallucination": 1.0 - float(np.max((1 - y_r) * (1 - y_x))),
                "roscoe_sa_redundancy": float(y_r.min()),
                "roscoe_sa_common_sense": 1.0 - float(np.max((1 - r_y) * (1 - r_x))),
                "roscoe_sa_missing_step": float(r_y.min()),
                "roscoe_sa_semantic_coverage_step": 1.0 - abs(_mean(r_x) - _mean(y_x)),
                "roscoe_ss_semantic_coverage_chain": (
                    1.0 + float(align_matrix(e.chain[None, :], e.gold_chain[None, :])[0, 0])
                ) / 2.0,
            }
        )
    return scores


# Per-step forms of the reference-free scores whose chain value is a mean or min over steps (ROSCOE's step-level
# view: each chain score aggregates one value per step). The chain value is the aggregation ("mean" or "min") the
# registry's step_baseline_scores metric declares (schemas/metrics.py defines them).
STEP_AGGREGATION: dict[str, str] = {m.name: m.aggregations[0] for m in MR.of_table(MR.STEP_BASELINE_SCORES)}


def step_embedding_scores(e: ChainEmbeddings) -> dict[str, np.ndarray]:
    """One value per step, higher-is-better: how faithful step t is to the context (max alignment to a context
    sentence; absent without context) and how little it repeats an earlier step (1.0 / 0.5 for the first)."""
    scores = {
        "roscoe_sa_repetition_token": 1.0 - earlier_repetition(e.step_tokens, tokens=True),
        "roscoe_ss_repetition_step": (1.0 - earlier_repetition(list(e.steps), tokens=False)) / 2.0,
    }
    if len(e.context):
        scores["roscoe_sa_faithfulness_step"] = alignment(e.steps, e.context)
    return scores


def step_nli_scores(steps: Sequence[str], context: Sequence[str], contradict: ContradictFn) -> dict[str, np.ndarray]:
    """Per step t: 1 - max P_contradiction(x_j, h_t) over context sentences (source consistency) and 1 - max
    P_contradiction(h_i, h_t) over earlier steps i < t (self consistency); 1.0 where there is nothing to compare."""
    src = [(x, h) for h in steps for x in context]
    own = [(steps[i], steps[j]) for j in range(len(steps)) for i in range(j)]
    pairs = src + own
    probs = np.asarray(contradict([p for p, _ in pairs], [h for _, h in pairs]), dtype=float) if pairs else np.zeros(0)
    n, m = len(steps), len(context)
    source = 1.0 - probs[: len(src)].reshape(n, m).max(axis=1, initial=0.0)
    own_p = probs[len(src) :]
    self_ = np.ones(n)
    at = 0
    for j in range(1, n):  # `own` lists, for each step j, its earlier steps i = 0..j-1
        self_[j] = 1.0 - own_p[at : at + j].max()
        at += j
    return {"roscoe_li_source_consistency": source, "roscoe_li_self_consistency": self_}


def nli_scores(steps: Sequence[str], context: Sequence[str], contradict: ContradictFn) -> dict[str, float]:
    """ROSCOE-LI: source consistency (every context sentence vs every step) and self consistency (i < j): the
    minimum over steps of their per-step forms, from one contradiction call over all pairs."""
    return chain_scores(step_nli_scores(steps, context, contradict))


def chain_scores(per_step: dict[str, np.ndarray]) -> dict[str, float]:
    """Per-step values -> the chain's values (STEP_AGGREGATION); no steps: the best value (1.0), or 0.0 for a
    mean, as the chain formulas give."""
    return {
        metric: _mean(values) if STEP_AGGREGATION[metric] == "mean" else float(values.min(initial=1.0))
        for metric, values in per_step.items()
    }


def rouge2(steps: Sequence[str], gold: Sequence[str] | None, scorer: Any = None) -> float | None:
    if not gold:
        return None
    if scorer is None:
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)
    return float(scorer.score(" ".join(gold), " ".join(steps))["rouge2"].fmeasure)


class Embedder:
    """Mean-pooled sentence embeddings and per-token states from one encoder (all-MiniLM-L6-v2)."""

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 64, max_length: int = 256) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.max_length = batch_size, max_length

    def __call__(self, texts: Sequence[str]) -> tuple[np.ndarray, list[np.ndarray]]:
        import torch

        texts = list(texts)
        dim = self.model.config.hidden_size
        sentences = np.zeros((len(texts), dim), dtype=np.float32)
        tokens: list[np.ndarray] = [np.zeros((0, dim), dtype=np.float32)] * len(texts)
        order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths share a batch
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                idx = order[start : start + self.batch_size]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt", return_special_tokens_mask=True)
                special = enc.pop("special_tokens_mask").bool()
                enc = {k: v.to(device) for k, v in enc.items()}
                states = self.model(**enc).last_hidden_state.float()
                mask = enc["attention_mask"].unsqueeze(-1).float()
                pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                states, pooled = states.cpu().numpy(), pooled.cpu().numpy()
                keep = (enc["attention_mask"].cpu().bool() & ~special).numpy()
                for row, i in enumerate(idx):
                    sentences[i] = pooled[row]
                    tokens[i] = states[row][keep[row]]
        return sentences, tokens


def chain_embeddings(embed: Embedder, chains: Sequence[tuple[Sequence[str], Sequence[str], Sequence[str] | None]]
                     ) -> list[ChainEmbeddings]:
    """(steps, context sentences, gold steps or None) per chain -> embeddings, from one batched encoder pass."""
    texts: list[str] = []
    spans = []
    for steps, context, gold in chains:
        gold = list(gold or [])
        start = len(texts)
        texts += [*steps, *context, ". ".join(steps), ". ".join(context), *gold, ". ".join(gold)]
        spans.append((start, len(steps), len(context), len(gold)))
    vectors, tokens = embed(texts) if texts else (np.zeros((0, 1)), [])
    out = []
    for start, n, m, g in spans:
        v, t = vectors[start:], tokens[start:]
        out.append(
            ChainEmbeddings(
                steps=v[:n],
                context=v[n : n + m],
                chain=v[n + m],
                whole_context=v[n + m + 1],
                step_tokens=t[:n],
                context_tokens=t[n : n + m],
                gold=v[n + m + 2 : n + m + 2 + g] if g else None,
                gold_chain=v[n + m + 2 + g] if g else None,
            )
        )
    return out
