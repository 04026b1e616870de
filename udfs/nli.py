"""NLI model maths (pairs -> P(entail), P(neutral), P(contradiction)) and the Spark UDF that runs it.

The maths is plain torch/numpy and runs without Spark; `nli_udf` wraps it in an iterator pandas UDF
that loads the model once per Python worker (udfs.runtime.load_model) on the task's device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from udfs.model_udf import model_udf, narrowed
from udfs.runtime import length_batches

ENTAIL = "entail"
NEUTRAL = "neutral"
CONTRADICTION = "contradiction"
TRUNCATED = "truncated"
ERROR = "error"

# Label names seen in NLI checkpoints' label2id (MNLI-style); matched case-insensitively by prefix.
_LABEL_PREFIXES = {ENTAIL: "entail", NEUTRAL: "neutral", CONTRADICTION: "contradict"}


@dataclass(frozen=True)
class NliOutput:
    """Per pair: probabilities in the fixed order (entail, neutral, contradiction) and truncation flags."""

    probs: np.ndarray  # (n, 3) float64
    truncated: np.ndarray  # (n,) bool: the premise was cut to fit max_length


# A predictor scores lists of (premise, hypothesis); a factory builds one inside the worker.
PredictFn = Callable[[list[str], list[str]], "NliOutput | np.ndarray"]
PredictFactory = Callable[[], PredictFn]


def label_indices(label2id: Mapping[str, int]) -> tuple[int, int, int]:
    """Logit indices of (entailment, neutral, contradiction) from a model's config.label2id, any case."""
    found: dict[str, int] = {}
    for name, index in label2id.items():
        low = str(name).strip().lower()
        for label, prefix in _LABEL_PREFIXES.items():
            if low.startswith(prefix):
                if label in found:
                    raise ValueError(f"label2id {dict(label2id)} names {label!r} twice")
                found[label] = int(index)
    missing = [label for label in _LABEL_PREFIXES if label not in found]
    if missing:
        raise ValueError(
            f"NLI model label2id {dict(label2id)} lacks {missing}: a 3-way entailment/neutral/contradiction "
            "classifier is required (generic LABEL_0.. names cannot be mapped safely)"
        )
    return found[ENTAIL], found[NEUTRAL], found[CONTRADICTION]


def effective_max_length(requested: int, tokenizer: Any, config: Any) -> int:
    """The configured max_length, capped by what the tokenizer and the position embeddings allow."""
    limits = [requested]
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and tok_max < 100_000:
        limits.append(tok_max)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        limits.append(positions)
    return min(limits)


def encode_pairs(
    tokenizer: Any, premises: Sequence[str], hypotheses: Sequence[str], max_length: int
) -> tuple[list[dict[str, list[int]]], np.ndarray]:
    """Token ids per pair with only the premise cut when the pair is too long; and which pairs were cut.

    Pairs are tokenised once without truncation; only the too-long ones are encoded again with
    `truncation="only_first"`. A hypothesis too long on its own cannot be saved by cutting the premise:
    that pair falls back to `longest_first` (still counted as truncated).
    """
    names = [n for n in tokenizer.model_input_names if n in ("input_ids", "token_type_ids", "attention_mask")]
    full = tokenizer(list(premises), list(hypotheses), truncation=False)
    rows = [{n: full[n][i] for n in names if n in full} for i in range(len(premises))]
    too_long = np.array([len(r["input_ids"]) > max_length for r in rows], dtype=bool)
    for i in np.flatnonzero(too_long):
        try:
            enc = tokenizer(premises[i], hypotheses[i], truncation="only_first", max_length=max_length)
        except Exception:  # the tokenizers library refuses when the hypothesis alone is too long
            enc = tokenizer(premises[i], hypotheses[i], truncation="longest_first", max_length=max_length)
        rows[i] = {n: enc[n] for n in names if n in enc}
    return rows, too_long


