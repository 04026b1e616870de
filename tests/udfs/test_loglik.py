"""udfs.loglik: batched target log-likelihoods equal a direct unbatched torch computation."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from bos_tokenizer import with_bos
from pyspark import cloudpickle
from tolerance import loglik_approx

from udfs import loglik, loglik_batches, prefix_sharing

# The fake scorer factories below run in Spark's Python workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SOURCES = [
    " Therefore,",
    " An animal requires warmth for survival. A thick fur coat keeps an animal warm. Therefore,",
    "Generate entailed sentence: the sun is a kind of star & earth orbits the sun ->",
    "x",
    " She sold 48 / 2 = 24 clips in May. So she sold 48 + 24 = 72 clips altogether. The answer is 72. Therefore,",
    "",
]
TARGETS = [" 72", " the animal survives", " earth orbits a star", " yes it does follow", " 72", " hello"]


@pytest.fixture(scope="module")
def gpt2(tiny_models):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_models["tiny-gpt2"]
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def t5(tiny_models):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    path = tiny_models["tiny-t5"]
    return AutoModelForSeq2SeqLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def direct_causal(model, tok, source: str, target: str) -> list[float]:
    """Log-probs of the target tokens, one unpadded sequence, written out step by step."""
    src = tok(source, add_special_tokens=False)["input_ids"] or [tok.eos_token_id]
    tgt = tok(target, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([src + tgt])
    with torch.no_grad():
        logits = model(ids).logits[0]
    logp = torch.log_softmax(logits.double(), -1)
    return [float(logp[len(src) - 1 + j, t]) for j, t in enumerate(tgt)]


def direct_seq2seq(model, tok, source: str, target: str) -> list[float]:
    src = tok(source)["input_ids"]  # with </s>, as the encoder is trained
    tgt = tok(target, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([src]), labels=torch.tensor([tgt])).logits[0]
    logp = torch.log_softmax(logits.double(), -1)
    return [float(logp[j, t]) for j, t in enumerate(tgt)]


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
@pytest.mark.parametrize("batch_size", [1, 16, 4])
@pytest.mark.parametrize("side", ["right", "left"])
def test_score_matches_unbatched_direct(family, batch_size, side, gpt2, t5):
    model, tok = gpt2 if family == "causal" else t5
    direct = direct_causal if family == "causal" else direct_seq2seq
    got = loglik.score(model, tok, family, SOURCES, TARGETS, batch_size=batch_size, max_length=512, padding_side=side)
    assert len(got) == len(SOURCES)
    for s, t, g in zip(SOURCES, TARGETS, got, strict=True):
        want = direct(model, tok, s, t)
        assert g.n_tokens == len(want) > 0
        assert g.sum_logprob == loglik_approx(sum(want))
        assert g.mean_logprob == loglik_approx(sum(want) / len(want))
        assert not g.truncated


def test_causal_prefix_is_what_the_tokenizer_puts_before_a_text(gpt2):
    _, tok = gpt2
    bos = with_bos(tok)
    assert loglik.causal_prefix(tok) == []  # GPT-2 (and Qwen) add nothing
    assert loglik.causal_prefix(bos) == [tok.bos_token_id]
    plain = tok("a b", add_special_tokens=False)["input_ids"]
    # One BOS: added to a bare text, not to a text that already starts with it (a chat template writes Gemma's).
    assert loglik.causal_ids(bos, ["a b", tok.bos_token + "a b", ""]) == [
        [tok.bos_token_id, *plain], [tok.bos_token_id, *plain], [tok.bos_token_id]]  # fmt: skip
    assert loglik.causal_ids(tok, ["a b", ""]) == [plain, []]


def test_cut_left_keeps_the_prefix_in_front():
    assert loglik.cut_left([9, 1, 2, 3, 4], 3, [9]) == [9, 3, 4]
    assert loglik.cut_left([1, 2, 3, 4], 3, [9]) == [2, 3, 4]  # no prefix at its head: a plain cut
    assert loglik.cut_left([9, 1, 2], 3, [9]) == [9, 1, 2]
    assert loglik.cut_left([9, 1, 2], 1, [9]) == [2]  # no room beside the prefix: the last token alone


@pytest.mark.parametrize("batch_size", [1, 4])
def test_score_with_a_bos_tokenizer_reads_the_bos_first(gpt2, batch_size):
    """A Gemma-like tokenizer: every source is read after its BOS, equal to the direct computation on
    [BOS] + source + target, and different from scoring without it."""
    model, tok = gpt2
    bos = with_bos(tok)
    got = loglik.score(model, bos, "causal", SOURCES, TARGETS, batch_size=batch_size, max_length=512)
    without = loglik.score(model, tok, "causal", SOURCES, TARGETS, batch_size=batch_size, max_length=512)
    for s, t, g, w in zip(SOURCES, TARGETS, got, without, strict=True):
        want = direct_causal(model, tok, tok.bos_token + s, t)
        assert g.sum_logprob == loglik_approx(sum(want))
        assert g.n_tokens == w.n_tokens
    assert sum(g.sum_logprob != loglik_approx(w.sum_logprob) for g, w in zip(got[:-1], without[:-1], strict=True)) >= 4
    # A source cut from the left keeps its BOS: [BOS] + the last (room - 1) source tokens.
    long_source = " the sun is a kind of star" * 40 + " Therefore,"
    cut = loglik.score(model, bos, "causal", [long_source], [" 72"], max_length=24)[0]
    tgt = tok(" 72", add_special_tokens=False)["input_ids"]
    kept = tok.decode(tok(long_source, add_special_tokens=False)["input_ids"][-(24 - len(tgt) - 1) :])
    assert cut.truncated
    assert cut.sum_logprob == loglik_approx(sum(direct_causal(model, tok, tok.bos_token + kept, " 72")))


def test_score_excludes_eos_from_target(t5):
    model, tok = t5
    got = loglik.score(model, tok, "seq2seq", ["a b"], [" c d"])[0]
    assert got.n_tokens == len(tok(" c d", add_special_tokens=False)["input_ids"])
    assert tok.eos_token_id not in tok(" c d", add_special_tokens=False)["input_ids"]


def test_score_truncates_source_from_left_and_counts(gpt2):
    model, tok = gpt2
    long_source = " the sun is a kind of star" * 40 + " Therefore,"
    tgt = tok(" 72", add_special_tokens=False)["input_ids"]
    max_length = 24
    scorer = loglik.Scorer(model, tok, "causal", batch_size=4, max_length=max_length)
    got = scorer([long_source, " Therefore,"], [" 72", " 72"])
    assert [g.truncated for g in got] == [True, False]
    assert scorer.truncated == 1 and scorer.calls == 1 and scorer.pairs == 2
    # Same as scoring the last (max_length - target) source tokens directly.
    src = tok(long_source, add_special_tokens=False)["input_ids"][-(max_length - len(tgt)) :]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([src + tgt])).logits[0].double(), -1)
    want = sum(float(logp[len(src) - 1 + j, t]) for j, t in enumerate(tgt))
    assert got[0].sum_logprob == loglik_approx(want)


def test_position_limit_comes_from_the_model_not_a_fixed_512(gpt2, t5):
    from types import SimpleNamespace as NS

    model, tok = gpt2
    assert loglik.position_limit(model, tok) == model.config.n_positions == 1024
    assert loglik.position_limit(NS(config=NS(max_position_embeddings=4096)), NS(model_max_length=512)) == 4096
    # T5: relative positions, no config limit: the tokenizer's trained length (t5-large: 512); unknown: none
    assert loglik.position_limit(NS(config=NS()), NS(model_max_length=512)) == 512
    assert loglik.position_limit(t5[0], t5[1]) is None  # the tiny tokenizer reports transformers' "no limit" 1e30
    assert loglik.effective_limit(None, model, tok) == 1024
    assert loglik.effective_limit(64, model, tok) == 64 and loglik.effective_limit(4096, model, tok) == 1024
    assert loglik.effective_limit(None, *t5) is None


def test_score_default_scores_past_512_whole_up_to_the_models_positions(gpt2, t5):
    model, tok = gpt2
    source = " the sun is a kind of star" * 80 + " Therefore,"  # 641 source tokens: past 512, within 1,024
    n = len(tok(source, add_special_tokens=False)["input_ids"])
    assert 512 < n < 1000
    got = loglik.score(model, tok, "causal", [source, source * 2], [" 72", " 72"])
    assert [g.truncated for g in got] == [False, True]  # the second needs 1,283 positions of 1,024
    assert got[0].sum_logprob == loglik_approx(sum(direct_causal(model, tok, source, " 72")))
    m5, t5_tok = t5
    got = loglik.score(m5, t5_tok, "seq2seq", [source], [" 72"])[0]
    assert not got.truncated and got.sum_logprob == loglik_approx(sum(direct_seq2seq(m5, t5_tok, source, " 72")))


def test_score_empty_target_has_no_tokens(gpt2):
    model, tok = gpt2
    got = loglik.score(model, tok, "causal", [" a", " b c"], ["", " d"])
    assert got[0].n_tokens == 0 and got[0].sum_logprob == 0.0 and math.isnan(got[0].mean_logprob)
    assert got[1].n_tokens > 0


# One chain's information-gain passes L(0..n) and its g' passes (constant source), plus pairs that share nothing.
# The second step ends in a space, so " ".join puts two spaces at that boundary (whitespace runs are where
# byte-level BPE pre-tokenisation is least obvious); grouping works on each pair's own token ids regardless.
CHAIN_STEPS = ["The sun is a star.", "A star gives off light ", "So the sun gives off light.", "Plants need it."]


def _chain_pairs() -> tuple[list[str], list[str]]:
    from udfs import pvi_prompts as P
    reqs = P.chain_requests(CHAIN_STEPS, [[]] * 4, ["a b", "c", "d e f", "g"], "the sun shines")
    pairs = [(r.source, r.target) for r in reqs if r.kind != P.G]
    pairs = list(dict.fromkeys(pairs))  # L(k) of step i+1 = L(k) of step i: scored once, as the job does
    pairs += [("x", " y"), ("", " z"), (" The sun is a star. Therefore,", "")]  # lone, empty source, empty target
    return [s for s, _ in pairs], [t for _, t in pairs]


@pytest.mark.parametrize("batch_size", [1, 4, 16])
@pytest.mark.parametrize("max_length", [512, 20])
def test_shared_prefix_scores_equal_separate_scoring(gpt2, batch_size, max_length):
    model, tok = gpt2
    sources, targets = _chain_pairs()
    alone = loglik.score(model, tok, "causal", sources, targets, batch_size, max_length, padding_side="left")
    shared = loglik.score(model, tok, "causal", sources, targets, batch_size, max_length, share_prefix=True)
    assert [(s.n_tokens, s.truncated) for s in shared] == [(s.n_tokens, s.truncated) for s in alone]
    assert any(s.truncated for s in alone) == (max_length == 20)  # the short limit cuts sources from the left
    for got, want in zip(shared, alone, strict=True):
        assert got.sum_logprob == loglik_approx(want.sum_logprob)
    if max_length == 512:  # and both equal the direct unbatched computation
        for s, t, got in zip(sources, targets, shared, strict=True):
            assert got.sum_logprob == loglik_approx(sum(direct_causal(model, tok, s, t)))


def test_share_prefixes_groups_a_chains_passes_on_their_own_token_ids(gpt2):
    _, tok = gpt2
    sources, targets = _chain_pairs()
    encoded = loglik.encode_pairs(tok, "causal", sources, targets, 512)
    groups, alone = prefix_sharing.share_prefixes(encoded)
    ig = [i for i, s in enumerate(sources) if s.endswith("Therefore,") and s != " Therefore,"]
    null = [i for i, s in enumerate(sources) if s.endswith("None ->")]
    assert sorted(sorted(i for i, _ in g.rows) for g in groups) == sorted([sorted(ig), null])
    assert sorted(alone) == sorted(set(range(len(sources))) - set(ig) - set(null))  # L(0), "x", ""
    for g in groups:
        for i, visible in g.rows:
            ids = tok(sources[i], add_special_tokens=False)["input_ids"]
            # The cached part is the pair's own tokenisation: context[:visible] + its own rest == its source.
            assert g.context[:visible] + ids[visible:] == ids
            assert 1 <= visible < len(ids)
            assert visible == prefix_sharing.common_prefix(ids, max((tok(sources[j], add_special_tokens=False)["input_ids"]
                                                            for j, _ in g.rows), key=len)) - 1


def _sliding(tok, window: int):
    """A random Gemma 3 (the small profile's information-gain architecture: sliding-window layers) over `tok`."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=window,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=1024,
        pad_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config).eval()


