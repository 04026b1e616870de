"""udfs.generate: batched generation (left padding), min_new_tokens, stop strings, seeded sampling, UDF plumbing."""

from __future__ import annotations

import sys

import pytest
import torch
from bos_tokenizer import with_bos
from pyspark import cloudpickle

from udfs import generate as G

cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROMPTS = [
    "Natalia sold clips to 48 of her friends in April.\n\nLet's think step by step.\n",
    "x",
    "The sun is a kind of star. Earth orbits",
]
NAMES = {"causal": "tiny-gpt2", "seq2seq": "tiny-t5"}


def _load(tiny_models, family: str):
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    cls = AutoModelForCausalLM if family == "causal" else AutoModelForSeq2SeqLM
    path = tiny_models[NAMES[family]]
    return cls.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _forced_head(model, tok, first: int, second: int | None = None):
    """Replace the LM head: logits prefer `first` by far, then `second`, the rest are impossible-ish."""
    weight = model.get_output_embeddings().weight
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-20.0)
        head.bias[first] = 10.0
        if second is not None:
            head.bias[second] = 5.0
    model.set_output_embeddings(head)
    return model


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_generate_min_new_tokens_enforced_when_model_emits_eos_first(tiny_models, family):
    model, tok = _load(tiny_models, family)
    letter = tok("a", add_special_tokens=False)["input_ids"][0]
    _forced_head(model, tok, tok.eos_token_id, letter)
    free = G.generate(model, tok, family, PROMPTS, max_new_tokens=20, min_new_tokens=0)
    assert [g.n_tokens for g in free] == [0, 0, 0]  # the model ends at once
    held = G.generate(model, tok, family, PROMPTS, max_new_tokens=20, min_new_tokens=8)
    # EOS is kept away for 8 tokens, then it wins again: exactly 8 tokens of the runner-up.
    assert [g.n_tokens for g in held] == [8, 8, 8]
    assert [g.text for g in held] == [tok.decode([letter] * 8)] * 3


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_generate_stop_string_never_before_min_new_tokens(tiny_models, family):
    model, tok = _load(tiny_models, family)
    letter = tok("a", add_special_tokens=False)["input_ids"][0]
    _forced_head(model, tok, letter)  # "aaaa..." for ever
    text = tok.decode([letter])
    early = G.generate(model, tok, family, PROMPTS[:2], max_new_tokens=30, stop_strings=[text * 2])
    assert [g.n_tokens for g in early] == [2, 2]
    late = G.generate(model, tok, family, PROMPTS[:2], max_new_tokens=30, min_new_tokens=8, stop_strings=[text * 2])
    assert [g.n_tokens for g in late] == [8, 8]
    none = G.generate(model, tok, family, PROMPTS[:2], max_new_tokens=12, stop_strings=["never"])
    assert [g.n_tokens for g in none] == [12, 12]


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_generate_batched_equals_one_by_one(tiny_models, family):
    model, tok = _load(tiny_models, family)
    batched = G.generate(model, tok, family, PROMPTS, max_new_tokens=10, min_new_tokens=8, batch_size=3)
    single = [G.generate(model, tok, family, [p], max_new_tokens=10, min_new_tokens=8)[0] for p in PROMPTS]
    assert batched == single  # left padding (causal) and masks change nothing
    assert all(g.n_tokens >= 8 for g in batched)


def test_generate_sampling_is_seeded(tiny_models):
    model, tok = _load(tiny_models, "causal")
    kw = dict(max_new_tokens=12, min_new_tokens=8, do_sample=True, top_p=0.8)
    a = G.generate(model, tok, "causal", PROMPTS, seed=1, **kw)
    b = G.generate(model, tok, "causal", PROMPTS, seed=1, **kw)
    c = G.generate(model, tok, "causal", PROMPTS, seed=2, **kw)
    assert a == b
    assert a != c


