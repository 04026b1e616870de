"""Log-likelihood of a target text given a source text, for causal and seq2seq LMs (plain torch; Spark UDF at the end).

API
---
- ``score(model, tokenizer, family, sources, targets, batch_size, max_length=None, device, padding_side="right")
  -> list[TargetScore]``: natural-log probability of each target's tokens given its source.
  * seq2seq (encoder-decoder): source -> encoder (with the tokenizer's special tokens, e.g. T5's ``</s>``),
    target -> decoder labels, tokenised WITHOUT special tokens, so EOS is never scored.
  * causal (decoder-only): the target continues the source: ``ids = source_ids + target_ids`` and the logit at
    position t scores token t+1 (shifted). Source and target are tokenised separately, without special tokens;
    an empty source is replaced by the BOS (else EOS) token so the first target token has a context.
  * Pairs are sorted by length, cut into batches of ``batch_size`` (and of ``max_tokens`` padded positions when
    given) and the results put back in input order.
  * ``share_prefix=True`` (causal only): pairs whose source token ids share a prefix (the L(k) passes of one
    chain: " s1 Therefore,", " s1 s2 Therefore,", ...; every g' pass: one constant source) are scored as a
    group in one packed pass (``packed_logprobs``): the longest source once, then each pair's own rest of source
    and target, under a mask that lets each pair see its shared prefix and itself only, at the positions it has
    alone (so sliding-window layers see what the pair alone sees). The token ids are each pair's own
    tokenisation, so where BPE merges across a step boundary the shared part is just shorter: the numbers equal
    separate scoring. Padding positions are masked (attention mask; causal LMs also get explicit position ids,
    so left and right padding give the same numbers).
  * Sources and targets are scored WHOLE up to the model's own position limit (``position_limit``: the config's
    ``n_positions`` / ``max_position_embeddings`` / ``n_ctx``, else the tokenizer's ``model_max_length``; T5's
    relative positions have no config limit, so its tokenizer's value counts, 512 for t5-large; none known: no
    cut). ``max_length`` is an optional lower cap (never above the model's limit). A causal row counts source +
    target positions, a seq2seq row the encoder source and the decoder target separately. Only a row over the
    limit is cut, and then ``TargetScore.truncated`` says so: the SOURCE is cut from the left (the end of the
    source, next to the target, is what matters: " Therefore," and "->" sit there); a target longer than the
    limit (causal: limit - 1) is cut from the right as well.
- ``TargetScore(sum_logprob, n_tokens, mean_logprob, truncated)``; ``mean_logprob`` is NaN when the target
  has no tokens.
- Low-level pieces for other scorers (e.g. prompt-shared option scoring in CoT evaluation):
  ``encode_pairs`` (token ids + truncation); in ``udfs.loglik_batches``: ``causal_batch`` / ``seq2seq_batch``
  (padded tensors), ``token_logprobs(logits, labels, mask)`` (log-softmax + gather, zero where masked),
  ``batch_logprobs(model, family, batch)`` (one forward pass -> per-token target log-probs),
  ``length_batches(lengths, batch_size, sort)`` (length-sorted index batches, from ``udfs.runtime``).
- ``share_prefixes(encoded) -> (groups, singles)``: the grouping above, plain Python (``udfs.prefix_sharing``).
- ``Scorer``: a callable ``(sources, targets) -> list[TargetScore]`` bound to a loaded model; counts calls,
  pairs, truncations and the token positions the model ran (tests and benchmarks read the counters).
- ``loglik_udf(...)``: an iterator pandas UDF over (source, target) string columns returning
  ``struct(sum_logprob double, n_tokens int, mean_logprob double, truncated boolean, error string)``; the model
  is loaded once per Python worker with ``udfs.runtime.load_model`` on ``runtime.task_device``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from udfs.loglik_batches import Encoded, Family, Stats, batch_logprobs, causal_batch, seq2seq_batch
from udfs.model_udf import model_udf, narrowed
from udfs.prefix_sharing import PrefixGroup, packed_logprobs, share_prefixes
from udfs.runtime import length_batches


@dataclass(frozen=True)
class TargetScore:
    sum_logprob: float
    n_tokens: int
    mean_logprob: float
    truncated: bool = False


# --- tokenisation ------------------------------------------------------------------------------------------


def _start_id(tokenizer: Any) -> int:
    for tid in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id):
        if tid is not None:
            return int(tid)
    raise ValueError("causal LM tokenizer has no BOS, EOS or pad token to stand in for an empty source")


def causal_prefix(tokenizer: Any) -> list[int]:
    """The ids the tokenizer itself puts before a text (Gemma's `<bos>`; none for GPT-2 or Qwen).

    A causal LM reads a text as it was trained to: Gemma without its `<bos>` scores every continuation several
    nats off (measured against lm-evaluation-harness, which prepends it for Gemma). Found by encoding one
    character with and without the special tokens, so no family list is kept here.
    """
    with_special = list(tokenizer("a")["input_ids"])
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    for start in range(len(with_special) - len(plain) + 1):
        if with_special[start : start + len(plain)] == plain:
            return with_special[:start]
    return []


def causal_ids(tokenizer: Any, texts: Sequence[str], prefix: Sequence[int] | None = None) -> list[list[int]]:
    """Token ids of causal-LM inputs: the tokenizer's own prefix (`prefix`, when the caller has it already), then
    the text. A text that already begins with the BOS token's string (a chat template writes Gemma's `<bos>`
    itself) gets no second one."""
    prefix = causal_prefix(tokenizer) if prefix is None else list(prefix)
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    bos = getattr(tokenizer, "bos_token", None)
    return [
        list(seq) if not prefix or (bos and text.startswith(bos)) else prefix + list(seq)
        for text, seq in zip(texts, ids, strict=True)
    ]


def cut_left(seq: list[int], room: int, keep: Sequence[int] = ()) -> list[int]:
    """`seq` cut from the left to `room` tokens, its leading `keep` ids (the tokenizer's prefix) kept in front."""
    if len(seq) <= room:
        return seq
    head = len(keep) if keep and seq[: len(keep)] == list(keep) and room > len(keep) else 0
    return seq[:head] + seq[len(seq) - (room - head) :]


def pad_id(tokenizer: Any) -> int:
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0


# A tokenizer that knows no limit reports a huge model_max_length (transformers' VERY_LARGE_INTEGER, 1e30).
_NO_LIMIT = 10**9


def position_limit(model: Any, tokenizer: Any = None) -> int | None:
    """The longest input the model itself takes, in tokens; None when neither config nor tokenizer knows one.

    Absolute position embeddings (GPT-2's n_positions, BERT-style max_position_embeddings) are a hard limit:
    a longer input fails or reads garbage. T5's relative positions have none, so the tokenizer's
    model_max_length (the length the checkpoint was trained on; 512 for the t5 family) is taken instead.
    """
    config = getattr(model, "config", None)
    for name in ("n_positions", "max_position_embeddings", "n_ctx", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < _NO_LIMIT:
        return value
    return None


def effective_limit(max_length: int | None, model: Any, tokenizer: Any = None) -> int | None:
    """`max_length` (an optional cap) bounded by the model's own limit; None: no cut at all."""
    limits = [x for x in (max_length, position_limit(model, tokenizer)) if x is not None]
    return min(limits) if limits else None


def encode_pairs(
    tokenizer: Any, family: Family, sources: Sequence[str], targets: Sequence[str], max_length: int | None
) -> list[Encoded]:
    """Token ids per pair, EOS kept out of the target, sources cut from the left past `max_length` (None: never)."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    causal = family == "causal"
    prefix = causal_prefix(tokenizer) if causal else []
    src = causal_ids(tokenizer, sources, prefix) if causal else tokenizer(list(sources))["input_ids"]
    tgt = tokenizer(list(targets), add_special_tokens=False)["input_ids"]
    out: list[Encoded] = []
    for s, t in zip(src, tgt, strict=True):
        s, t = list(s), list(t)
        truncated = False
        if max_length is None:
            pass
        elif family == "causal":
            if not s:
                s = [_start_id(tokenizer)]
            if len(t) > max_length - 1:
                t, truncated = t[: max_length - 1], True
            room = max_length - len(t)
            if len(s) > room:
                s, truncated = cut_left(s, room, prefix), True
        else:
            if len(s) > max_length:
                s, truncated = s[len(s) - max_length :], True
            if len(t) > max_length:
                t, truncated = t[:max_length], True
        out.append(Encoded(s, t, truncated))
    return out


def logprob_sums(
    model: Any, family: Family, encoded: Sequence[Encoded], pad: int, batch_size: int, device: str = "cpu",
    padding_side: str = "right", sort: bool = True, groups: Sequence[PrefixGroup] = (), stats: Stats | None = None,
    max_tokens: int | None = None,
) -> dict[int, float]:  # fmt: skip
    """Summed target log-probs of every encoded pair, by index: pairs in `groups` (causal only) are scored in
    one packed pass per group (`packed_logprobs`), the others are batched on their own."""
    stats = stats if stats is not None else Stats()
    sums = packed_logprobs(model, encoded, groups, pad, batch_size, device, sort, stats, max_tokens) if groups else {}
    alone = [i for i in range(len(encoded)) if i not in sums]
    build = causal_batch if family == "causal" else seq2seq_batch
    for idx in length_batches([encoded[i].length for i in alone], batch_size, sort, max_tokens):
        batch = build([encoded[alone[k]] for k in idx], pad, padding_side, device)
        logp = batch_logprobs(model, family, batch)
        stats.add(batch["attention_mask"])
        for k, total in zip(idx, logp.sum(-1).double().cpu().tolist(), strict=True):
            sums[alone[k]] = total
    return sums


def score(
    model: Any,
    tokenizer: Any,
    family: Family,
    sources: Sequence[str],
    targets: Sequence[str],
    batch_size: int = 32,
    max_length: int | None = None,
    device: str = "cpu",
    padding_side: str = "right",
    sort: bool = True,
    share_prefix: bool = False,
    stats: Stats | None = None,
    max_tokens: int | None = None,
) -> list[TargetScore]:
    """Sum, count and mean natural-log probability of each target given its source, in input order.

    `max_length` None: rows are cut only past the model's own position limit (`effective_limit`)."""
    if family not in ("causal", "seq2seq"):
        raise ValueError(f"family must be causal or seq2seq, got {family!r}")
    if not sources and not targets:
        return []
    encoded = encode_pairs(tokenizer, family, sources, targets, effective_limit(max_length, model, tokenizer))
    groups = share_prefixes(encoded)[0] if share_prefix and family == "causal" else []
    sums = logprob_sums(
        model, family, encoded, pad_id(tokenizer), batch_size, device, padding_side, sort, groups, stats, max_tokens
    )
    results = []
    for i, e in enumerate(encoded):
        n = len(e.target_ids)
        results.append(TargetScore(
            sum_logprob=float(sums[i]) if n else 0.0,
            n_tokens=n,
            mean_logprob=float(sums[i]) / n if n else math.nan,
            truncated=e.truncated,
        ))  # fmt: skip
    return results


class Scorer:
    """`score` bound to one loaded model; counts calls, pairs scored, truncated pairs and model work."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        family: Family,
        batch_size: int = 32,
        max_length: int | None = None,
        device: str = "cpu",
        padding_side: str = "right",
        sort: bool = True,
        share_prefix: bool = False,
        max_tokens: int | None = None,
    ) -> None:
        self.model, self.tokenizer, self.family, self.sort = model, tokenizer, family, sort
        self.batch_size, self.max_length, self.device, self.padding_side = batch_size, max_length, device, padding_side
        self.share_prefix, self.max_tokens = share_prefix, max_tokens
        self.calls = 0
        self.pairs = 0
        self.truncated = 0
        self.stats = Stats()

    def __call__(self, sources: Sequence[str], targets: Sequence[str]) -> list[TargetScore]:
        self.calls += 1
        self.pairs += len(sources)
        out = score(
            self.model, self.tokenizer, self.family, sources, targets, self.batch_size, self.max_length,
            self.device, self.padding_side, self.sort, self.share_prefix, self.stats, self.max_tokens,
        )
        self.truncated += sum(s.truncated for s in out)
        return out


# --- Spark -------------------------------------------------------------------------------------------------

TargetScoreFn = Callable[[Sequence[str], Sequence[str]], Sequence[TargetScore]]

UDF_FIELDS = "sum_logprob double, n_tokens int, mean_logprob double, truncated boolean, error string"


def model_scorer_factory(
    path: str,
    family: Family,
    device: str = "auto",
    dtype: str = "auto",
    revision: str | None = None,
    batch_size: int = 32,
    max_length: int | None = None,
    torch_threads: int | None = None,
    trust_remote_code: bool = False,
    sort: bool = True,
    share_prefix: bool = False,
    max_tokens: int | None = None,
    cache_size: int | None = None,
) -> Callable[[], TargetScoreFn]:
    """A picklable factory that, on the executor, loads the model once per worker and returns a Scorer."""

    def factory() -> TargetScoreFn:
        from udfs import runtime

        model, tok, dev = runtime.task_model(
            path, family, device, dtype, revision, torch_threads, trust_remote_code, cache_size
        )
        # Causal LMs are left-padded: every row's target then ends at the last column and the LM head runs
        # only over the last (longest target) columns.
        side = "left" if family == "causal" else "right"
        return Scorer(model, tok, family, batch_size, max_length, dev, side, sort, share_prefix, max_tokens)

    return factory


def score_frame(score_fn: TargetScoreFn, sources: Sequence[str], targets: Sequence[str], on_error: str) -> list[dict]:
    """Score a chunk under the model-UDF error policy (udfs.model_udf); failed rows carry `error`."""

    def call(idx: list[int]) -> Sequence[TargetScore]:
        return score_fn([sources[i] for i in idx], [targets[i] for i in idx])

    scores, errors = narrowed(call, len(sources), on_error, "log-likelihood scoring", lambda i: sources[i])

    def row(s: TargetScore | None, error: str | None) -> dict:
        if s is None:
            return {"sum_logprob": None, "n_tokens": None, "mean_logprob": None, "truncated": None, "error": error}
        mean = None if math.isnan(s.mean_logprob) else s.mean_logprob
        return {"sum_logprob": s.sum_logprob, "n_tokens": s.n_tokens, "mean_logprob": mean,
                "truncated": s.truncated, "error": None}

    return [row(s, e) for s, e in zip(scores, errors, strict=True)]


def loglik_udf(factory: Callable[[], TargetScoreFn], on_error: str = "fail", sent: Any = None):
    """Iterator pandas UDF (source, target) -> struct; `factory` runs once per task (weights cached per worker).

    Build it once and reuse it. `factory` may be `model_scorer_factory(...)` or, in tests, any picklable
    callable returning a scoring function. `sent`: an optional Spark accumulator counting the pairs scored.
    """

    def frame(score_fn: TargetScoreFn, sources: list[str], targets: list[str]) -> pd.DataFrame:
        rows = score_frame(score_fn, sources, targets, on_error)
        if sent is not None:
            sent.add(len(rows))
        out = pd.DataFrame(rows, columns=["sum_logprob", "n_tokens", "mean_logprob", "truncated", "error"])
        return out.astype({"n_tokens": "Int32", "truncated": "boolean"})

    return model_udf("loglik", UDF_FIELDS, factory, frame, 2)
