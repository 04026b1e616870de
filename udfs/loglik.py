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
  ``encode_pairs`` (token ids + truncation), ``causal_batch`` / ``seq2seq_batch`` (padded tensors),
  ``token_logprobs(logits, labels, mask)`` (log-softmax + gather, zero where masked),
  ``batch_logprobs(model, family, batch)`` (one forward pass -> per-token target log-probs),
  ``length_batches(lengths, batch_size, sort)`` (length-sorted index batches, from ``udfs.runtime``).
- ``share_prefixes(encoded) -> (groups, singles)``: the grouping above, plain Python.
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
from typing import Any, Literal

import pandas as pd
import torch

from udfs.model_udf import model_udf, narrowed
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


def decoder_start_id(model: Any) -> int:
    """The token an encoder-decoder's decoder starts from (T5: the pad token)."""
    start, pad = model.config.decoder_start_token_id, model.config.pad_token_id
    return int(start if start is not None else pad if pad is not None else 0)


def _decoder_inputs(model: Any, labels: torch.Tensor) -> torch.Tensor:
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    shifted = labels.new_full(labels.shape, pad)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_id(model)
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
    # The last position scores nothing.
    logits = causal_forward(model, kwargs, keep + 1).logits[:, :-1]
    return token_logprobs(logits, batch["labels"][:, first:], label_mask[:, first:])


def causal_forward(model: Any, kwargs: dict[str, Any], keep: int | torch.Tensor) -> Any:
    """A causal LM forward whose output keeps the logits of the last `keep` positions only (or, a tensor, of
    those positions)."""
    try:
        return model(**kwargs, logits_to_keep=keep)
    except TypeError:  # architectures without logits_to_keep: the full logits, cut here
        out = model(**kwargs)
        out.logits = out.logits[:, -keep:] if isinstance(keep, int) else out.logits[:, keep]
        return out


# --- prefix sharing (causal) --------------------------------------------------------------------------------


@dataclass
class Stats:
    """Model work done by `score`: forward passes and token positions run (padding not counted)."""

    forwards: int = 0
    positions: int = 0

    def add(self, mask: torch.Tensor) -> None:
        self.forwards += 1
        self.positions += int(mask.sum())


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass(frozen=True)
class PrefixGroup:
    """Pairs scored off one cached context: `context` runs once; row (i, visible) reads context[:visible]."""

    context: list[int]
    rows: list[tuple[int, int]]


def share_prefixes(encoded: Sequence[Encoded], min_shared: int = 2) -> tuple[list[PrefixGroup], list[int]]:
    """Causal pairs -> groups whose sources share a prefix, and the indices left to score on their own.

    Sorted by source ids, sources with a common prefix are contiguous, and a source's longest common prefix with
    any other source is the one with a neighbour. A run is cut where neighbours share fewer than `min_shared`
    tokens or less than half of the shorter source (a few shared tokens would only widen the cache every row
    attends to). Within a run every source shares at least that much with the longest one, the run's context.
    A row sees one token less of the context than it shares: that token is run again in the row, so the first
    target token is scored from the row's own logits even when nothing of the source follows the shared part.
    """
    order = sorted(range(len(encoded)), key=lambda i: encoded[i].source_ids)
    runs: list[list[int]] = []
    for i in order:
        if runs:
            prev, src = encoded[runs[-1][-1]].source_ids, encoded[i].source_ids
            shared = common_prefix(prev, src)
            if shared >= min_shared and 2 * shared >= min(len(prev), len(src)):
                runs[-1].append(i)
                continue
        runs.append([i])
    groups: list[PrefixGroup] = []
    singles: list[int] = []
    for run in runs:
        if len(run) == 1:
            singles.extend(run)
            continue
        trunk = max((encoded[i].source_ids for i in run), key=len)
        rows = [(i, common_prefix(encoded[i].source_ids, trunk) - 1) for i in run]
        groups.append(PrefixGroup(trunk[: max(v for _, v in rows)], rows))
    return groups, singles


@dataclass(frozen=True)
class Packed:
    """One prefix group laid out as a single sequence: the context once, each row right after the context token
    where its shared prefix ends (so what a row reads of the context lies just before it).

    `segment` is 0 on the context and r + 1 on row r; `visible` is, per token of row r, how much of the context
    that row reads (its shared prefix; a context token: its own position + 1), and `positions` restarts each row
    where its shared prefix ends, so every token sits at the position it has in the pair scored on its own.
    `scored` lists, per pair with a target, the packed indices whose logits score its target tokens and those
    tokens.
    """

    ids: list[int]
    positions: list[int]
    segment: list[int]
    visible: list[int]
    scored: list[tuple[int, list[int], list[int]]]  # (pair, packed indices, target ids)

    def reach(self, window: int) -> int:
        """How far back (in packed tokens) a sliding-window layer's query reaches: the largest distance from a
        token to the earliest key it may see under `window` positions."""
        at = [q for q, seg in enumerate(self.segment) if seg == 0]  # context position -> packed index
        start = 0  # first index of the current row
        longest = 0
        for q, (seg, pos, vis) in enumerate(zip(self.segment, self.positions, self.visible, strict=True)):
            if seg > 0 and (q == 0 or self.segment[q - 1] != seg):
                start = q
            first = max(0, pos - window + 1)  # the earliest position it sees
            earliest = at[first] if first < vis else start + first - vis  # a row token at offset j has position vis + j
            longest = max(longest, q - earliest)
        return longest


