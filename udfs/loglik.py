"""Log-likelihood of a target text given a source text, for causal and seq2seq LMs (plain torch; Spark UDF at the end).

API
---
- ``score(model, tokenizer, family, sources, targets, batch_size, max_length, device, padding_side="right")
  -> list[TargetScore]``: natural-log probability of each target's tokens given its source.
  * seq2seq (encoder-decoder): source -> encoder (with the tokenizer's special tokens, e.g. T5's ``</s>``),
    target -> decoder labels, tokenised WITHOUT special tokens, so EOS is never scored.
  * causal (decoder-only): the target continues the source: ``ids = source_ids + target_ids`` and the logit at
    position t scores token t+1 (shifted). Source and target are tokenised separately, without special tokens;
    an empty source is replaced by the BOS (else EOS) token so the first target token has a context.
  * Pairs are sorted by length, cut into batches of ``batch_size`` and the results put back in input order.
    Padding positions are masked (attention mask; causal LMs also get explicit position ids, so left and
    right padding give the same numbers).
  * Over ``max_length`` tokens the SOURCE is cut from the left (the end of the source, next to the target,
    is what matters: " Therefore," and "->" sit there); ``TargetScore.truncated`` says so. A target longer
    than ``max_length - 1`` is cut from the right as well (also flagged).
- ``TargetScore(sum_logprob, n_tokens, mean_logprob, truncated)``; ``mean_logprob`` is NaN when the target
  has no tokens.
- Low-level pieces for other scorers (e.g. prompt-shared option scoring in CoT evaluation):
  ``encode_pairs`` (token ids + truncation), ``causal_batch`` / ``seq2seq_batch`` (padded tensors),
  ``token_logprobs(logits, labels, mask)`` (log-softmax + gather, zero where masked),
  ``batch_logprobs(model, family, batch)`` (one forward pass -> per-token target log-probs),
  ``length_batches(lengths, batch_size, sort)`` (length-sorted index batches, from ``udfs.runtime``).
- ``Scorer``: a callable ``(sources, targets) -> list[TargetScore]`` bound to a loaded model; counts calls,
  pairs and truncations (tests and benchmarks read the counters).
- ``loglik_udf(...)``: an iterator pandas UDF over (source, target) string columns returning
  ``struct(sum_logprob double, n_tokens int, mean_logprob double, truncated boolean, error string)``; the model
  is loaded once per Python worker with ``udfs.runtime.load_model`` on ``runtime.task_device``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Tuple  # noqa: UP035 (pandas_udf type hints need typing.Tuple)

import pandas as pd
import torch

from udfs.runtime import length_batches

Family = Literal["causal", "seq2seq"]
IGNORE = -100  # label value torch's cross-entropy and HF models ignore


@dataclass(frozen=True)
class TargetScore:
    sum_logprob: float
    n_tokens: int
    mean_logprob: float
    truncated: bool = False


@dataclass(frozen=True)
class Encoded:
    source_ids: list[int]
    target_ids: list[int]
    truncated: bool

    @property
    def length(self) -> int:
        return len(self.source_ids) + len(self.target_ids)


# --- tokenisation ------------------------------------------------------------------------------------------


def _start_id(tokenizer: Any) -> int:
    for tid in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id):
        if tid is not None:
            return int(tid)
    raise ValueError("causal LM tokenizer has no BOS, EOS or pad token to stand in for an empty source")


def pad_id(tokenizer: Any) -> int:
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0


def encode_pairs(
    tokenizer: Any, family: Family, sources: Sequence[str], targets: Sequence[str], max_length: int
) -> list[Encoded]:
    """Token ids per pair, EOS kept out of the target, sources cut from the left past `max_length`."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    special = family == "seq2seq"
    src = tokenizer(list(sources), add_special_tokens=special)["input_ids"]
    tgt = tokenizer(list(targets), add_special_tokens=False)["input_ids"]
    out: list[Encoded] = []
    for s, t in zip(src, tgt, strict=True):
        s, t = list(s), list(t)
        truncated = False
        if family == "causal":
            if not s:
                s = [_start_id(tokenizer)]
            if len(t) > max_length - 1:
                t, truncated = t[: max_length - 1], True
            room = max_length - len(t)
            if len(s) > room:
                s, truncated = s[len(s) - room :], True
        else:
            if len(s) > max_length:
                s, truncated = s[len(s) - max_length :], True
            if len(t) > max_length:
                t, truncated = t[:max_length], True
        out.append(Encoded(s, t, truncated))
    return out


# --- batching ----------------------------------------------------------------------------------------------