def test_generate_truncates_long_prompt_from_left(tiny_models):
    model, tok = _load(tiny_models, "causal")
    long_prompt = "Natalia sold clips. " * 200
    out = G.generate(model, tok, "causal", [long_prompt, "x"], max_new_tokens=8, max_length=64)
    assert [g.truncated for g in out] == [True, False]
    # The kept prompt is the last 64 - 8 tokens: same output as giving those tokens directly.
    kept = tok.decode(tok(long_prompt, add_special_tokens=False)["input_ids"][-56:])
    assert out[0].text == G.generate(model, tok, "causal", [kept], max_new_tokens=8, max_length=64)[0].text


def test_generate_with_a_bos_tokenizer_reads_the_bos_first_and_keeps_it_on_a_cut(tiny_models):
    """A Gemma-like tokenizer: the prompt is read after one BOS (none added to a prompt that has it, as a chat
    template writes it), and a prompt cut from the left keeps its BOS in front."""
    model, tok = _load(tiny_models, "causal")
    bos = with_bos(tok)
    kw = dict(max_new_tokens=8, min_new_tokens=8)
    got = G.generate(model, bos, "causal", PROMPTS, **kw)
    assert got == G.generate(model, tok, "causal", [tok.bos_token + p for p in PROMPTS], **kw)
    assert got == G.generate(model, bos, "causal", [tok.bos_token + p for p in PROMPTS], **kw)
    assert got != G.generate(model, tok, "causal", PROMPTS, **kw)
    long_prompt = "Natalia sold clips. " * 200
    cut = G.generate(model, bos, "causal", [long_prompt], max_new_tokens=8, max_length=64)[0]
    kept = tok.decode(tok(long_prompt, add_special_tokens=False)["input_ids"][-55:])
    assert cut.truncated
    assert cut.text == G.generate(model, tok, "causal", [tok.bos_token + kept], max_new_tokens=8, max_length=64)[0].text


def _fake_factory():
    def run(prompts):
        if "boom" in prompts:
            raise RuntimeError("generation failed")
        return [G.Generation(p.upper(), len(p), False) for p in prompts]

    return run


def test_generate_frame_quarantine_retries_row_by_row():
    out = G.generate_frame(_fake_factory(), ["ab", "boom", "c"], "quarantine")
    assert out["text"].tolist()[0] == "AB" and out["text"].tolist()[2] == "C"
    assert out["text"].isna().tolist() == [False, True, False]
    assert out["error"].tolist()[1].startswith("RuntimeError")
    with pytest.raises(RuntimeError):
        G.generate_frame(_fake_factory(), ["boom"], "fail")


def test_generate_udf_runs_in_spark(spark):
    df = spark.createDataFrame([("ab",), ("xyz",)], "prompt string")
    out = df.select(G.generate_udf(_fake_factory)("prompt").alias("g")).select("g.*").orderBy("n_tokens").collect()
    assert [(r.text, r.n_tokens, r.truncated, r.error) for r in out] == [("AB", 2, False, None), ("XYZ", 3, False, None)]


# ---- batches that fill up, per-row seeded sampling (issue 44) ----------------------------------------------
MANY = [f"Question {i}: {'how many apples ' * (i % 5)}are left?\n" for i in range(11)]


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_generate_token_budget_batches_equal_one_by_one(tiny_models, family):
    model, tok = _load(tiny_models, family)
    budgeted = G.generate(model, tok, family, MANY, max_new_tokens=6, batch_size=64, max_tokens=90)
    single = [G.generate(model, tok, family, [p], max_new_tokens=6)[0] for p in MANY]
    assert budgeted == single


def test_generate_sampling_independent_of_batching_and_order(tiny_models):
    model, tok = _load(tiny_models, "causal")
    kw = dict(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=3)
    samples = [i % 3 for i in range(len(MANY))]
    whole = G.generate(model, tok, "causal", MANY, samples=samples, batch_size=64, **kw)
    small = G.generate(model, tok, "causal", MANY, samples=samples, batch_size=2, max_tokens=40, **kw)
    order = list(reversed(range(len(MANY))))
    backwards = G.generate(model, tok, "causal", [MANY[i] for i in order], samples=[samples[i] for i in order],
                           batch_size=4, **kw)[::-1]  # fmt: skip
    assert whole == small == backwards
    # Another sample index of the same prompt draws other text; greedy rows (None) equal plain greedy decoding.
    other = G.generate(model, tok, "causal", MANY, samples=[s + 1 for s in samples], batch_size=64, **kw)
    assert [g.text for g in other] != [g.text for g in whole]
    mixed = G.generate(model, tok, "causal", MANY, samples=[None if i % 2 else 0 for i in range(len(MANY))], **kw)
    greedy = G.generate(model, tok, "causal", MANY, max_new_tokens=10)
    assert [g for i, g in enumerate(mixed) if i % 2] == [g for i, g in enumerate(greedy) if i % 2]