def _window_pairs() -> tuple[list[str], list[str]]:
    """The chain's passes plus g'-style passes with long targets: one group with a long context and short rows,
    one with a short context and long rows, so a batch can mix a long context with a long row."""
    sources, targets = _chain_pairs()
    long = [" the sun is a kind of star that gives off light and heat to the earth" + " and so on" * k for k in (2, 3, 4)]
    return sources + ["Generate entailed sentence: None ->"] * 3, targets + long


@pytest.mark.parametrize("window", [8, 60, 80, 4096])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_shared_prefix_with_a_sliding_window_equals_separate_scoring(gpt2, window, batch_size):
    """Every group is packed into one pass whatever the window (the mask counts each token's own position), and
    every score equals separate scoring; before packing, groups over the window had to be scored on their own
    (shared regardless, these passes scored up to 1% apart)."""
    _, tok = gpt2
    model = _sliding(tok, window)
    assert prefix_sharing.sliding_window(model) == window
    sources, targets = _window_pairs()
    alone, shared = loglik_batches.Stats(), loglik_batches.Stats()
    want = loglik.score(model, tok, "causal", sources, targets, batch_size, padding_side="left", stats=alone)
    got = loglik.score(model, tok, "causal", sources, targets, batch_size, share_prefix=True, stats=shared)
    for g, w in zip(got, want, strict=True):
        assert g.sum_logprob == loglik_approx(w.sum_logprob)
    encoded = loglik.encode_pairs(tok, "causal", sources, targets, loglik.effective_limit(None, model, tok))
    groups, single = prefix_sharing.share_prefixes(encoded)
    assert len(groups) == 2
    # Hand count: each context once, each row its source after the visible part plus its target but the last.
    packed = sum(len(g.context) + sum(encoded[i].length - v - 1 for i, v in g.rows if encoded[i].target_ids)
                 for g in groups)
    assert shared.positions == packed + sum(encoded[i].length for i in single) < alone.positions


