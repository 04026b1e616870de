"""Bounded NLI premises for long chains: which context sentences and earlier conclusions a step is checked against.

The official inter-step check pairs step i's conclusion with every context sentence and every earlier conclusion
(n^2 / 2 pairs per chain), and the official intra premise joins every earlier conclusion (a text that grows with
the chain until the tokenizer cuts it from its end, so the most recent conclusions go first). `relevant` keeps,
per step, what a sentence encoder finds closest to its conclusion, plus (inter) the last few conclusions:

- inter: the union of the last `recent` earlier conclusions and the `top_k` candidates (context sentences and
  earlier conclusions) most similar to the step's conclusion, in the official order (context sentences by
  index, then earlier conclusions by step); at most top_k + recent pairs per step, whatever the chain's length.
- intra: the `top_j` earlier conclusions most similar to the step's conclusion, in chain order (the caller keeps
  the step's own premise RCUs always, in front, as the official premise does).

A step with no more candidates than top_k (intra: earlier conclusions than top_j) keeps all of them, so its
pairs are the official ones; a chain where every step is such a step needs no embedding at all
(`inter_needs_embeddings` / `intra_needs_embeddings`), which the Spark job uses to skip the encoder.

Similarity is the cosine of L2-normalised embeddings; ties go to the earliest candidate in the official order.
Blank texts (None or whitespace) are never candidates, as in the official pairs. Plain numpy, no Spark: the
Spark job (jobs.receval.nli_scores) runs it inside a grouped applyInPandas, one chain per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

# A sentence encoder: texts -> (n, d) embeddings; a factory builds one inside the worker (loads the model once).
EmbedFn = Callable[[list[str]], np.ndarray]
EmbedFactory = Callable[[], EmbedFn]


def once(embed: EmbedFactory) -> EmbedFactory:
    """`embed` called at most once (a task's first chain that needs the encoder), its encoder reused after; a task
    whose chains need none never builds it. The weights load once per worker anyway (udfs.runtime's cache)."""
    built: list[EmbedFn] = []

    def factory() -> EmbedFn:
        if not built:
            built.append(embed())
        return built[0]

    return factory


def blank(text: str | None) -> bool:
    return text is None or not str(text).strip()


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; a zero row (a blank text) stays zero, so it is similar to nothing."""
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


def embed_texts(embed: EmbedFn, texts: Sequence[str | None]) -> np.ndarray:
    """Embeddings of `texts` from one call of `embed` on the non-blank ones; blank texts get a zero row."""
    keep = [i for i, t in enumerate(texts) if not blank(t)]
    if not keep:
        return np.zeros((len(texts), 1))
    got = np.asarray(embed([str(texts[i]) for i in keep]), dtype=np.float64)
    if got.ndim != 2 or got.shape[0] != len(keep):
        raise ValueError(f"embedder returned shape {got.shape} for {len(keep)} texts")
    out = np.zeros((len(texts), got.shape[1]))
    out[keep] = got
    return out


def _earlier(conclusions: Sequence[str | None], i: int) -> list[int]:
    return [j for j in range(i) if not blank(conclusions[j])]


def inter_counts(context: Sequence[str | None], conclusions: Sequence[str | None]) -> list[int]:
    """Per step: how many inter candidates the official option pairs it with."""
    sentences = sum(not blank(s) for s in context)
    counts, seen = [], 0
    for text in conclusions:
        counts.append(sentences + seen)
        seen += not blank(text)
    return counts


def inter_needs_embeddings(context: Sequence[str | None], conclusions: Sequence[str | None], top_k: int) -> bool:
    """Whether some step has more candidates than top_k (otherwise `relevant` is `all` and needs no encoder)."""
    return any(n > top_k for n in inter_counts(context, conclusions))


def intra_needs_embeddings(conclusions: Sequence[str | None], top_j: int) -> bool:
    """Whether some step has more than top_j non-blank earlier conclusions."""
    return sum(not blank(c) for c in conclusions[:-1]) > top_j


def _unit(embeddings: np.ndarray | None, rows: int) -> np.ndarray | None:
    if embeddings is None:
        return None
    if len(embeddings) != rows:
        raise ValueError(f"{len(embeddings)} embeddings for {rows} texts")
    return normalise(embeddings)


def _top(candidates: list[int], unit: np.ndarray, query: int, k: int) -> list[int]:
    """The k candidates (rows of `unit`) most similar to row `query`; ties to the earliest in `candidates`."""
    # Row-wise products summed per row (not a BLAS matvec): identical rows give bit-identical similarities, so a
    # tie is a tie and the stable sort keeps the official order.
    sims = (unit[candidates] * unit[query]).sum(axis=1)
    order = np.argsort(-sims, kind="stable")[:k]
    return [candidates[o] for o in order]


def inter_relevant(
    context: Sequence[str | None],
    conclusions: Sequence[str | None],
    embeddings: np.ndarray | None,
    top_k: int,
    recent: int,
) -> list[list[int]]:
    """Per step i: the inter candidates kept, as positions in context + conclusions (context sentence c is c,
    conclusion j is len(context) + j), ascending, which is the official order.

    `embeddings` has one row per context sentence, then one per conclusion; it is read only for steps with
    more than top_k candidates and may be None when `inter_needs_embeddings` is false.
    """
    offset = len(context)
    sentences = [c for c in range(offset) if not blank(context[c])]
    unit = _unit(embeddings, offset + len(conclusions))
    out = []
    for i in range(len(conclusions)):
        earlier = [offset + j for j in _earlier(conclusions, i)]
        candidates = sentences + earlier
        if len(candidates) <= top_k:
            out.append(candidates)
            continue
        if unit is None:
            raise ValueError(f"step {i} has {len(candidates)} inter candidates > top_k={top_k}: embeddings needed")
        kept = set(_top(candidates, unit, offset + i, top_k))
        kept.update(earlier[max(len(earlier) - recent, 0):])
        out.append(sorted(kept))
    return out


def intra_relevant(
    conclusions: Sequence[str | None], embeddings: np.ndarray | None, top_j: int
) -> list[list[int]]:
    """Per step i: the earlier conclusions (indices into `conclusions`) its intra premise keeps, in chain order:
    the top_j most similar to conclusion i. The step's own premise RCUs are not candidates: the caller always
    keeps them, first, as the official premise does.

    `embeddings` has one row per conclusion; it may be None when `intra_needs_embeddings` is false.
    """
    unit = _unit(embeddings, len(conclusions))
    out = []
    for i in range(len(conclusions)):
        earlier = _earlier(conclusions, i)
        if len(earlier) <= top_j:
            out.append(earlier)
            continue
        if unit is None:
            raise ValueError(f"step {i} has {len(earlier)} earlier conclusions > top_j={top_j}: embeddings needed")
        out.append(sorted(_top(earlier, unit, i, top_j)))
    return out


def model_embedder(
    path: str,
    revision: str | None,
    device: str,
    batch_size: int,
    threads: int | None = None,
    trust_remote_code: bool = False,
    cache_size: int | None = None,
    max_length: int = 256,
) -> EmbedFactory:
    """Factory run inside the worker: the sentence encoder (mean-pooled, udfs.roscoe.Embedder) on the task's
    device, loaded once per worker (udfs.runtime's cache), as `embed(texts) -> (n, d)`.

    fp32 whatever runtime.dtype says: bf16 noise would tie or swap near-equal cosines, and the selection would
    then depend on the card; the encoder (22M parameters for MiniLM) costs little next to the NLI model. 256
    tokens: MiniLM's training length (sentence-transformers max_seq_length), past which it was never trained.
    """

    def factory() -> EmbedFn:
        from udfs import roscoe, runtime

        model, tokenizer, _ = runtime.task_model(
            path, "embedding", device, "fp32", revision, threads, trust_remote_code, cache_size
        )
        encoder = roscoe.Embedder(model, tokenizer, batch_size, max_length)

        def embed(texts: list[str]) -> np.ndarray:
            return encoder(texts)[0]

        return embed

    return factory