def test_draw_token_hand_derived():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    # top_k=1 and a tiny nucleus both keep only the most likely token.
    assert {G.draw_token(logits, gen, top_k=1) for _ in range(20)} == {0}
    assert {G.draw_token(logits, gen, top_p=0.1) for _ in range(20)} == {0}
    # softmax([2, 1, 0, -1]) = [0.644, 0.237, 0.087, 0.032]: top_p 0.7 keeps tokens 0 and 1 (mass before token 1 is
    # 0.644 < 0.7; before token 2 it is 0.881), renormalised to [0.731, 0.269].
    draws = [G.draw_token(logits, gen, top_p=0.7) for _ in range(4000)]
    assert set(draws) == {0, 1}
    assert abs(draws.count(1) / 4000 - 0.269) < 0.03
    # Temperature 0.5 doubles the logits: P(token 0) = softmax([4, 2, 0, -2])[0] = 0.867.
    draws = [G.draw_token(logits, gen, temperature=0.5) for _ in range(4000)]
    assert abs(draws.count(0) / 4000 - 0.867) < 0.03


def test_draw_token_nucleus_wider_than_window_sorts_everything():
    gen = torch.Generator().manual_seed(1)
    flat = torch.zeros(G.TOP_P_WINDOW * 4)  # uniform: the top-256 window holds 1/4 of the mass
    draws = {G.draw_token(flat, gen, top_p=0.9) for _ in range(3000)}
    assert max(draws) >= G.TOP_P_WINDOW  # tokens outside the window are drawn too


def test_stop_token_ids_adds_end_of_turn(tiny_models):
    model, tok = _load(tiny_models, "causal")
    assert G.stop_token_ids(model, tok) == [tok.eos_token_id]
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert G.stop_token_ids(model, tok) == [tok.eos_token_id, im_end]


def test_generate_int8_quantises_linear_layers(tiny_models):
    from udfs import runtime

    model, tok = _load(tiny_models, "seq2seq")
    quantised = runtime.quantize_int8(model, "cpu")
    kinds = {type(m).__module__ for m in quantised.modules()}
    assert any("quantized" in k for k in kinds)  # the Linear layers were swapped for dynamic int8 ones
    out = G.generate(quantised, tok, "seq2seq", PROMPTS, max_new_tokens=5, min_new_tokens=5)
    assert [g.n_tokens for g in out] == [5, 5, 5]
    with pytest.raises(ValueError, match="CPU only"):
        runtime.quantize_int8(model, "cuda:0")


# ---- transformers' warpers with the draw vector kept, the stop check on the tail (issue 57) ------------------
# The sampler and the stop check before issue 57, kept here only as the independent reference the module must
# still equal: the temperature / top-k / top-p maths written out, and the stop check that decodes every row's
# whole new text at every step.


def _legacy_draw_token(logits, gen, temperature=1.0, top_p=1.0, top_k=None) -> int:
    logits = logits / temperature
    ids = None
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        logits, ids = torch.topk(logits, top_k)
    probs = torch.softmax(logits, -1)
    if top_p < 1.0:
        if ids is not None:
            order = torch.arange(probs.shape[-1])
        else:
            window, order = torch.topk(probs, min(256, probs.shape[-1]))
            if float(window.sum()) < top_p:
                order = torch.argsort(probs, descending=True)
        ranked = probs[order]
        before = torch.cumsum(ranked, -1) - ranked
        ranked = torch.where(before < top_p, ranked, torch.zeros_like(ranked))
        pick = order[torch.multinomial(ranked / ranked.sum(), 1, generator=gen)]
    else:
        pick = torch.multinomial(probs, 1, generator=gen)
    return int(ids[pick] if ids is not None else pick)