def _long_chain(n: int) -> tuple[list[str], list[str]]:
    """One chain's L(0..n) passes (pvi_prompts), steps of varied words so BPE merges differ across boundaries."""
    from udfs import pvi_prompts as P

    words = ["sun", "star", "light", "plants", "grow", "energy", "heat", "earth", "water", "so", "because"]
    steps = [" ".join(words[(3 * k + j) % len(words)] for j in range(3 + k % 4)) + "." for k in range(n)]
    reqs = P.chain_requests(steps, [[]] * n, [f"c{k}" for k in range(n)], "the sun shines")
    pairs = list(dict.fromkeys((r.source, r.target) for r in reqs if r.kind in (P.IG_PREV, P.IG_CUR)))
    return [s for s, _ in pairs], [t for _, t in pairs]


@pytest.mark.parametrize("max_tokens", [None, 64])
def test_one_pass_information_gain_equals_the_unbatched_reference_past_the_window(gpt2, max_tokens):
    """A chain far longer than the sliding window (40 steps, ~230 tokens, window 16): its n+1 L(k) passes come from
    one packed pass (in blocks of 64 query positions over a cache that keeps every position, when max_tokens=64),
    and each equals the pair scored alone and unbatched within 1e-6 relative (the issue asks 1e-5)."""
    _, tok = gpt2
    model = _sliding(tok, 16)
    sources, targets = _long_chain(40)
    stats = loglik_batches.Stats()
    got = loglik.score(model, tok, "causal", sources, targets, 8, share_prefix=True, stats=stats, max_tokens=max_tokens)
    encoded = loglik.encode_pairs(tok, "causal", sources, targets, None)
    assert max(e.length for e in encoded) > 10 * 16
    groups, single = prefix_sharing.share_prefixes(encoded)
    assert len(groups) == 1 and len(groups[0].rows) == len(sources) - 1 and stats.forwards == 1 + bool(single)
    # linear: the chain's tokens once plus n short rows, against the n+1 prefixes of separate passes
    assert stats.positions < sum(e.length for e in encoded) / 10
    for s, t, g in zip(sources, targets, got, strict=True):
        assert g.sum_logprob == loglik_approx(sum(direct_causal(model, tok, s, t)))