def pack(encoded: Sequence[Encoded], group: PrefixGroup) -> Packed:
    """A group as one packed sequence (see `Packed`)."""
    after: dict[int, list[tuple[int, int]]] = {}  # visible context length -> its rows (row number, pair)
    for r, (i, v) in enumerate(group.rows, start=1):
        if encoded[i].target_ids:
            after.setdefault(v, []).append((r, i))
    ids: list[int] = []
    positions: list[int] = []
    segment: list[int] = []
    visible: list[int] = []
    scored = []

    def rows(v: int) -> None:
        for r, i in after.get(v, ()):
            e = encoded[i]
            seq = (e.source_ids + e.target_ids)[v:-1]  # the last target token predicts nothing
            start = len(ids)
            ids.extend(seq)
            positions.extend(range(v, v + len(seq)))
            segment.extend([r] * len(seq))
            visible.extend([v] * len(seq))
            first = start + len(seq) - len(e.target_ids)  # the logit there scores the first target token
            scored.append((i, list(range(first, first + len(e.target_ids))), list(e.target_ids)))

    rows(0)
    for t, token in enumerate(group.context):
        ids.append(token)
        positions.append(t)
        segment.append(0)
        visible.append(t + 1)
        rows(t + 1)
    return Packed(ids, positions, segment, visible, scored)