class _LegacyRowSampler:
    def __init__(self, generators, temperature=1.0, top_p=1.0, top_k=None):
        self.generators, self.temperature, self.top_p, self.top_k = list(generators), temperature, top_p, top_k

    def __call__(self, input_ids, scores):
        out = scores.clone()
        for row, gen in enumerate(self.generators):
            if gen is None:
                continue
            pick = _legacy_draw_token(scores[row].float(), gen, self.temperature, self.top_p, self.top_k)
            out[row].fill_(float("-inf"))
            out[row, pick] = 0.0
        return out


class _LegacyStopAfter:
    def __init__(self, tokenizer, stops, start, min_new):
        self.tokenizer, self.stops, self.start, self.min_new = tokenizer, list(stops), start, min_new
        self.done = None

    def __call__(self, input_ids, scores=None, **kwargs):
        new = input_ids[:, self.start :]
        if self.done is None:
            self.done = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        if new.shape[1] < self.min_new:
            return self.done.clone()
        for i in (~self.done).nonzero().flatten().tolist():
            text = self.tokenizer.decode(new[i], skip_special_tokens=True)
            self.done[i] = any(s in text for s in self.stops)
        return self.done.clone()


def _logits(kind: str, vocab: int, rng: torch.Generator) -> torch.Tensor:
    x = torch.randn(vocab, generator=rng)
    if kind == "peaked":
        return x * 3
    if kind == "ties":  # bfloat16 logits read as float: many exact ties, in the window and at its edges
        return (x * 3).to(torch.bfloat16).float()
    if kind == "zipf":
        return -1.1 * torch.log(torch.arange(1.0, vocab + 1))[torch.randperm(vocab, generator=rng)] + 0.1 * x
    return x * 0.05  # flat: the nucleus is wider than the TOP_P_WINDOW-token window


def test_draw_token_draws_what_the_hand_written_sampler_drew():
    """transformers' warpers, the same draw vector: every seeded draw and the generator's state after it equal
    the sampler before issue 57, over vocabularies below and above the window, ties, a nucleus wider than the
    window, temperatures, top-k and top-p."""
    rng = torch.Generator().manual_seed(57)
    draws = wide = 0
    for vocab in (7, 300, 1000, 4096):
        for kind in ("peaked", "ties", "zipf", "flat"):
            logits = _logits(kind, vocab, rng)
            for temperature in (0.7, 1.0, 1.3):
                for top_k in (None, 5, 50):
                    for top_p in (1.0, 0.8, 0.95, 0.999):
                        seed = int(torch.randint(2**31, (1,), generator=rng))
                        old, new = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
                        picks = [(_legacy_draw_token(logits, old, temperature, top_p, top_k),
                                  G.draw_token(logits, new, temperature, top_p, top_k)) for _ in range(3)]  # fmt: skip
                        assert all(a == b for a, b in picks), (vocab, kind, temperature, top_k, top_p, picks)
                        assert torch.equal(old.get_state(), new.get_state())
                        draws += len(picks)
                        probs = torch.softmax(logits / temperature, -1)
                        wide += top_k is None and float(probs.topk(min(G.TOP_P_WINDOW, vocab)).values.sum()) < top_p
    assert draws == 4 * 4 * 3 * 3 * 4 * 3
    assert wide >= 10  # the argsort path was taken


def _legacy_nucleus(ranked: torch.Tensor, top_p: float) -> int:
    probs = torch.softmax(ranked, -1)
    return int((torch.cumsum(probs, -1) - probs < top_p).sum())


