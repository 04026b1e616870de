"""The tiny-model helper: each model loads with from_pretrained and runs a forward pass, offline."""

from __future__ import annotations

import torch
from tolerance import prob_approx
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from jobs.infra.tiny_models import NLI_LABEL2ID


def test_tiny_t5_loads_and_scores(tiny_models):
    path = tiny_models["tiny-t5"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSeq2SeqLM.from_pretrained(path, use_safetensors=True)
    enc = tok(["Generate entailed sentence: a & b ->"], return_tensors="pt")
    labels = tok([" the sun is a star"], return_tensors="pt").input_ids
    assert labels[0, -1].item() == tok.eos_token_id  # T5 convention: targets end with </s>
    out = model(**enc, labels=labels)
    assert out.logits.shape == (1, labels.shape[1], model.config.vocab_size)
    assert torch.isfinite(out.loss)


def test_tiny_gpt2_loads_and_runs(tiny_models):
    path = tiny_models["tiny-gpt2"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True)
    ids = tok(["Natalia sold 48 clips. Therefore, 72"], return_tensors="pt").input_ids
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    # Byte-level BPE: any text round-trips, emoji and other scripts included.
    text = "so 3 * 4 = 12 🍎 Жёлтый"
    assert tok.decode(tok(text).input_ids) == text


def test_tiny_nli_has_unusual_label_order_and_classifies_pairs(tiny_models):
    path = tiny_models["tiny-nli"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, use_safetensors=True)
    assert model.config.label2id == NLI_LABEL2ID
    assert [k.lower() for k, _ in sorted(NLI_LABEL2ID.items(), key=lambda kv: kv[1])] != [
        "contradiction",
        "neutral",
        "entailment",
    ]
    enc = tok(["A cat sat."], ["An animal sat."], return_tensors="pt")
    # Pair encoding marks the hypothesis with segment 1 like a BERT NLI model.
    assert set(enc.token_type_ids[0].tolist()) == {0, 1}
    probs = model(**enc).logits.softmax(-1)
    assert probs.shape == (1, 3)
    assert probs.sum(-1).item() == prob_approx(1.0)  # float32 softmax


def test_build_all_is_deterministic(tmp_path):
    from jobs.infra.tiny_models import build_gpt2

    a = AutoModelForCausalLM.from_pretrained(build_gpt2(tmp_path / "a"))
    b = AutoModelForCausalLM.from_pretrained(build_gpt2(tmp_path / "b"))
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
