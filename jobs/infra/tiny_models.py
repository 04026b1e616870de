"""Build tiny random models with locally trained tokenizers, without any network.

A T5 (seq2seq), a GPT-2-style causal LM and a 3-label NLI classifier whose `label2id` is deliberately
not in the usual order. Each loads with `from_pretrained(path)`; tests, the `offline` model profile and
the benchmarks use them. Sizes are parameters so benchmarks can build timing-sized models too.

    python -m jobs.infra.tiny_models --out models
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jobs.infra.config_paths import resolve_path
from udfs.model_paths import MODELS

# Byte-level BPE needs no unknown token: any text (emoji, Cyrillic, control characters) encodes.
_CORPUS = """
Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.
How many clips did Natalia sell altogether in April and May? She sold 48 / 2 = 24 clips in May.
So she sold 48 + 24 = 72 clips altogether. The answer is 72.
An animal requires warmth for survival. A thick fur coat keeps an animal warm, so a thick coat helps
the animal survive in a cold environment. The sun is a kind of star. Earth orbits the sun.
If a premise entails a hypothesis then the hypothesis follows. A contradiction means both cannot be true.
Therefore, the answer is yes. Generate entailed sentence: None -> Generate final answer:
Let's think step by step. [ANSWER] Options: (A) True (B) False (C) Yes (D) No.
"""


def _train_bpe(vocab_size: int, special: list[str], corpus: Sequence[str] | None = None):
    """Byte-level BPE trained on `corpus` (default: the built-in lines); deterministic for the same lines."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = list(corpus) if corpus is not None else [line for line in _CORPUS.splitlines() if line.strip()] * 4
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def _save(model, tok, out: Path, **special: Any) -> Path:
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    fast.save_pretrained(out)
    model.save_pretrained(out, safe_serialization=True)
    return out


def build_t5(
    out: Path, d_model: int = 32, layers: int = 2, heads: int = 2, vocab: int = 600, seed: int = 0,
    d_ff: int | None = None, corpus: Sequence[str] | None = None, tie: bool = False,
) -> Path:
    """A random T5 whose tokenizer is trained on `corpus` (default: the built-in lines); `train_pvi`'s scratch
    base is this builder at a trainable size with its training split as the corpus. `tie`: the output layer
    shares the input embeddings and the decoder output is scaled by d_model^-0.5 (T5's own setup); untied, HF
    draws the output layer with std 1, so a model to be trained starts at a loss of ~46 instead of ln(vocab)."""
    import torch
    from tokenizers import processors
    from transformers import T5Config, T5ForConditionalGeneration

    tok = _train_bpe(vocab, ["<pad>", "</s>", "<unk>"], corpus)
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos)]
    )
    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=tok.get_vocab_size(),
        d_model=d_model,
        d_kv=d_model // heads,
        d_ff=d_ff or d_model * 2,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=heads,
        pad_token_id=tok.token_to_id("<pad>"),
        eos_token_id=eos,
        decoder_start_token_id=tok.token_to_id("<pad>"),
        tie_word_embeddings=tie,
    )
    model = T5ForConditionalGeneration(config).eval()
    return _save(model, tok, out, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def build_gpt2(
    out: Path, d_model: int = 32, layers: int = 2, heads: int = 2, vocab: int = 600, n_positions: int = 1024, seed: int = 0
) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = _train_bpe(vocab, ["<|endoftext|>"])
    eos = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=tok.get_vocab_size(),
        n_embd=d_model,
        n_layer=layers,
        n_head=heads,
        n_positions=n_positions,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    model = GPT2LMHeadModel(config).eval()
    return _save(model, tok, out, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<|endoftext|>")


# Not the usual contradiction/neutral/entailment order, and mixed case: code must read label2id.
NLI_LABEL2ID = {"NEUTRAL": 0, "Contradiction": 1, "entailment": 2}


def build_nli(out: Path, d_model: int = 32, layers: int = 2, heads: int = 2, vocab: int = 600, seed: int = 0) -> Path:
    import torch
    from tokenizers import processors
    from transformers import BertConfig, BertForSequenceClassification

    tok = _train_bpe(vocab, ["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=d_model,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=d_model * 2,
        max_position_embeddings=512,
        num_labels=3,
        label2id=NLI_LABEL2ID,
        id2label={v: k for k, v in NLI_LABEL2ID.items()},
        pad_token_id=tok.token_to_id("[PAD]"),
    )
    model = BertForSequenceClassification(config).eval()
    # token_type_ids mark the hypothesis segment, as a BERT-style NLI tokenizer does (not a default here).
    return _save(
        model, tok, out, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def build_nli_from_encoder(encoder_path: str | Path, out: Path, seed: int = 0) -> Path:
    """A real encoder (e.g. the pip MiniLM weights) with a random 3-label head: a timing-sized NLI model."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(encoder_path),
        num_labels=3,
        label2id=NLI_LABEL2ID,
        id2label={v: k for k, v in NLI_LABEL2ID.items()},
        use_safetensors=True,
    ).eval()
    tok = AutoTokenizer.from_pretrained(str(encoder_path))
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    model.save_pretrained(out, safe_serialization=True)
    return out


# Bump when a builder changes what it writes: folders built by an older helper are then rebuilt.
HELPER_VERSION = "2"


def build_all(root: str | Path = MODELS, force: bool = False) -> dict[str, Path]:
    """The three tiny models under `root` (kept when present and built by this helper version, unless `force`)."""
    base = resolve_path(root)
    built = {}
    for name, fn in (("tiny-t5", build_t5), ("tiny-gpt2", build_gpt2), ("tiny-nli", build_nli)):
        path = base / name
        stamp = path / "HELPER_VERSION"
        current = stamp.exists() and stamp.read_text().strip() == HELPER_VERSION
        if force or not current or not (path / "config.json").exists():
            fn(path)
            stamp.write_text(HELPER_VERSION + "\n")
        built[name] = path
    (base / "MANIFEST.json").write_text(json.dumps({k: str(v) for k, v in built.items()}, indent=1))
    return built


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--out", default=MODELS)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    for name, path in build_all(args.out, args.force).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