def test_a_chain_past_the_models_limit_is_cut_from_the_left_and_flagged(gpt2):
    """One rule past the LM's own context (here a 96-position limit): the L(k) passes that fit are packed and
    exact; each longer one is scored alone with its source cut from the left (the tokenizer's prefix kept) and
    flagged, and equals the unbatched reference on that cut source."""
    _, tok = gpt2
    model = _sliding(tok, 16)
    sources, targets = _long_chain(40)
    limit = 96
    got = loglik.score(model, tok, "causal", sources, targets, 8, max_length=limit, share_prefix=True)
    encoded = loglik.encode_pairs(tok, "causal", sources, targets, limit)
    full = [len(tok(s, add_special_tokens=False)["input_ids"]) + len(tok(t, add_special_tokens=False)["input_ids"])
            for s, t in zip(sources, targets, strict=True)]
    assert [g.truncated for g in got] == [n > limit for n in full] and 0 < sum(n > limit for n in full) < len(full)
    for e, s, t, g in zip(encoded, sources, targets, got, strict=True):
        assert len(e.source_ids) + len(e.target_ids) <= limit
        want = sum(_direct_ids(model, e)) if e.truncated else sum(direct_causal(model, tok, s, t))
        assert g.sum_logprob == loglik_approx(want)


def _direct_ids(model, e) -> list[float]:
    """The unbatched reference on token ids as encoded (a cut source need not decode to the same ids)."""
    ids = torch.tensor([e.source_ids + e.target_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), -1)
    return [float(logp[len(e.source_ids) - 1 + j, t]) for j, t in enumerate(e.target_ids)]