def _pad(rows: list[dict[str, list[int]]], pad_id: int, left: bool) -> dict[str, np.ndarray]:
    width = max(len(r["input_ids"]) for r in rows)
    out: dict[str, np.ndarray] = {}
    for name in rows[0]:
        fill = pad_id if name == "input_ids" else 0
        arr = np.full((len(rows), width), fill, dtype=np.int64)
        for j, r in enumerate(rows):
            ids = r[name]
            if left:
                arr[j, width - len(ids) :] = ids
            else:
                arr[j, : len(ids)] = ids
        out[name] = arr
    if "attention_mask" not in out:
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for j, r in enumerate(rows):
            n = len(r["input_ids"])
            if left:
                mask[j, width - n :] = 1
            else:
                mask[j, :n] = 1
        out["attention_mask"] = mask
    return out


def softmax_labels(logits: np.ndarray, indices: tuple[int, int, int]) -> np.ndarray:
    """Softmax over all logits, then the (entail, neutral, contradiction) columns."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probs = exp / exp.sum(axis=1, keepdims=True)
    return probs[:, list(indices)]


def predict_pairs(
    model: Any,
    tokenizer: Any,
    premises: Sequence[str],
    hypotheses: Sequence[str],
    batch_size: int,
    max_length: int,
    indices: tuple[int, int, int] | None = None,
    sort: bool = True,
) -> NliOutput:
    """Batched, length-sorted (unless sort=False) forward passes; results come back in the input order."""
    import torch

    n = len(premises)
    if n == 0:
        return NliOutput(np.zeros((0, 3)), np.zeros(0, dtype=bool))
    indices = indices or label_indices(model.config.label2id)
    limit = effective_max_length(max_length, tokenizer, model.config)
    rows, truncated = encode_pairs(tokenizer, premises, hypotheses, limit)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    left = getattr(tokenizer, "padding_side", "right") == "left"
    device = next(model.parameters()).device
    probs = np.empty((n, 3), dtype=np.float64)
    with torch.inference_mode():
        for idx in length_batches([len(r["input_ids"]) for r in rows], batch_size, sort):
            arrays = _pad([rows[i] for i in idx], pad_id, left)
            inputs = {k: torch.from_numpy(v).to(device) for k, v in arrays.items()}
            logits = model(**inputs).logits.float().cpu().numpy()
            probs[idx] = softmax_labels(logits, indices)
    return NliOutput(probs, truncated)


def as_output(result: NliOutput | np.ndarray, n: int) -> NliOutput:
    """Predictors may return a bare (n, 3) array (test fakes); check the shape either way."""
    out = result if isinstance(result, NliOutput) else NliOutput(np.asarray(result, dtype=np.float64), np.zeros(n, bool))
    if out.probs.shape != (n, 3) or out.truncated.shape != (n,):
        raise ValueError(f"NLI predictor returned shapes {out.probs.shape}/{out.truncated.shape} for {n} pairs")
    return out


def score_frame(predict: PredictFn, premises: list[str], hypotheses: list[str], on_error: str) -> pd.DataFrame:
    """Score pairs under the model-UDF error policy (udfs.model_udf: on_error, halving, one error cut).

    With on_error="quarantine" a pair whose scoring raises, or whose probabilities are not finite, gets an
    error text and the rest a score; "fail" raises RuntimeError naming the pair.
    """
    n = len(premises)

    def call(idx: list[int]) -> list[tuple[np.ndarray, bool]]:
        out = as_output(predict([premises[i] for i in idx], [hypotheses[i] for i in idx]), len(idx))
        return list(zip(out.probs, out.truncated, strict=True))

    results, errors = narrowed(call, n, on_error, "NLI scoring", lambda i: premises[i], unit="pairs")
    probs = np.full((n, 3), np.nan)
    truncated = np.zeros(n, dtype=bool)
    for i, result in enumerate(results):
        if result is None:
            continue
        probs[i], truncated[i] = result
        if not all(math.isfinite(p) for p in probs[i]):
            if on_error == "fail":
                raise RuntimeError(f"NLI model gave non-finite probabilities for premise {premises[i][:200]!r}")
            errors[i] = "non-finite probabilities"
    bad = [e is not None for e in errors]

    def column(k: int) -> pd.Series:
        # NaN would reach Spark as NaN, not null: a failed pair must read as a missing score.
        return pd.Series([None if b else float(p) for p, b in zip(probs[:, k], bad, strict=True)], dtype=object)

    return pd.DataFrame(
        {
            ENTAIL: column(0),
            NEUTRAL: column(1),
            CONTRADICTION: column(2),
            TRUNCATED: truncated,
            ERROR: pd.Series(errors, dtype=object),
        }
    )


def model_predictor(
    path: str,
    revision: str | None,
    device: str,
    dtype: str,
    batch_size: int,
    max_length: int,
    threads: int | None = None,
    trust_remote_code: bool = False,
    sort: bool = True,
    cache_size: int | None = None,
) -> PredictFactory:
    """Factory run inside the worker: the task's device, the cached model, a predict function."""

    def factory() -> PredictFn:
        from udfs import runtime

        model, tokenizer, _ = runtime.task_model(
            path, "nli", device, dtype, revision, threads, trust_remote_code, cache_size
        )
        indices = label_indices(model.config.label2id)

        def predict(premises: list[str], hypotheses: list[str]) -> NliOutput:
            return predict_pairs(model, tokenizer, premises, hypotheses, batch_size, max_length, indices, sort)

        return predict

    return factory


