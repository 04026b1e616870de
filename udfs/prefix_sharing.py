"""Prefix sharing (causal LMs): pairs whose source token ids share a prefix (the L(k) passes of one chain, every
g' pass) grouped (`share_prefixes`) and each group scored in one packed pass (`packed_logprobs`): the shared
context once, each pair's own rest under a mask that lets it see its shared prefix and itself only, at the
positions it has alone, so the numbers equal separate scoring (udfs.loglik's docstring says how).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from udfs.loglik_batches import Encoded, Stats, causal_forward, token_logprobs
from udfs.runtime import length_batches


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