def test_packed_masks_hand_values():
    """A context of 3 and two rows: row 1 sees 2 context tokens, row 2 sees 1; one pad; window 2 on positions."""
    segment = torch.tensor([[0, 0, 0, 1, 1, 2, -1]])
    visible = torch.tensor([[1, 2, 3, 2, 2, 1, 0]])
    positions = torch.tensor([[0, 1, 2, 2, 3, 1, 0]])
    full, sliding = prefix_sharing.packed_masks(segment, visible, positions, window=2)
    want = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],  # row 1 at position 2: context 0..1 and itself
        [1, 1, 0, 1, 1, 0, 0],
        [1, 0, 0, 0, 0, 1, 0],  # row 2 at position 1: context 0 and itself
        [0, 0, 0, 0, 0, 0, 1],  # padding: itself only
    ], dtype=torch.bool)  # fmt: skip
    assert torch.equal(full[0, 0], want)
    # window 2: a query sees keys whose position is at most 1 before its own
    near = torch.tensor([[1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0], [0, 1, 0, 1, 0, 0, 0],
                         [0, 0, 0, 1, 1, 0, 0], [1, 0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(sliding[0, 0], near)
    block, _ = prefix_sharing.packed_masks(segment, visible, positions, None, 3, 5)  # queries 3..4 over keys 0..4
    assert torch.equal(block[0, 0], want[3:5, :5])


def test_pack_puts_each_row_after_its_shared_prefix_and_reach_counts_the_rows_between():
    """Context [10 11 12 13]; pair 0 shares 3 tokens (its row runs 20 and its first target token 30), pair 1
    shares 4 (its row runs 21). Each row sits right after the context token where its prefix ends; a sliding
    layer of window 2 then reaches back at most 3 packed tokens (context position 3 to position 2, across
    pair 0's row)."""
    encoded = [loglik_batches.Encoded([10, 11, 12, 20], [30, 31], False), loglik_batches.Encoded([10, 11, 12, 13, 21], [32], False)]
    p = prefix_sharing.pack(encoded, prefix_sharing.PrefixGroup([10, 11, 12, 13], [(0, 3), (1, 4)]))
    assert p.ids == [10, 11, 12, 20, 30, 13, 21]
    assert p.positions == [0, 1, 2, 3, 4, 3, 4]
    assert p.segment == [0, 0, 0, 1, 1, 0, 2]
    assert p.visible == [1, 2, 3, 3, 3, 4, 4]
    assert p.scored == [(0, [3, 4], [30, 31]), (1, [6], [32])]
    assert p.reach(2) == 3 and p.reach(1) == 0 and p.reach(100) == 6  # window 100: row 2 (index 6) reaches context 0


def test_packed_pass_with_eager_attention_equals_sdpa(gpt2):
    """The additive mask eager attention takes gives the same scores as the boolean one sdpa takes."""
    _, tok = gpt2
    model = _sliding(tok, 16)
    sources, targets = _long_chain(12)
    sdpa = loglik.score(model, tok, "causal", sources, targets, 4, share_prefix=True)
    model.config._attn_implementation = "eager"
    eager = loglik.score(model, tok, "causal", sources, targets, 4, share_prefix=True)
    assert [e.sum_logprob for e in eager] == loglik_approx([s.sum_logprob for s in sdpa])


def test_sliding_window_reads_the_config():
    def model(**config):
        return type("M", (), {"config": type("C", (), config)()})()

    assert prefix_sharing.sliding_window(model(sliding_window=512, layer_types=["sliding_attention", "full_attention"])) == 512
    assert prefix_sharing.sliding_window(model(sliding_window=512, layer_types=["full_attention"])) is None
    assert prefix_sharing.sliding_window(model(sliding_window=None, use_sliding_window=False)) is None  # Qwen2.5
    assert prefix_sharing.sliding_window(model(sliding_window=4096, use_sliding_window=False)) is None
    assert prefix_sharing.sliding_window(model(sliding_window=4096)) == 4096  # Mistral: every layer slides
    assert prefix_sharing.sliding_window(model(n_positions=1024)) is None  # GPT-2


def test_shared_prefix_runs_fewer_token_positions(gpt2):
    model, tok = gpt2
    sources, targets = _chain_pairs()
    alone, shared = loglik_batches.Stats(), loglik_batches.Stats()
    loglik.score(model, tok, "causal", sources, targets, batch_size=64, stats=alone)
    loglik.score(model, tok, "causal", sources, targets, batch_size=64, share_prefix=True, stats=shared)
    encoded = loglik.encode_pairs(tok, "causal", sources, targets, 512)
    groups, single = prefix_sharing.share_prefixes(encoded)
    # Hand count: each context once, each row its source after the visible part plus its target but the last.
    want = sum(len(g.context) for g in groups)
    want += sum(encoded[i].length - v - 1 for g in groups for i, v in g.rows if encoded[i].target_ids)
    want += sum(encoded[i].length for i in single)
    assert alone.positions == sum(e.length for e in encoded)
    assert shared.positions == want < alone.positions
    assert (alone.forwards, shared.forwards) == (1, 2)  # one batch; one packed pass + the lone pairs


def test_token_logprobs_hand_values():
    # logits [0, ln 3] -> p = [1/4, 3/4]; mask drops the second position whatever its label.
    logits = torch.tensor([[[0.0, math.log(3.0)], [5.0, 1.0]]])
    labels = torch.tensor([[1, -100]])
    mask = torch.tensor([[True, False]])
    got = loglik_batches.token_logprobs(logits, labels, mask)
    assert got[0, 0].item() == loglik_approx(math.log(0.75), math.log(3), math.log(4))  # float32 ln 3 - ln 4
    assert got[0, 1].item() == 0.0


def test_length_batches_sorts_and_covers_every_index():
    batches = loglik.length_batches([3, 9, 1, 7, 5], 2)
    assert batches == [[1, 3], [4, 0], [2]]


def test_length_batches_token_budget_caps_rows_times_longest():
    # longest first: 9 alone (2 x 9 > 16); 7 and 5 (2 x 7 = 14); 3 would make 3 x 7 = 21, so 3 and 1 (2 x 3)
    assert loglik.length_batches([3, 9, 1, 7, 5], 8, max_tokens=16) == [[1], [3, 4], [0, 2]]
    assert loglik.length_batches([9, 1, 1, 1, 1], 8, max_tokens=16) == [[0], [1, 2, 3, 4]]
    assert loglik.length_batches([9, 1, 1, 1, 1], 3, max_tokens=16) == [[0], [1, 2, 3], [4]]
    # unsorted: the running longest row counts; a row longer than the budget still gets its own batch
    assert loglik.length_batches([3, 20, 1, 2], 8, sort=False, max_tokens=8) == [[0], [1], [2, 3]]


@pytest.mark.parametrize("max_tokens", [None, 40, 200])
def test_score_same_under_any_token_budget(gpt2, max_tokens):
    model, tok = gpt2
    sources, targets = _chain_pairs()
    want = loglik.score(model, tok, "causal", sources, targets, batch_size=1)
    for share in (False, True):
        got = loglik.score(model, tok, "causal", sources, targets, 16, share_prefix=share, max_tokens=max_tokens)
        assert [g.sum_logprob for g in got] == loglik_approx([w.sum_logprob for w in want])


def _fake_factory():
    def fn(sources, targets):
        if any("boom" in s for s in sources):
            raise ValueError("boom")
        return [loglik.TargetScore(-float(len(s)), len(t), -float(len(s)) / max(len(t), 1)) for s, t in zip(sources, targets, strict=True)]

    return fn


def test_loglik_udf_quarantine_mode_isolates_failing_rows(spark):
    df = spark.createDataFrame([("ab", "xyz"), ("boom", "q"), ("abcd", "zz")], "source string, target string")
    udf = loglik.loglik_udf(_fake_factory, on_error="quarantine")
    rows = df.select("source", udf("source", "target").alias("r")).orderBy("source").collect()
    got = {r.source: r.r for r in rows}
    assert (got["ab"].sum_logprob, got["ab"].n_tokens, got["ab"].error) == (-2.0, 3, None)
    assert (got["abcd"].mean_logprob, got["abcd"].n_tokens) == (-2.0, 2)
    assert got["boom"].sum_logprob is None and "ValueError: boom" in got["boom"].error


def test_loglik_udf_fail_mode_raises(spark):
    df = spark.createDataFrame([("boom", "q")], "source string, target string")
    udf = loglik.loglik_udf(_fake_factory, on_error="fail")
    with pytest.raises(Exception, match="boom"):
        df.select(udf("source", "target")).collect()


def test_loglik_udf_real_model_matches_score(spark, tiny_models, gpt2):
    model, tok = gpt2
    factory = loglik.model_scorer_factory(str(tiny_models["tiny-gpt2"]), "causal", device="cpu", batch_size=3)
    df = spark.createDataFrame(list(zip(SOURCES, TARGETS, strict=True)), "source string, target string").repartition(2)
    rows = df.select("source", "target", loglik.loglik_udf(factory)("source", "target").alias("r")).collect()
    want = {(s, t): g for s, t, g in zip(SOURCES, TARGETS, loglik.score(model, tok, "causal", SOURCES, TARGETS), strict=True)}
    assert len(rows) == len(SOURCES)
    for r in rows:
        assert r.r.sum_logprob == loglik_approx(want[(r.source, r.target)].sum_logprob)
        assert r.r.n_tokens == want[(r.source, r.target)].n_tokens