def causal_batch(
    items: Sequence[Encoded], pad: int, padding_side: str = "right", device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """input_ids/attention_mask/position_ids plus `labels`/`label_mask` aligned with the shifted logits.

    labels[b, t] is the token at position t+1 when it belongs to the target, so
    `token_logprobs(logits[:, :-1], labels, label_mask)` gives the target log-probs.
    """
    width = max(e.length for e in items)
    ids = torch.full((len(items), width), pad, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    labels = torch.zeros((len(items), width - 1), dtype=torch.long)
    label_mask = torch.zeros((len(items), width - 1), dtype=torch.bool)
    for b, e in enumerate(items):
        seq = e.source_ids + e.target_ids
        start = width - len(seq) if padding_side == "left" else 0
        ids[b, start : start + len(seq)] = torch.tensor(seq)
        mask[b, start : start + len(seq)] = 1
        first = start + len(e.source_ids)  # position of the first target token
        if e.target_ids:
            labels[b, first - 1 : first - 1 + len(e.target_ids)] = torch.tensor(e.target_ids)
            label_mask[b, first - 1 : first - 1 + len(e.target_ids)] = True
    # Positions count real tokens only, so a left-padded row sees the same positions as unpadded.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "position_ids": positions.to(device),
        "labels": labels.to(device),
        "label_mask": label_mask.to(device),
    }


def seq2seq_batch(
    items: Sequence[Encoded], pad: int, padding_side: str = "right", device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Encoder inputs padded on `padding_side`; decoder labels always right-padded with -100."""
    width = max(len(e.source_ids) for e in items)
    t_width = max(1, max(len(e.target_ids) for e in items))
    ids = torch.full((len(items), width), pad, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    labels = torch.full((len(items), t_width), IGNORE, dtype=torch.long)
    for b, e in enumerate(items):
        n = len(e.source_ids)
        start = width - n if padding_side == "left" else 0
        ids[b, start : start + n] = torch.tensor(e.source_ids)
        mask[b, start : start + n] = 1
        if e.target_ids:
            labels[b, : len(e.target_ids)] = torch.tensor(e.target_ids)
    label_mask = labels != IGNORE
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "labels": labels.to(device),
        "label_mask": label_mask.to(device),
    }


# --- maths -------------------------------------------------------------------------------------------------


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p(labels[b, t]) under logits[b, t] (natural log, float32), 0 where `mask` is false.

    Labels under a false mask may hold anything (e.g. -100): they are replaced before the gather.
    """
    logits = logits.float()
    safe = torch.where(mask.bool(), labels, torch.zeros_like(labels))
    picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    logp = picked - torch.logsumexp(logits, dim=-1)
    return logp * mask.to(logp.dtype)


def _decoder_inputs(model: Any, labels: torch.Tensor) -> torch.Tensor:
    start = model.config.decoder_start_token_id
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    shifted = labels.new_full(labels.shape, pad)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = start if start is not None else pad
    return shifted.masked_fill(shifted == IGNORE, pad)


@torch.inference_mode()
def batch_logprobs(model: Any, family: Family, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One forward pass -> (batch, target width) log-probs of the target tokens, 0 on padding."""
    if family == "seq2seq":
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=_decoder_inputs(model, batch["labels"]),
            use_cache=False,
        )
        return token_logprobs(out.logits, batch["labels"], batch["label_mask"])
    label_mask = batch["label_mask"]
    if not bool(label_mask.any()):
        return torch.zeros(label_mask.shape, dtype=torch.float32, device=label_mask.device)
    # Only positions that score a target token need the LM head (a vocabulary-wide matmul): keep the columns
    # from the first one any row needs.
    first = int(label_mask.any(0).nonzero()[0])
    keep = label_mask.shape[1] - first
    kwargs: dict[str, Any] = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "position_ids": batch["position_ids"],
        "use_cache": False,
    }
    try:
        # logits_to_keep counts from the end of the full sequence; the last position scores nothing.
        logits = model(**kwargs, logits_to_keep=keep + 1).logits[:, :-1]
    except TypeError:  # architectures without logits_to_keep
        logits = model(**kwargs).logits[:, first:-1]
    return token_logprobs(logits, batch["labels"][:, first:], label_mask[:, first:])


def score(
    model: Any,
    tokenizer: Any,
    family: Family,
    sources: Sequence[str],
    targets: Sequence[str],
    batch_size: int = 32,
    max_length: int = 512,
    device: str = "cpu",
    padding_side: str = "right",
    sort: bool = True,
) -> list[TargetScore]:
    """Sum, count and mean natural-log probability of each target given its source, in input order."""
    if family not in ("causal", "seq2seq"):
        raise ValueError(f"family must be causal or seq2seq, got {family!r}")
    if not sources and not targets:
        return []
    encoded = encode_pairs(tokenizer, family, sources, targets, max_length)
    pad = pad_id(tokenizer)
    build = causal_batch if family == "causal" else seq2seq_batch
    results: list[TargetScore | None] = [None] * len(encoded)
    for idx in length_batches([e.length for e in encoded], batch_size, sort):
        items = [encoded[i] for i in idx]
        logp = batch_logprobs(model, family, build(items, pad, padding_side, device))
        sums = logp.sum(-1).double().cpu().tolist()
        for i, total in zip(idx, sums, strict=True):
            n = len(encoded[i].target_ids)
            results[i] = TargetScore(
                sum_logprob=float(total) if n else 0.0,
                n_tokens=n,
                mean_logprob=float(total) / n if n else math.nan,
                truncated=encoded[i].truncated,
            )
    return results  # type: ignore[return-value]


class Scorer:
    """`score` bound to one loaded model; counts calls, pairs scored and truncated pairs."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        family: Family,
        batch_size: int = 32,
        max_length: int = 512,
        device: str = "cpu",
        padding_side: str = "right",
        sort: bool = True,
    ) -> None:
        self.model, self.tokenizer, self.family, self.sort = model, tokenizer, family, sort
        self.batch_size, self.max_length, self.device, self.padding_side = batch_size, max_length, device, padding_side
        self.calls = 0
        self.pairs = 0
        self.truncated = 0

    def __call__(self, sources: Sequence[str], targets: Sequence[str]) -> list[TargetScore]:
        self.calls += 1
        self.pairs += len(sources)
        out = score(
            self.model, self.tokenizer, self.family, sources, targets,
            self.batch_size, self.max_length, self.device, self.padding_side, self.sort,
        )
        self.truncated += sum(s.truncated for s in out)
        return out


# --- Spark -------------------------------------------------------------------------------------------------

ScoreFn = Callable[[Sequence[str], Sequence[str]], Sequence[TargetScore]]

UDF_FIELDS = "sum_logprob double, n_tokens int, mean_logprob double, truncated boolean, error string"


def model_scorer_factory(
    path: str,
    family: Family,
    device: str = "auto",
    dtype: str = "auto",
    revision: str | None = None,
    batch_size: int = 32,
    max_length: int = 512,
    torch_threads: int | None = None,
    trust_remote_code: bool = False,
    sort: bool = True,
) -> Callable[[], ScoreFn]:
    """A picklable factory that, on the executor, loads the model once per worker and returns a Scorer."""

    def factory() -> ScoreFn:
        from udfs import runtime

        model, tok, dev = runtime.task_model(path, family, device, dtype, revision, torch_threads, trust_remote_code)
        # Causal LMs are left-padded: every row's target then ends at the last column and the LM head runs
        # only over the last (longest target) columns.
        side = "left" if family == "causal" else "right"
        return Scorer(model, tok, family, batch_size, max_length, dev, side, sort)

    return factory


def score_frame(score_fn: ScoreFn, sources: Sequence[str], targets: Sequence[str], on_error: str) -> list[dict]:
    """Score a chunk; in quarantine mode a failing chunk is retried row by row and failures carry `error`."""

    def row(s: TargetScore) -> dict:
        mean = None if math.isnan(s.mean_logprob) else s.mean_logprob
        return {"sum_logprob": s.sum_logprob, "n_tokens": s.n_tokens, "mean_logprob": mean,
                "truncated": s.truncated, "error": None}

    def failed(err: Exception) -> dict:
        return {"sum_logprob": None, "n_tokens": None, "mean_logprob": None, "truncated": None,
                "error": f"{type(err).__name__}: {err}"[:2000]}

    if on_error == "fail":
        return [row(s) for s in score_fn(sources, targets)]
    try:
        return [row(s) for s in score_fn(sources, targets)]
    except Exception:
        out = []
        for s, t in zip(sources, targets, strict=True):
            try:
                out.append(row(score_fn([s], [t])[0]))
            except Exception as err:  # the row goes to quarantine, the job goes on
                out.append(failed(err))
        return out


def loglik_udf(factory: Callable[[], ScoreFn], on_error: str = "fail"):
    """Iterator pandas UDF (source, target) -> struct; `factory` runs once per worker (cached by load_model).

    Build it once and reuse it. `factory` may be `model_scorer_factory(...)` or, in tests, any picklable
    callable returning a scoring function.
    """
    from pyspark.sql.functions import pandas_udf

    @pandas_udf(UDF_FIELDS)
    def loglik(batches: Iterator[Tuple[pd.Series, pd.Series]]) -> Iterator[pd.DataFrame]:  # noqa: UP006
        score_fn = factory()
        for sources, targets in batches:
            rows = score_frame(score_fn, sources.fillna("").tolist(), targets.fillna("").tolist(), on_error)
            frame = pd.DataFrame(rows, columns=["sum_logprob", "n_tokens", "mean_logprob", "truncated", "error"])
            yield frame.astype({"n_tokens": "Int32", "truncated": "boolean"})

    return loglik