def udf_return_type():
    from pyspark.sql.types import BooleanType, DoubleType, StringType, StructField, StructType

    return StructType(
        [
            StructField(ENTAIL, DoubleType(), True),
            StructField(NEUTRAL, DoubleType(), True),
            StructField(CONTRADICTION, DoubleType(), True),
            StructField(TRUNCATED, BooleanType(), True),
            StructField(ERROR, StringType(), True),
        ]
    )


def nli_udf(factory: PredictFactory, on_error: str, sent: Any = None, cut: Any = None):
    """Iterator pandas UDF (premise, hypothesis) -> struct of the three probabilities, truncated, error.

    Chosen over predict_batch_udf so one poisoned pair can be isolated and returned as an error, and so
    length-sorting spans the whole Arrow batch. `sent` / `cut` are optional Spark accumulators counting
    the pairs given to the model and the truncated ones.
    """

    def frame(predict: PredictFn, premises: list[str], hypotheses: list[str]) -> pd.DataFrame:
        out = score_frame(predict, premises, hypotheses, on_error)
        if sent is not None:
            sent.add(len(out))
        if cut is not None:
            cut.add(int(out[TRUNCATED].sum()))
        return out

    return model_udf("score", udf_return_type(), factory, frame, 2, nulls_as_empty=False)


# --- training maths (jobs.training.train_nli) ------------------------------------------------------------------


def to_logit_order(canonical: np.ndarray, indices: tuple[int, int, int]) -> np.ndarray:
    """(n, 3) values in the fixed (entail, neutral, contradiction) order -> the model's own logit order."""
    out = np.empty_like(canonical)
    out[:, list(indices)] = canonical
    return out


def distill_loss(logits: Any, labels: Any, soft: Any, alpha: float, temperature: float = 1.0) -> Any:
    """alpha * KL(teacher || student) + (1 - alpha) * cross-entropy on the gold labels, per batch (torch).

    `soft` holds the teacher's probabilities in the model's logit order (None: no teacher); a label of -100
    marks a pair without a gold label (it counts only in the KL term). The KL term is scaled by T^2 so its
    gradients keep their size when the temperature softens both distributions (Hinton et al., 2015).
    """
    import torch
    import torch.nn.functional as F

    has_gold = bool((labels != -100).any()) if labels is not None else False
    ce = F.cross_entropy(logits, labels, ignore_index=-100) if has_gold else logits.sum() * 0.0
    if soft is None:
        return ce
    log_student = F.log_softmax(logits / temperature, dim=-1)
    teacher = soft if temperature == 1.0 else torch.softmax(torch.log(soft.clamp_min(1e-12)) / temperature, -1)
    kl = F.kl_div(log_student, teacher, reduction="batchmean") * temperature**2
    weight = alpha if has_gold else 1.0  # pairs without gold labels learn from the teacher alone
    return weight * kl + (1.0 - weight) * ce


def mean_kl(p: np.ndarray, q: np.ndarray) -> float:
    """Mean KL(p || q) over rows of two (n, 3) probability arrays (nats)."""
    p = np.clip(p, 1e-12, 1.0)
    q = np.clip(q, 1e-12, 1.0)
    return float(np.mean(np.sum(p * (np.log(p) - np.log(q)), axis=1)))