def packed_masks(segment: torch.Tensor, visible: torch.Tensor, positions: torch.Tensor, window: int | None,
                 start: int = 0, stop: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(batch, 1, stop - start, stop) boolean masks of queries start..stop-1 over keys 0..stop-1, True where
    query q may attend key k, for full and for sliding layers (None without a window).

    A context token sees the context up to itself; a row token sees the context tokens at positions below its
    `visible` and its own row up to itself; padding (segment -1) sees only itself, so no softmax row is empty. A
    sliding layer also needs position(q) - position(k) < window: the distance the pair scored alone would have,
    not the distance in the packed sequence (which counts the other rows in between).
    """
    stop = segment.shape[1] if stop is None else stop
    queries = torch.arange(start, stop, device=segment.device)[None, :, None]
    keys = torch.arange(stop, device=segment.device)[None, None, :]
    q_seg, k_seg = segment[:, start:stop, None], segment[:, None, :stop]
    k_pos = positions[:, None, :stop]
    in_context = (q_seg >= 0) & (k_seg == 0) & (k_pos < visible[:, start:stop, None])
    own_row = (q_seg == k_seg) & (q_seg > 0) & (keys <= queries)
    pad_self = (q_seg < 0) & (keys == queries)
    full = in_context | own_row | pad_self
    if window is None:
        return full[:, None], None
    near = (positions[:, start:stop, None] - k_pos) < window
    return full[:, None], (full & (near | pad_self))[:, None]


def packed_cache(model: Any, window: int | None, kept: int) -> Any:
    """A key/value cache for blocks of a packed pass: full layers keep every token; with a window, sliding layers
    keep the last `kept` tokens (the farthest any query reaches back, `Packed.reach`), so their attention costs a
    block x (kept + block) instead of a block x all that came before."""
    from transformers import DynamicCache

    cache = DynamicCache()  # no config: lazily a full layer per model layer
    types = getattr(model.config, "layer_types", None)
    if window is not None:
        from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

        types = types or ["sliding_attention"] * model.config.num_hidden_layers
        # DynamicSlidingWindowLayer keeps sliding_window - 1 tokens and returns them before the new ones
        cache.layers = [DynamicSlidingWindowLayer(sliding_window=kept + 1) if t == "sliding_attention" else DynamicLayer()
                        for t in types]
    return cache


def _attention_mask(model: Any, full: torch.Tensor, sliding: torch.Tensor | None) -> Any:
    """The masks in the form the model takes: boolean for sdpa/flex, additive for eager; a mapping by layer type
    where the model mixes full and sliding layers (Gemma 2/3, Qwen2 with both), the sliding one where every layer
    slides (Mistral)."""
    config = model.config
    if getattr(config, "_attn_implementation", "sdpa") == "eager":
        dtype = next(model.parameters()).dtype

        def convert(m: torch.Tensor) -> torch.Tensor:
            return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, torch.finfo(dtype).min)
    else:
        def convert(m: torch.Tensor) -> torch.Tensor:
            return m
    if sliding is None:
        return convert(full)
    types = set(getattr(config, "layer_types", None) or ["sliding_attention"])
    if types == {"sliding_attention"}:
        return convert(sliding)
    return {"full_attention": convert(full), "sliding_attention": convert(sliding)}


@torch.inference_mode()
def packed_logprobs(
    model: Any, encoded: Sequence[Encoded], groups: Sequence[PrefixGroup], pad: int, batch_size: int,
    device: str = "cpu", sort: bool = True, stats: Stats | None = None, max_tokens: int | None = None,
) -> dict[int, float]:  # fmt: skip
    """Summed target log-probs of every grouped pair from one pass per group: the context and all its rows in
    one packed sequence (`pack`) whose attention mask lets each row see its shared prefix and itself only.

    Every position runs once, so a chain's n+1 L(k) passes cost its tokens plus n short rows, not n prefixes; the
    mask uses each token's own position, so sliding-window layers see exactly what the pair scored alone sees,
    however long the chain. Long packed sequences run in blocks of queries (at most 512) over a key/value cache
    (`packed_cache`): full layers keep every position, sliding layers only as far back as a query reaches, so
    their attention stays near the window's cost however long the chain.
    """
    sums: dict[int, float] = {i: 0.0 for g in groups for i, _ in g.rows if not encoded[i].target_ids}
    stats = stats if stats is not None else Stats()
    packs = [pack(encoded, g) for g in groups]
    packs = [p for p in packs if p.scored]
    window = sliding_window(model)
    for idx in length_batches([len(p.ids) for p in packs], batch_size, sort, max_tokens):
        batch = [packs[k] for k in idx]
        width = max(len(p.ids) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        positions = torch.zeros((len(batch), width), dtype=torch.long)
        segment = torch.full((len(batch), width), -1, dtype=torch.long)
        visible = torch.zeros((len(batch), width), dtype=torch.long)
        for b, p in enumerate(batch):  # right padding: a pad position sees only itself and nothing sees it
            n = len(p.ids)
            ids[b, :n], positions[b, :n] = torch.tensor(p.ids), torch.tensor(p.positions)
            segment[b, :n], visible[b, :n] = torch.tensor(p.segment), torch.tensor(p.visible)
        stats.add(segment >= 0)
        # position -> (pair, target token) per batch row: the logits kept are the union over the batch's rows
        wanted = [{q: (i, t) for i, qs, target in p.scored for q, t in zip(qs, target, strict=True)} for p in batch]
        # Queries a block: small enough that a sliding layer's keys (kept + block) stay near its window.
        block = max(1, min(512, (max_tokens or 2048) // len(batch)))
        cache = None
        kept = 0
        if width > block:
            kept = max(1, max(p.reach(window) for p in batch)) if window is not None else 0
            cache = packed_cache(model, window, kept)
        for start in range(0, width, block):
            stop = min(width, start + block)
            need = sorted({q for w in wanted for q in w if start <= q < stop})
            full, sliding = packed_masks(segment, visible, positions, window, start, stop)
            if sliding is not None and cache is not None:  # the keys a sliding layer's cache hands back
                sliding = sliding[..., max(0, start - kept):]
            kwargs = {
                "input_ids": ids[:, start:stop].to(device),
                "position_ids": positions[:, start:stop].to(device),
                "attention_mask": _attention_mask(
                    model, full.to(device), None if sliding is None else sliding.to(device)
                ),
                "use_cache": cache is not None,
            }
            if cache is not None:
                kwargs["cache"] = cache
            if not need:  # a block of context only: it fills the cache, one logit column is the least to keep
                causal_forward(model, kwargs, 1)
                continue
            labels = torch.zeros((len(batch), len(need)), dtype=torch.long)
            label_mask = torch.zeros((len(batch), len(need)), dtype=torch.bool)
            for b, w in enumerate(wanted):
                for c, q in enumerate(need):
                    if q in w:
                        labels[b, c], label_mask[b, c] = w[q][1], True
            keep = torch.tensor([q - start for q in need], device=device)
            logits = causal_forward(model, kwargs, keep).logits
            logp = token_logprobs(logits, labels.to(device), label_mask.to(device)).double().cpu()
            for b, w in enumerate(wanted):
                for c, q in enumerate(need):
                    if q in w:
                        i = w[q][0]
                        sums[i] = sums.get(i, 0.0) + float(logp[b, c])
    return sums


def select_cache(cache: Any, index: torch.Tensor, config: Any) -> Any:
    """A new cache holding rows `index` of `cache` (rows may repeat); the original stays untouched."""
    from transformers import DynamicCache

    data = [(layer.keys.index_select(0, index), layer.values.index_select(0, index)) for layer in cache.layers]
    return DynamicCache(ddp_cache_data=data, config=config)


def sliding_window(model: Any) -> int | None:
    """The attention window of a model with sliding-window layers (Gemma 3: 5 of every 6 layers, 512 positions;
    Mistral-style models with use_sliding_window); None when every layer attends to the whole sequence."""
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None
    return window


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