def test_nucleus_size_keeps_what_the_mass_before_rule_kept():
    """TopPLogitsWarper (ascending sort, drop what has cumulative mass <= 1 - top_p) keeps as many tokens as the
    rule before (keep while the mass before a token is below top_p), on the whole ranking and on a window that
    holds a share of the mass, top_p / share."""
    rng = torch.Generator().manual_seed(4)
    for vocab in (3, 50, 300, 2000):
        for kind in ("peaked", "ties", "zipf", "flat"):
            ranked = torch.sort(_logits(kind, vocab, rng), descending=True).values
            for top_p in (0.3, 0.8, 0.9, 0.95, 0.99):
                assert G.nucleus_size(ranked, top_p) == _legacy_nucleus(ranked, top_p), (vocab, kind, top_p)
                probs = torch.softmax(ranked, -1)
                window = min(vocab, 40)
                share = float(probs[:window].sum())
                if share >= top_p:  # the window holds the nucleus
                    before = torch.cumsum(probs, -1) - probs
                    assert G.nucleus_size(ranked[:window], top_p / share) == int((before < top_p).sum())
    # Hand-derived: softmax([2, 1, 0, -1]) = [0.644, 0.237, 0.087, 0.032]; the mass before each: 0, 0.644, 0.881,
    # 0.968.
    ranked = torch.tensor([2.0, 1.0, 0.0, -1.0])
    assert [G.nucleus_size(ranked, p) for p in (0.1, 0.64, 0.7, 0.9, 0.97, 0.99)] == [1, 1, 2, 3, 4, 4]
    # Where the two differ: a mass before that equals top_p in exact arithmetic is decided by float rounding.
    # Here [0.5, 0.3, 0.2] plus 47 tokens of 1e-9: the mass before the third is 0.8 / (1 + 4.7e-8) < 0.8, so it
    # belongs to the nucleus at top_p 0.8; the warper's ascending sum keeps it, the float32 sum before dropped it.
    edge = torch.log(torch.tensor([0.5, 0.3, 0.2] + [1e-9] * 47, dtype=torch.float64))
    exact = torch.softmax(edge, -1)
    assert int((torch.cumsum(exact, -1) - exact < 0.8).sum()) == 3
    assert G.nucleus_size(edge.float(), 0.8) == 3
    assert _legacy_nucleus(edge.float(), 0.8) == 2


class _BytesTokenizer:
    """A byte-level tokenizer: every token is some bytes (a UTF-8 character may be cut between tokens), ids 0
    and 1 are special tokens that decode to nothing; `clean` removes a space before "." as
    clean_up_tokenization_spaces does, `strip` drops a leading space as a SentencePiece decoder does."""

    PIECES = [b"", b"", b"a", b"b", b" ", b"n", b"an", b"\n", b".", b"x", b"\xc3", b"\xa9", b"\xe2\x82", b"\xac",
              b"ab c", b" ."]  # fmt: skip
    all_special_ids = [0, 1]

    def __init__(self, clean: bool = False, strip: bool = False) -> None:
        self.clean, self.strip, self.decoded = clean, strip, []

    def decode(self, ids, skip_special_tokens=False):
        ids = [int(t) for t in ids]
        self.decoded.append(sum(t not in self.all_special_ids for t in ids))  # the tokens it shows
        text = b"".join(self.PIECES[t] for t in ids if t not in self.all_special_ids).decode("utf-8", "replace")
        text = text.replace(" .", ".") if self.clean else text
        return text[1:] if self.strip and text.startswith(" ") else text


@pytest.mark.parametrize("clean, strip, stray", [(False, False, False), (True, False, False), (False, True, False),
                                                 (False, False, True)])  # fmt: skip
def test_stop_check_on_the_tail_stops_the_rows_the_whole_text_stopped(clean, strip, stray):
    """Step by step over random token rows (UTF-8 characters cut between tokens, special tokens inside, stop
    strings across tokens), the stop check that decodes only a row's tail stops the same rows at the same steps
    as decoding the whole new text. After its first check it decodes no more than a tail, and a whole text only
    to confirm a stop string its tail shows: for the rows it stops, or (`stray`: a stop string with U+FFFD, which
    a tail cut inside a character starts with) a tail's false alarm."""
    stops = ["é", "€a", "an\nb", "b a", "x.", "aaa", "ab c."] + (["\ufffdb"] if stray else [])
    rng = torch.Generator().manual_seed(int(clean) * 2 + int(strip) + 4 * int(stray))
    weights = torch.tensor([3.0, 1, 4, 4, 4, 2, 2, 2, 3, 3, 1, 1, 1, 1, 1, 2])
    alarms = 0
    for min_new in (0, 6, 30):
        ids = torch.multinomial(weights, 200 * 80, replacement=True, generator=rng).view(200, 80)
        prompt = torch.full((200, 3), 9)
        tail_tok, whole_tok = _BytesTokenizer(clean, strip), _BytesTokenizer(clean, strip)
        tail = G._StopAfter(tail_tok, stops, 3, min_new)
        whole = _LegacyStopAfter(whole_tok, stops, 3, min_new)
        for n in range(1, 81):
            seq = torch.cat([prompt, ids[:, :n]], 1)
            was = whole.done.clone() if whole.done is not None else torch.zeros(200, dtype=torch.bool)
            assert torch.equal(tail(seq), whole(seq)), (min_new, n)
            if n > max(min_new, 1):  # after the first check
                wide = sum(k > tail.tail for k in tail_tok.decoded)  # whole texts decoded to confirm
                stopped = int((whole.done & ~was).sum())
                assert wide <= stopped or stray
                alarms += max(0, wide - stopped)
            tail_tok.decoded.clear()
        assert 20 < int(whole.done.sum()) < 200  # rows stopped at many steps, and some never
    assert (alarms > 0) == stray


