"""Peer check: Direct option log-likelihoods (udfs.options.score_options) equal lm-evaluation-harness's
`loglikelihood` (its Hugging Face backend, HFLM) on the same model and strings, for both model families.

Where the two protocols agree, the numbers agree within 1e-4 nats. Where they differ, by design:
- EOS: the CoT Collection scores T5's closing </s> after every option (cot.score_eos); lm-eval never scores it.
  Ours with EOS equals lm-eval scoring the option followed by the literal "</s>" token.
- Whitespace: lm-eval moves trailing whitespace of the context to the front of the continuation for every model.
  We do that for causal LMs (cot.causal_move_space, no official causal code); for seq2seq we keep the official
  code's tokenisation (context "...[ANSWER] " with its space, option on its own), which differs from lm-eval
  whenever the tokenizer keeps a trailing space (the tiny byte-level BPE here does; T5's SentencePiece drops it).
- Tokenisation of a causal continuation: lm-eval encodes context + continuation together and splits; we encode
  them apart. Equal unless BPE merges across the boundary (never after the whitespace move for these strings).
"""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval")

from udfs import options as O  # noqa: E402

PEER_ABS = 1e-4  # the bound; the sums here are 5-120 nats, fp32 noise ~1e-5 on them

DIRECT_PROMPTS = [
    "Which sentence is sarcastic?\nOptions:\n(A) Great, more rain\n(B) Rain again\n[ANSWER] ",
    "Is the following sentence plausible? Joao Moutinho caught the screen pass.\n[ANSWER] ",
    "Sort the words: banana apple cherry\n[ANSWER] ",
]
OPTIONS = [["(A)", "(B)"], ["yes", "no", "yes or no"], ["apple banana cherry", "cherry"]]


@pytest.fixture(scope="module")
def peers(tiny_models):
    from lm_eval.models.huggingface import HFLM

    from udfs.runtime import load_model

    out = {}
    for family, name in (("seq2seq", "tiny-t5"), ("causal", "tiny-gpt2")):
        model, tok = load_model(str(tiny_models[name]), family, "cpu", "fp32")
        lm = HFLM(pretrained=str(tiny_models[name]), backend=family, device="cpu", dtype="float32", batch_size=4)
        out[family] = (model, tok, lm)
    return out


def _lm_eval(lm, pairs: list[tuple[str, str]]) -> list[float]:
    from lm_eval.api.instance import Instance

    requests = [Instance(request_type="loglikelihood", doc={}, arguments=p, idx=i) for i, p in enumerate(pairs)]
    return [logprob for logprob, _ in lm.loglikelihood(requests, disable_tqdm=True)]


def _flat(scores: list[list[O.OptionScore]]) -> list[float]:
    return [s.sum_logprob for row in scores for s in row]


def test_causal_direct_scores_equal_lm_eval(peers):
    model, tok, lm = peers["causal"]
    ours = _flat(O.score_options(model, tok, "causal", DIRECT_PROMPTS, OPTIONS, move_space=True))
    theirs = _lm_eval(lm, [(p, o) for p, opts in zip(DIRECT_PROMPTS, OPTIONS, strict=True) for o in opts])
    assert ours == pytest.approx(theirs, abs=PEER_ABS, rel=0)
    # Without the whitespace move the option is scored after a lone " " token: a different number.
    kept = _flat(O.score_options(model, tok, "causal", DIRECT_PROMPTS, OPTIONS, move_space=False))
    assert all(abs(a - b) > 1e-2 for a, b in zip(kept, theirs, strict=True))


def test_seq2seq_direct_scores_equal_lm_eval_without_eos(peers):
    model, tok, lm = peers["seq2seq"]
    # Contexts without trailing whitespace, options with their leading space: the two tokenisations agree.
    prompts = [p.rstrip() for p in DIRECT_PROMPTS]
    options = [[" " + o for o in opts] for opts in OPTIONS]
    pairs = [(p, o) for p, opts in zip(prompts, options, strict=True) for o in opts]
    ours = _flat(O.score_options(model, tok, "seq2seq", prompts, options, eos=False))
    assert ours == pytest.approx(_lm_eval(lm, pairs), abs=PEER_ABS, rel=0)
    # With EOS (the official default): lm-eval's number for the option followed by the "</s>" token.
    with_eos = _flat(O.score_options(model, tok, "seq2seq", prompts, options, eos=True))
    assert tok(" (A)</s>", add_special_tokens=False)["input_ids"][-1] == tok.eos_token_id
    assert with_eos == pytest.approx(_lm_eval(lm, [(p, o + "</s>") for p, o in pairs]), abs=PEER_ABS, rel=0)
    assert all(a < b for a, b in zip(with_eos, ours, strict=True))  # log p(</s>) < 0 is added


def test_seq2seq_official_prompt_differs_from_lm_eval_by_the_space(peers):
    """The official Direct prompt ends with a space: lm-eval moves it into the option, the official code does
    not. With this byte-level tokenizer the numbers differ; that is the documented difference."""
    model, tok, lm = peers["seq2seq"]
    ours = _flat(O.score_options(model, tok, "seq2seq", DIRECT_PROMPTS, OPTIONS, eos=False))
    theirs = _lm_eval(lm, [(p, o) for p, opts in zip(DIRECT_PROMPTS, OPTIONS, strict=True) for o in opts])
    assert tok("x ", add_special_tokens=False)["input_ids"] != tok("x", add_special_tokens=False)["input_ids"]
    assert all(abs(a - b) > 1e-2 for a, b in zip(ours, theirs, strict=True))