def test_stop_check_on_the_tail_hand_built_edges():
    """Stop strings the new token completes from far back: "x ." cleaned to "x.", a character and "aaa" split by
    runs of special tokens (decoded to nothing), a stop string with spaces cleaned out of it. Each row stops at
    its last hand-placed token, as the whole text says, though the row is longer than the tail by then."""
    rows = [[2, 3] * 15 + [9, 4, 8], [2, 3] * 15 + [9] + [0] * 30 + [8], [3] * 20 + [10] + [1] * 25 + [11],
            [2, 2] + [0] * 40 + [2], [3] * 35 + [2, 4, 8] * 4]  # fmt: skip
    ends = [len(r) for r in rows]  # stops at its last token: 33, 62, 47, 43, 47
    ids = torch.tensor([r + [3] * (70 - len(r)) for r in rows])
    # "a.a.a.a." spans 12 tokens, "a", " ", "." four times: more tokens than its 8 bytes.
    stops = ["x.", "é", "aaa", "a.a.a.a."]
    tail = G._StopAfter(_BytesTokenizer(clean=True), stops, 0, 0)
    whole = _LegacyStopAfter(_BytesTokenizer(clean=True), stops, 0, 0)
    stopped_at = [None] * len(rows)
    for n in range(1, 71):
        done = tail(ids[:, :n])
        assert torch.equal(done, whole(ids[:, :n]))
        for i in done.nonzero().flatten().tolist():
            stopped_at[i] = stopped_at[i] or n
    assert stopped_at == ends and min(ends) > tail.tail


def test_generate_chains_equal_the_sampler_and_stop_check_before(tiny_models, monkeypatch):
    """End to end with the tiny GPT-2: seeded samples (3 per prompt and a greedy row, rows sharing batches) with
    stop strings, n-gram blocking and min_new_tokens are the same bytes with the legacy sampler and stop check."""
    model, tok = _load(tiny_models, "causal")
    questions = PROMPTS + MANY[:1]
    prompts = [p for p in questions for _ in range(4)]
    samples = [None if j == 3 else j for _ in questions for j in range(4)]
    configs = [
        dict(top_p=0.8, no_repeat_ngram_size=3, min_new_tokens=8, stop_strings=["[ANSWER]", "e.", "he", " a"]),
        dict(temperature=1.3, top_p=0.999, stop_strings=["\n", "the"]),  # a nucleus wider than the window
        dict(temperature=0.5, top_p=0.95, top_k=5, min_new_tokens=4, stop_strings=["$", "s "]),
    ]
    lengths = []
    for cfg in configs:
        kw = dict(max_new_tokens=28, seed=11, samples=samples, batch_size=8, **cfg)
        now = G.generate(model, tok, "causal", prompts, **kw)
        with monkeypatch.context() as patch:
            patch.setattr(G, "RowSampler", _LegacyRowSampler)
            patch.setattr(G, "_StopAfter", _LegacyStopAfter)
            before = G.generate(model, tok, "causal", prompts, **kw)
        assert now == before, cfg
        lengths += [g.n_tokens for g in now]
    assert sum(n < 28 for n in lengths) > len(lengths) / 4  # stop strings (or EOS) ended many rows early
