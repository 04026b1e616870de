"""The GPU path measured in one process (issue 48): paper-sized random models through the project's scoring and
generation code, against the official unbatched shape and a raw batched forward, fp32 and bf16, with the GPU's
scores checked against the CPU's.

On the lent device (one GPU, torch and transformers, no pyspark, Delta, MLflow, spaCy or pydantic; only 64 MiB of
the working tree travel) nothing is downloaded and no weights travel: every model is built there from a config of
its real shape with random weights (the compute of a profile is its architecture's, not its weights'):

| role | shape | stands for |
|---|---|---|
| nli | DeBERTa-v3-large (435M) | the paper's NLI cross-encoder (MoritzLaurer/DeBERTa-v3-large-mnli-fever-anli-ling-wanli) |
| pvi_g, pvi_null | T5-large (738M each) | the paper's g and g' (T5-large fine-tuned on EntailmentBank) |
| info_gain | GPT-2 XL (1.56B) | the paper's information-gain LM |
| info_gain_small | Gemma 3 270M (268M) | `registry:gemma3-270m`, the small profile's information-gain LM |
| generator | Qwen2.5-Coder-0.5B-Instruct (630M, untied head) | `registry:qwen2.5-coder-0.5b-instruct` (EB-challenge PAR) |

The registry's gemma3-270m and qwen2.5 weights are fp32 folders of 1.1 and 2.5 GB, far over what travels, so
their shapes are built here like the others (`tests/test_bench.py` checks these shapes against the fetched
folders' config.json where `make models` has fetched them). Weights are drawn in fp32, rounded to bf16 and saved
(half the bytes to write and read); the fp32 runs load them widened, so fp32 and bf16 runs have the same weights.
One byte-level BPE tokenizer, trained in a second on the inputs' own text (1,820 tokens, 1.14 tokens per word
against the real MiniLM WordPiece tokenizer's 1.17 on the same text), serves every model with each family's
special tokens; the models keep their real vocabularies (the LM heads' cost is real), of which the text uses the
first ids.

Inputs (`bench/data/gpu_path_chains.jsonl`, `bench/make_gpu_path_data.py`): the sample lake's 24 EB-challenge
chains (8 EntailmentBank trees: gold, NEG, HALL) and 24 GSM-8K chains, split into steps and RCUs by the steps job.

Per model, fp32 then bf16, each on the same inputs:
(a) official: the reference code's shape, one example per forward (archiki/ReCEval: one NLI pair, one LM pass per
    step and kind, duplicates included; options one by one; generation one prompt at a time), on a balanced
    subset of chains, timed per chain;
(b) udf: the project's UDF worker functions as Spark calls them (udfs.nli.score_frame over model_predictor,
    udfs.loglik.score_frame over model_scorer_factory with prefix sharing and runtime.max_batch_tokens,
    udfs.options.score_rows, udfs.generate.generate_frame), the model loaded by the factories themselves
    (runtime.task_model: the device they pick is recorded), on the distinct inputs as the jobs deduplicate them;
(c) raw: plain batched forwards (length-sorted, padded, one forward per batch, no prefix sharing) and plain
    `model.generate`, on the same distinct inputs.
Checks: (b) on the GPU equals (b) on the CPU for a few chains (fp32: max relative difference <= 1e-4; bf16: the
deviation from CPU fp32, reported); (b) equals (a) and (c) in fp32 on the same device. Targets: for the whole
scoring of a chain (NLI + g + g' + information gain), (b) >= 20x (a) and (b) >= 0.8x (c); the bf16 utilisation of
the GPU (FLOPs the scores need / seconds / the card's dense bf16 peak); generation tokens/s at batch 64 and 256.

    python bench/device_gpu_path.py --size paper --out $OUT      # on the device, ~5 min of an H100/H200
    python bench/device_gpu_path.py --size tiny --out /tmp/gp    # the same code, tiny models, CPU, < 2 min

The results are $OUT/results.json (written after every model, so a run cut short returns what it finished).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHAINS_FILE = ROOT / "bench" / "data" / "gpu_path_chains.jsonl"
BBH_PROMPT = ROOT / "tests" / "data" / "bbh_cot_prompts" / "sports_understanding.txt"
NLI_LABEL2ID = {"entailment": 0, "neutral": 1, "contradiction": 2}  # the paper NLI checkpoint's order
SCORING = ("nli", "pvi_g", "pvi_null", "info_gain")  # the whole scoring of a chain, paper profile
FP32_REL_TOL = 1e-4  # the bound on GPU fp32 against CPU fp32
TARGET_UDF_OVER_OFFICIAL = 20.0
TARGET_UDF_OVER_RAW = 0.8


def bf16_peak(device_name: str) -> float | None:
    """The card's dense bf16 tensor-core peak in FLOP/s (NVIDIA datasheets); None for a card not listed."""
    if "H200" in device_name:
        return 989e12
    if "H100" in device_name:
        return 756e12 if "PCIe" in device_name else 835e12 if "NVL" in device_name else 989e12
    if "A100" in device_name:
        return 312e12
    return None


# -- sizes ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Size:
    vocab: int  # the tokenizer's
    batch_size: int
    max_batch_tokens: int
    new_tokens: int  # generated per prompt
    gen_batches: tuple[int, ...]
    gen_prompts: int
    official_chains: int  # per dataset
    official_prompts: int
    check_chains: int  # per dataset, for GPU against CPU
    repeats: int  # timed runs of (b) and (c); the fastest counts
    chains: int | None  # per dataset; None: all 48
    sweep_batches: tuple[int, ...]
    sweep_budgets: tuple[int, ...]  # runtime.max_batch_tokens
    threads: int | None  # torch CPU threads (None: torch's default)


SIZES = {
    "paper": Size(2000, 64, 65536, 32, (64, 256), 256, 12, 4, 2, 2, None, (32, 64, 128, 256), (16384, 65536), None),
    # Tiny models gain nothing from threads, and on a shared 2-core machine spinning threads cost seconds.
    "tiny": Size(500, 4, 1024, 4, (2, 8), 8, 1, 1, 1, 1, 3, (4, 8), (1024,), 1),
}


def model_configs(size: str, ids: dict[str, int]) -> dict[str, Any]:
    """Role -> a transformers config: the real model's shape for `paper`, the same architecture tiny for `tiny`."""
    import transformers as tf

    paper = size == "paper"
    vocab = SIZES[size].vocab

    def pick(real: Any, tiny: Any) -> Any:
        return real if paper else tiny

    t5 = dict(  # t5-large
        vocab_size=pick(32128, vocab), d_model=pick(1024, 32), d_kv=pick(64, 16), d_ff=pick(4096, 64),
        num_layers=pick(24, 2), num_decoder_layers=pick(24, 2), num_heads=pick(16, 2), feed_forward_proj="relu",
        tie_word_embeddings=True, pad_token_id=ids["pad"], eos_token_id=ids["eos"], decoder_start_token_id=ids["pad"],
    )  # fmt: skip
    causal_ids = dict(bos_token_id=ids["endoftext"], eos_token_id=ids["endoftext"], pad_token_id=ids["endoftext"])
    qwen = tf.Qwen2Config(  # Qwen2.5-Coder-0.5B-Instruct as the registry folder keeps it (untied head)
        vocab_size=pick(151936, vocab), hidden_size=pick(896, 32), intermediate_size=pick(4864, 64),
        num_hidden_layers=pick(24, 2), num_attention_heads=pick(14, 2), num_key_value_heads=pick(2, 1),
        max_position_embeddings=32768, tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
        **causal_ids,
    )
    # Qwen2.5's rotary base (set after construction: the keyword changed name within transformers 5).
    if isinstance(getattr(qwen, "rope_parameters", None), dict):
        qwen.rope_parameters = {**qwen.rope_parameters, "rope_theta": 1000000.0}
    else:
        qwen.rope_theta = 1000000.0
    return {
        "nli": tf.DebertaV2Config(  # microsoft/deberta-v3-large
            vocab_size=pick(128100, vocab), hidden_size=pick(1024, 32), num_hidden_layers=pick(24, 2),
            num_attention_heads=pick(16, 2), intermediate_size=pick(4096, 64), max_position_embeddings=512,
            type_vocab_size=0, relative_attention=True, position_buckets=pick(256, 16), norm_rel_ebd="layer_norm",
            share_att_key=True, pos_att_type=["p2c", "c2p"], layer_norm_eps=1e-7, max_relative_positions=-1,
            position_biased_input=False, hidden_act="gelu", num_labels=3, label2id=NLI_LABEL2ID,
            id2label={v: k for k, v in NLI_LABEL2ID.items()}, pad_token_id=ids["pad"],
        ),
        "pvi_g": tf.T5Config(**t5),
        "pvi_null": tf.T5Config(**t5),
        "info_gain": tf.GPT2Config(  # gpt2-xl
            vocab_size=pick(50257, vocab), n_embd=pick(1600, 32), n_layer=pick(48, 2), n_head=pick(25, 2),
            n_positions=1024, **causal_ids,
        ),
        # google/gemma-3-270m (models/gemma3-270m). Tiny: a 64-position window, which some of the tiny inputs'
        # passes overrun, so the CPU run checks that scores stay equal across it (udfs.loglik.within_window).
        "info_gain_small": tf.Gemma3TextConfig(
            vocab_size=pick(262144, vocab), hidden_size=pick(640, 32), intermediate_size=pick(2048, 64),
            num_hidden_layers=pick(18, 2), num_attention_heads=pick(4, 2), num_key_value_heads=1,
            head_dim=pick(256, 16), query_pre_attn_scalar=pick(256, 16), sliding_window=pick(512, 64),
            max_position_embeddings=32768, tie_word_embeddings=True, **causal_ids,
        ),
        "generator": qwen,
    }


FAMILY = {"nli": "nli", "pvi_g": "seq2seq", "pvi_null": "seq2seq", "info_gain": "causal",
          "info_gain_small": "causal", "generator": "causal"}  # fmt: skip
SHAPE = {"nli": "DeBERTa-v3-large", "pvi_g": "T5-large", "pvi_null": "T5-large", "info_gain": "GPT-2 XL",
         "info_gain_small": "Gemma 3 270M", "generator": "Qwen2.5-Coder-0.5B"}  # fmt: skip


# -- inputs -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Chain:
    chain_id: str
    dataset: str
    context: list[str]
    step_texts: list[str]
    premises: list[list[str]]
    conclusions: list[str]
    answer: str


def load_chains(path: Path = CHAINS_FILE) -> list[Chain]:
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        steps = r["steps"]
        out.append(Chain(r["chain_id"], r["dataset"], r["context"], [s["text"] for s in steps],
                         [s["premises"] for s in steps], [s["conclusion"] for s in steps], r["answer"]))  # fmt: skip
    return out


def balanced(chains: Sequence[Chain], per_dataset: int) -> list[Chain]:
    """The first `per_dataset` chains of each dataset (EB and GSM-8K chains differ in size)."""
    seen: dict[str, int] = {}
    out = []
    for c in chains:
        if seen.get(c.dataset, 0) < per_dataset:
            seen[c.dataset] = seen.get(c.dataset, 0) + 1
            out.append(c)
    return out


def nli_pairs(chain: Chain) -> list[tuple[str, str]]:
    """The (premise, hypothesis) pairs jobs.receval.nli_scores builds for a chain (history all), duplicates kept;
    the same rule as bench/workload.nli_pairs (a test holds them equal), here without its pydantic import."""
    pairs = []
    for i, (premise, conclusion) in enumerate(zip(chain.premises, chain.conclusions, strict=True)):
        earlier = chain.conclusions[:i]
        intra = [p for p in [*premise, *earlier] if p.strip()]
        if intra:
            pairs.append((" and ".join(intra), conclusion))
        pairs += [(s, conclusion) for s in [*chain.context, *earlier] if s.strip()]
    return pairs


def lm_requests(chains: Sequence[Chain], role: str) -> list[tuple[str, str]]:
    """Every (source, target) pass of `role` the official code makes for the chains, duplicates kept (per step:
    g and g' one each, information gain L(i-1) and L(i))."""
    from udfs import pvi_prompts as P

    want = "info_gain" if role.startswith("info_gain") else role
    return [(r.source, r.target) for c in chains
            for r in P.chain_requests(c.step_texts, c.premises, c.conclusions, c.answer, "causal") if r.role == want]


def distinct(items: Sequence[Any]) -> list[Any]:
    return list(dict.fromkeys(items))


def option_examples(chains: Sequence[Chain]) -> list[tuple[str, list[str]]]:
    """CoT-evaluation-shaped option scoring: a few-shot prompt (BBH's sports_understanding CoT prompt) + the
    chain's question and steps; four options, the chain's answer and the next three chains' answers."""
    head = "\n".join(x for x in BBH_PROMPT.read_text().splitlines() if not x.startswith("-----") and "canary" not in x)
    out = []
    for i, c in enumerate(chains):
        prompt = f"{head}\n\nQ: {' '.join(c.context)}\nA: Let's think step by step. {' '.join(c.step_texts)} So the answer is"
        options = [" " + chains[(i + k) % len(chains)].answer for k in range(4)]
        out.append((prompt, options))
    return out


def gen_prompts(chains: Sequence[Chain], n: int) -> list[str]:
    """`n` paraphrase prompts (EB-challenge PAR's job): every step and context sentence, cycled."""
    texts = distinct([t for c in chains for t in [*c.step_texts, *c.context]])
    return [f"Paraphrase the sentence: {texts[i % len(texts)]}" for i in range(n)]


# -- tokenizer and models ---------------------------------------------------------------------------------
SPECIAL = ["<pad>", "</s>", "<unk>", "<|endoftext|>", "[CLS]", "[SEP]"]


def corpus(chains: Sequence[Chain]) -> list[str]:
    lines = [t for c in chains for t in [*c.context, *c.step_texts, c.answer]]
    return lines + [x for x in BBH_PROMPT.read_text().splitlines() if x.strip()]


def tokenizers_for(chains: Sequence[Chain], vocab: int) -> tuple[dict[str, Any], dict[str, int]]:
    """One byte-level BPE (as jobs.infra.tiny_models trains, which imports pydantic: absent on the device) wrapped
    per family: NLI `[CLS] a [SEP] b [SEP]` with segment ids, seq2seq `a </s>`, causal `<|endoftext|>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    bpe.train_from_iterator(corpus(chains), trainer=trainer)
    ids = {"pad": bpe.token_to_id("<pad>"), "eos": bpe.token_to_id("</s>"), "endoftext": bpe.token_to_id("<|endoftext|>")}

    def wrap(post: Any, **special: Any) -> Any:
        tok = Tokenizer.from_str(bpe.to_str())
        if post is not None:
            tok.post_processor = post
        return PreTrainedTokenizerFast(tokenizer_object=tok, **special)

    cls, sep = bpe.token_to_id("[CLS]"), bpe.token_to_id("[SEP]")
    nli_post = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                             special_tokens=[("[CLS]", cls), ("[SEP]", sep)])  # fmt: skip
    s2s_post = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", ids["eos"])])
    toks = {
        "nli": wrap(nli_post, pad_token="<pad>", unk_token="<unk>", cls_token="[CLS]", sep_token="[SEP]",
                    model_input_names=["input_ids", "token_type_ids", "attention_mask"]),
        # t5-large's tokenizer says 512; the few-shot option prompts run longer, T5's relative positions allow it.
        "seq2seq": wrap(s2s_post, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=1024),
        "causal": wrap(None, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>"),
    }  # fmt: skip
    return toks, ids


def build_model(role: str, config: Any, tokenizer: Any, folder: Path, device: str, seed: int) -> dict[str, Any]:
    """Random weights of `config`'s shape, drawn on `device` (fast on a GPU), rounded to bf16, saved with the
    tokenizer; returns the parameter counts."""
    import torch
    import transformers as tf

    auto = {"nli": tf.AutoModelForSequenceClassification, "seq2seq": tf.AutoModelForSeq2SeqLM,
            "causal": tf.AutoModelForCausalLM}[FAMILY[role]]  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = auto.from_config(config)
    model = model.to(torch.bfloat16).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    counts = parameter_counts(model)
    del model
    free()
    return counts


def parameter_counts(model: Any) -> dict[str, Any]:
    """All parameters; the body's (no input embeddings, no output layer): what every position runs through;
    encoder and decoder bodies of a seq2seq model; hidden size and vocabulary (the LM head's cost per logit)."""
    import torch

    def body(module: Any) -> int:
        skip = {id(p) for m in module.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
        out_layer = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if out_layer is not None:
            skip |= {id(p) for p in out_layer.parameters()}
        return sum(p.numel() for p in module.parameters() if id(p) not in skip)

    config = model.config
    counts = {"parameters": sum(p.numel() for p in model.parameters()), "body": body(model),
              "hidden": getattr(config, "d_model", None) or getattr(config, "hidden_size", None) or config.n_embd,
              "vocab": config.vocab_size}  # fmt: skip
    if hasattr(model, "encoder") and hasattr(model, "decoder"):
        counts["encoder_body"], counts["decoder_body"] = body(model.encoder), body(model.decoder)
    return counts


def free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- the three paths --------------------------------------------------------------------------------------
def softmax3(logits: Any, indices: tuple[int, int, int]) -> list[list[float]]:
    import torch

    return torch.softmax(logits.float(), -1)[:, list(indices)].double().cpu().tolist()


def official_nli(model: Any, tok: Any, pairs: Sequence[tuple[str, str]], max_length: int, device: str) -> list:
    """archiki/ReCEval's shape: one tokenizer call and one forward per pair."""
    import torch

    from udfs import nli

    indices = nli.label_indices(model.config.label2id)
    out = []
    with torch.inference_mode():
        for premise, hypothesis in pairs:
            enc = tok(premise, hypothesis, truncation=True, max_length=max_length, return_tensors="pt").to(device)
            out += softmax3(model(**enc).logits, indices)
    return out


def raw_nli(model: Any, tok: Any, pairs: Sequence[tuple[str, str]], batch: int, max_length: int, device: str) -> list:
    """Length-sorted batches, the tokenizer's own padding, one forward per batch."""
    import torch

    from udfs import nli
    from udfs.runtime import length_batches

    indices = nli.label_indices(model.config.label2id)
    lengths = [len(x) for x in tok([p for p, _ in pairs], [h for _, h in pairs])["input_ids"]]
    out: list = [None] * len(pairs)
    with torch.inference_mode():
        for idx in length_batches(lengths, batch):
            enc = tok([pairs[i][0] for i in idx], [pairs[i][1] for i in idx], padding=True, truncation=True,
                      max_length=max_length, return_tensors="pt").to(device)  # fmt: skip
            for i, p in zip(idx, softmax3(model(**enc).logits, indices), strict=True):
                out[i] = p
    return out


def official_loglik(model: Any, tok: Any, family: str, passes: Sequence[tuple[str, str]], device: str) -> list[float]:
    """One pass per (source, target), batch 1, as the reference code scores each step's g, g', L(i-1), L(i)."""
    from udfs import loglik

    return [loglik.score(model, tok, family, [s], [t], 1, None, device)[0].sum_logprob for s, t in passes]


def raw_loglik(
    model: Any, tok: Any, family: str, passes: Sequence[tuple[str, str]], batch: int, max_tokens: int, device: str
) -> list[float]:
    """Summed target log-probs by plain batched forwards: causal rows left-padded (targets end in the last
    column, so `logits_to_keep` spares the LM head the source positions), seq2seq rows with -100 labels; every
    pass whole, no shared prefixes, no cache."""
    import torch

    from udfs.runtime import length_batches

    special = family == "seq2seq"
    src = tok([s for s, _ in passes], add_special_tokens=special)["input_ids"]
    tgt = tok([t for _, t in passes], add_special_tokens=False)["input_ids"]
    start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if family == "causal":
        src = [s or [start] for s in src]
    pad = tok.pad_token_id
    lengths = [len(s) + len(t) for s, t in zip(src, tgt, strict=True)]
    out = [0.0] * len(passes)
    with torch.inference_mode():
        for idx in length_batches(lengths, batch, max_tokens=max_tokens):
            if family == "causal":
                width = max(lengths[i] for i in idx)
                keep = max(len(tgt[i]) for i in idx)
                ids = torch.full((len(idx), width), pad)
                mask = torch.zeros((len(idx), width), dtype=torch.long)
                labels = torch.zeros((len(idx), keep), dtype=torch.long)
                scored = torch.zeros((len(idx), keep), dtype=torch.bool)
                for b, i in enumerate(idx):
                    seq = src[i] + tgt[i]
                    ids[b, width - len(seq):] = torch.tensor(seq)
                    mask[b, width - len(seq):] = 1
                    if tgt[i]:
                        labels[b, keep - len(tgt[i]):] = torch.tensor(tgt[i])
                        scored[b, keep - len(tgt[i]):] = True
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                               position_ids=positions.to(device), logits_to_keep=keep + 1).logits[:, :-1]  # fmt: skip
            else:
                width = max(len(src[i]) for i in idx)
                keep = max(1, max(len(tgt[i]) for i in idx))
                ids = torch.full((len(idx), width), pad)
                mask = torch.zeros((len(idx), width), dtype=torch.long)
                labels = torch.full((len(idx), keep), -100)
                for b, i in enumerate(idx):
                    ids[b, : len(src[i])] = torch.tensor(src[i])
                    mask[b, : len(src[i])] = 1
                    labels[b, : len(tgt[i])] = torch.tensor(tgt[i])
                scored = labels != -100
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).logits
            logp = torch.log_softmax(logits.float(), -1)
            picked = logp.gather(-1, labels.clamp(min=0).to(device).unsqueeze(-1)).squeeze(-1) * scored.to(device)
            for i, total in zip(idx, picked.sum(-1).double().cpu().tolist(), strict=True):
                out[i] = total
    return out


def raw_generate(model: Any, tok: Any, family: str, prompts: Sequence[str], batch: int, new: int, device: str) -> int:
    """Plain `model.generate` over batches in input order (greedy, exactly `new` tokens); returns tokens made."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False, num_beams=1,
                              pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    made = 0
    with torch.inference_mode():
        for start in range(0, len(prompts), batch):
            enc = tok(list(prompts[start:start + batch]), add_special_tokens=family == "seq2seq", padding=True,
                      padding_side="left" if family == "causal" else "right", return_tensors="pt").to(device)  # fmt: skip
            out = model.generate(**enc, generation_config=config)
            made += out.shape[0] * (out.shape[1] - (enc["input_ids"].shape[1] if family == "causal" else 1))
    return made


# -- comparing --------------------------------------------------------------------------------------------
def deviation(test: Sequence[Any], ref: Sequence[Any]) -> dict[str, float]:
    """Max absolute and max relative difference (relative to the reference value itself: a sum of log-probs
    of -40 carries the noise of its terms, a probability of 0.3 its own) over flattened values."""
    import numpy as np

    a = np.asarray(test, dtype=np.float64).ravel()
    b = np.asarray(ref, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"{a.shape} values against {b.shape}")
    if not a.size:
        return {"max_abs": 0.0, "max_rel": 0.0, "n": 0}
    diff = np.abs(a - b)
    rel = diff / np.maximum(np.abs(b), 1e-6)
    return {"max_abs": float(diff.max()), "max_rel": float(rel.max()), "mean_abs": float(diff.mean()), "n": int(a.size)}


# -- the run ----------------------------------------------------------------------------------------------
@dataclass
class Run:
    size: Size
    device: str  # the device the run measures ("cuda" when one is visible)
    out: Path
    started: float
    budget_s: float
    results: dict = field(default_factory=dict)

    def sync(self) -> None:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def timed(self, fn: Callable[[], Any], repeats: int = 1) -> tuple[float, Any]:
        """(fastest wall seconds of `repeats` runs, the last run's value)."""
        best, value = math.inf, None
        for _ in range(repeats):
            self.sync()
            t0 = time.perf_counter()
            value = fn()
            self.sync()
            best = min(best, time.perf_counter() - t0)
        return best, value

    def over_budget(self) -> bool:
        return time.time() - self.started > self.budget_s

    def save(self) -> None:
        self.results["seconds"] = round(time.time() - self.started, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1, default=float))


def nli_role(run: Run, folder: str, chains: list[Chain], official: list[Chain], check: list[Chain]) -> dict:
    from udfs import nli, runtime

    sz = run.size
    all_pairs = [p for c in chains for p in nli_pairs(c)]
    pairs = distinct(all_pairs)
    off_pairs = [p for c in official for p in nli_pairs(c)]
    chk = distinct([p for c in check for p in nli_pairs(c)])

    def udf(device: str, dtype: str, items: Sequence[tuple[str, str]], batch: int = sz.batch_size) -> tuple[Any, list]:
        predict = nli.model_predictor(folder, None, device, dtype, batch, 512)()
        frame = nli.score_frame(predict, [p for p, _ in items], [h for _, h in items], "fail")
        return predict, frame[[nli.ENTAIL, nli.NEUTRAL, nli.CONTRADICTION]].to_numpy(dtype=float).tolist()

    out: dict = {"units": {"pairs_official": len(off_pairs), "pairs_distinct": len(pairs), "pairs_all": len(all_pairs)}}
    cpu = udf("cpu", "fp32", chk)[1]

    def measure(dtype: str) -> dict:
        on_device = udf("auto", dtype, chk)[1]
        device = runtime.task_device("auto")
        model, tok = runtime.load_model(folder, "nli", device, dtype)
        res: dict = {"udf_device": device}
        res["check_vs_cpu_fp32"] = deviation(on_device, cpu)
        official_nli(model, tok, off_pairs[:2], 512, device)  # warm-up
        res["a_s"], a_scores = run.timed(lambda: official_nli(model, tok, off_pairs, 512, device))
        res["b_s"], b_scores = run.timed(lambda: udf("auto", dtype, pairs)[1], sz.repeats)
        raw_nli(model, tok, pairs[:2], 2, 512, device)
        res["c_s"], c_scores = run.timed(lambda: raw_nli(model, tok, pairs, sz.batch_size, 512, device), sz.repeats)
        where = {p: i for i, p in enumerate(pairs)}
        res["b_vs_a"] = deviation([b_scores[where[p]] for p in off_pairs], a_scores)
        res["b_vs_c"] = deviation(b_scores, c_scores)
        tokens = sum(len(x) for x in tok([p for p, _ in pairs], [h for _, h in pairs])["input_ids"])
        res["flops"] = 2.0 * run.results["models"]["nli"]["body"] * tokens
        res["flops_official"] = res["flops"] * len(off_pairs) / len(pairs)  # per pair alike; the subset's share
        return res

    for dtype in ("fp32", "bf16"):
        out[dtype] = measure(dtype)
        runtime.clear_cache()
        free()
    return out


def lm_flops(counts: dict, family: str, src_tokens: int, tgt_tokens: int, positions: int | None = None) -> float:
    """2 x body parameters per position run + 2 x hidden x vocab per scored (or generated) token (the LM head)."""
    head = 2.0 * counts["hidden"] * counts["vocab"] * tgt_tokens
    if family == "seq2seq":
        return 2.0 * (counts["encoder_body"] * src_tokens + counts["decoder_body"] * tgt_tokens) + head
    return 2.0 * counts["body"] * (positions if positions is not None else src_tokens + tgt_tokens) + head


def loglik_role(run: Run, role: str, folder: str, chains: list[Chain], official: list[Chain], check: list[Chain]) -> dict:
    from udfs import loglik, runtime

    sz, family = run.size, FAMILY[role]
    passes = distinct(lm_requests(chains, role))
    off = lm_requests(official, role)
    chk = distinct(lm_requests(check, role))

    def udf(device: str, dtype: str, items, batch: int = sz.batch_size, budget: int = sz.max_batch_tokens):
        scorer = loglik.model_scorer_factory(folder, family, device, dtype, None, batch, None, None, False, True,
                                             family == "causal", budget)()  # fmt: skip
        rows = loglik.score_frame(scorer, [s for s, _ in items], [t for _, t in items], "fail")
        return scorer, [r["sum_logprob"] for r in rows]

    out: dict = {"units": {"passes_official": len(off), "passes_distinct": len(passes)}}
    cpu = udf("cpu", "fp32", chk)[1]

    def measure(dtype: str) -> dict:
        on_device = udf("auto", dtype, chk)[1]
        device = runtime.task_device("auto")
        model, tok = runtime.load_model(folder, family, device, dtype)
        res: dict = {"udf_device": device, "check_vs_cpu_fp32": deviation(on_device, cpu)}
        official_loglik(model, tok, family, off[:2], device)
        res["a_s"], a_scores = run.timed(lambda: official_loglik(model, tok, family, off, device))
        res["b_s"], (scorer, b_scores) = run.timed(lambda: udf("auto", dtype, passes), sz.repeats)
        raw_loglik(model, tok, family, passes[:2], 2, sz.max_batch_tokens, device)
        res["c_s"], c_scores = run.timed(
            lambda: raw_loglik(model, tok, family, passes, sz.batch_size, sz.max_batch_tokens, device), sz.repeats)
        where = {p: i for i, p in enumerate(passes)}
        res["b_vs_a"] = deviation([b_scores[where[p]] for p in off], a_scores)
        res["b_vs_c"] = deviation(b_scores, c_scores)
        special = family == "seq2seq"
        src = sum(len(x) for x in tok([s for s, _ in passes], add_special_tokens=special)["input_ids"])
        tgt = sum(len(x) for x in tok([t for _, t in passes], add_special_tokens=False)["input_ids"])
        stats = scorer.stats  # the last timed run's: forwards and positions it ran
        res["positions_run_b"], res["source_tokens"], res["target_tokens"] = stats.positions, src, tgt
        counts = run.results["models"][role]
        res["flops"] = lm_flops(counts, family, src, tgt, stats.positions if family == "causal" else None)
        res["flops_official"] = res["flops"] * len(off) / len(passes)
        return res

    for dtype in ("fp32", "bf16"):
        out[dtype] = measure(dtype)
        runtime.clear_cache()
        free()
    return out


def options_role(run: Run, role: str, folder: str, chains: list[Chain], official: list[Chain], check: list[Chain]) -> dict:
    from udfs import options as O
    from udfs import runtime

    sz, family = run.size, FAMILY[role]
    examples = option_examples(chains)
    off_examples = [examples[chains.index(c)] for c in official]
    chk_examples = [examples[chains.index(c)] for c in check]

    def flat(items):
        return [(p, o) for p, opts in items for o in opts]

    def udf(device: str, dtype: str, items):
        scorer = O.model_options_factory(folder, family, device, dtype, None, sz.batch_size, 1024, None, False, True,
                                         sz.max_batch_tokens)()  # fmt: skip
        rows = flat(items)
        frame = O.score_rows(scorer, [p for p, _ in rows], [""] * len(rows), [o for _, o in rows], "fail")
        return frame["sum_logprob"].astype(float).tolist()

    out: dict = {"units": {"examples": len(examples), "options": len(flat(examples)),
                           "examples_official": len(off_examples)}}  # fmt: skip
    cpu = udf("cpu", "fp32", chk_examples)

    def measure(dtype: str) -> dict:
        on_device = udf("auto", dtype, chk_examples)
        device = runtime.task_device("auto")
        model, tok = runtime.load_model(folder, family, device, dtype)
        res: dict = {"udf_device": device, "check_vs_cpu_fp32": deviation(on_device, cpu)}
        res["a_s"], a_scores = run.timed(lambda: official_loglik(model, tok, family, flat(off_examples), device))
        res["b_s"], b_scores = run.timed(lambda: udf("auto", dtype, examples), sz.repeats)
        res["c_s"], c_scores = run.timed(
            lambda: raw_loglik(model, tok, family, flat(examples), sz.batch_size, sz.max_batch_tokens, device), sz.repeats)
        starts = [sum(len(o) for _, o in examples[:k]) for k in range(len(examples))]
        picked = [b_scores[starts[chains.index(c)] + j] for c in official for j in range(4)]
        res["b_vs_a"] = deviation(picked, a_scores)
        res["b_vs_c"] = deviation(b_scores, c_scores)
        special = family == "seq2seq"
        prompt_tokens = [len(x) for x in tok([p for p, _ in examples], add_special_tokens=special)["input_ids"]]
        tgt = sum(len(x) for x in tok([o for _, o in flat(examples)], add_special_tokens=False)["input_ids"])
        res["longest_prompt_tokens"] = max(prompt_tokens)
        counts = run.results["models"][role]
        # The needed work: each prompt once (encoder, or the causal context), each option's tokens.
        res["flops"] = lm_flops(counts, family, sum(prompt_tokens), tgt, sum(prompt_tokens) + tgt)
        res["flops_official"] = None
        return res

    for dtype in ("fp32", "bf16"):
        out[dtype] = measure(dtype)
        runtime.clear_cache()
        free()
    return out


def generation_role(run: Run, role: str, folder: str, chains: list[Chain]) -> dict:
    from udfs import generate as G
    from udfs import runtime

    sz, family = run.size, FAMILY[role]
    prompts = gen_prompts(chains, sz.gen_prompts)
    few = prompts[: sz.official_prompts]

    def udf(device: str, dtype: str, items, batch: int) -> list[tuple[str, int]]:
        fn = G.model_generator_factory(folder, family, device, dtype, max_new_tokens=sz.new_tokens,
                                       min_new_tokens=sz.new_tokens, batch_size=batch, max_length=512)()  # fmt: skip
        frame = G.generate_frame(fn, list(items), "fail")
        return list(zip(frame["text"], frame["n_tokens"].astype(int), strict=True))

    out: dict = {"units": {"prompts": len(prompts), "new_tokens": sz.new_tokens, "official_prompts": len(few)}}
    cpu = udf("cpu", "fp32", few, len(few))

    def measure(dtype: str) -> dict:
        made = udf("auto", dtype, few, len(few))
        device = runtime.task_device("auto")
        res: dict = {"udf_device": device,
                     "greedy_text_equal_to_cpu_fp32": sum(a == b for a, b in zip(made, cpu, strict=True)) / len(few)}
        if dtype == "bf16":  # throughput: bf16 is what a GPU run uses
            model, tok = runtime.load_model(folder, family, device, dtype)
            res["a_s"], _ = run.timed(lambda: udf("auto", dtype, few, 1))
            res["a_tokens_per_s"] = len(few) * sz.new_tokens / res["a_s"]
            counts = run.results["models"][role]
            prompt_tokens = sum(len(x) for x in tok(prompts, add_special_tokens=family == "seq2seq")["input_ids"])
            for batch in sz.gen_batches:
                t_b, rows = run.timed(lambda batch=batch: udf("auto", dtype, prompts, batch), sz.repeats)
                t_c, made_c = run.timed(lambda batch=batch: raw_generate(model, tok, family, prompts, batch,
                                                                         sz.new_tokens, device), sz.repeats)  # fmt: skip
                tokens = sum(n for _, n in rows)
                flops = lm_flops(counts, family, prompt_tokens, tokens, prompt_tokens + tokens)
                res[f"batch_{batch}"] = {"b_s": t_b, "c_s": t_c, "b_tokens": tokens, "c_tokens": made_c,
                                         "b_tokens_per_s": tokens / t_b, "c_tokens_per_s": made_c / t_c,
                                         "b_over_c": t_c / t_b, "flops": flops}  # fmt: skip
        return res

    for dtype in ("fp32", "bf16"):
        out[dtype] = measure(dtype)
        runtime.clear_cache()
        free()
    return out


def sweep(run: Run, folders: dict[str, str], chains: list[Chain]) -> dict:
    """(b) in bf16 at several batch sizes and LM token budgets: the figures the GPU defaults are chosen from."""
    from udfs import loglik, nli, runtime

    out: dict = {}
    pairs = distinct([p for c in chains for p in nli_pairs(c)])
    for batch in run.size.sweep_batches:
        if run.over_budget():
            break
        predict = nli.model_predictor(folders["nli"], None, "auto", "bf16", batch, 512)()
        t, _ = run.timed(lambda predict=predict: nli.score_frame(predict, [p for p, _ in pairs], [h for _, h in pairs], "fail"))
        out[f"nli batch {batch}"] = t
    runtime.clear_cache()
    for role in ("pvi_g", "info_gain"):
        family = FAMILY[role]
        passes = distinct(lm_requests(chains, role))
        for batch in run.size.sweep_batches:
            for budget in run.size.sweep_budgets:
                if run.over_budget():
                    break
                scorer = loglik.model_scorer_factory(folders[role], family, "auto", "bf16", None, batch, None, None,
                                                     False, True, family == "causal", budget)()  # fmt: skip
                t, _ = run.timed(lambda scorer=scorer, passes=passes: loglik.score_frame(
                    scorer, [s for s, _ in passes], [x for _, x in passes], "fail"))
                out[f"{role} batch {batch} max_batch_tokens {budget}"] = t
        runtime.clear_cache()
        free()
    return out


def summarise(run: Run) -> None:
    """Per dtype: seconds per chain of each path over the whole scoring, the targets, and bf16 utilisation."""
    r = run.results
    peak = r.get("bf16_peak_flops")
    n_chains, n_official = r["workload"]["chains"], r["workload"]["official_chains"]
    out: dict = {}
    for dtype in ("fp32", "bf16"):
        for label, roles in (("paper", SCORING), ("small_info_gain", ("nli", "pvi_g", "pvi_null", "info_gain_small"))):
            rows = [r["roles"].get(role, {}).get(dtype) for role in roles]
            if any(x is None for x in rows):
                continue
            a = sum(x["a_s"] for x in rows) / n_official
            b = sum(x["b_s"] for x in rows) / n_chains
            c = sum(x["c_s"] for x in rows) / n_chains
            flops = sum(x["flops"] for x in rows) / n_chains  # the needed work per chain
            s = {"a_s_per_chain": a, "b_s_per_chain": b, "c_s_per_chain": c, "b_over_a": a / b, "b_over_c": c / b,
                 "target_b_over_a": TARGET_UDF_OVER_OFFICIAL, "target_b_over_c": TARGET_UDF_OVER_RAW,
                 "met_b_over_a": a / b >= TARGET_UDF_OVER_OFFICIAL, "met_b_over_c": c / b >= TARGET_UDF_OVER_RAW,
                 "flops_per_chain": flops}  # fmt: skip
            if peak and dtype == "bf16":
                s["utilisation"] = {p: flops / t / peak for p, t in (("a", a), ("b", b), ("c", c))}
            out[f"{dtype} {label}"] = s
    r["chain_scoring"] = out
    if peak:  # per part, bf16: the needed FLOPs over each path's seconds, as a share of the card's peak
        util: dict = {}
        for key, v in r["roles"].items():
            d = v.get("bf16", {})
            if d.get("flops"):
                util[key] = {p: d["flops"] / d[f"{p}_s"] / peak for p in ("b", "c")}
            for batch, g in ((k, x) for k, x in d.items() if k.startswith("batch_")):
                util[f"{key} {batch}"] = {p: g["flops"] / g[f"{p}_s"] / peak for p in ("b", "c")}
        r["utilisation_bf16"] = util
    checks = {}
    for role, v in r["roles"].items():
        for dtype in ("fp32", "bf16"):
            d = v.get(dtype, {})
            if "check_vs_cpu_fp32" in d:
                checks[f"{role} {dtype}"] = d["check_vs_cpu_fp32"]["max_rel"]
    r["gpu_vs_cpu_max_rel"] = checks
    fp32 = [x for k, x in checks.items() if k.endswith("fp32")]
    r["fp32_equal_to_cpu"] = all(x <= FP32_REL_TOL for x in fp32) if fp32 else None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="paper")
    ap.add_argument("--out", type=Path, required=True, help="results.json goes here ($OUT on the device)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu_path_models"), help="the built model folders")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no optional part (the sweep) after this many seconds (default: 420 paper, none tiny)")
    ap.add_argument("--no-sweep", action="store_true")
    a = ap.parse_args(argv)
    started = time.time()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    import torch
    import transformers

    from udfs import runtime

    runtime.quiet()
    transformers.utils.logging.disable_progress_bar()  # save/load bars would fill the 12,000 characters returned
    runtime.set_cache_size(3)  # a role's device copy, and the CPU reference while it runs
    sz = SIZES[a.size]
    device = runtime.task_device("auto")
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    budget = a.budget_s if a.budget_s is not None else 420.0 if a.size == "paper" else math.inf
    run = Run(sz, device, a.out, started, budget)
    if sz.threads:
        torch.set_num_threads(sz.threads)
    chains = load_chains()
    if sz.chains is not None:
        chains = balanced(chains, sz.chains)
    official = balanced(chains, sz.official_chains)
    check = balanced(chains, sz.check_chains)
    toks, ids = tokenizers_for(chains, sz.vocab)
    words = sum(len(t.split()) for t in corpus(chains))
    run.results.update({
        "size": a.size, "device": name, "udf_device": device, "torch": torch.__version__,
        "transformers": transformers.__version__, "cpu_threads": torch.get_num_threads(),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)), "bf16_peak_flops": bf16_peak(name),
        "settings": {"batch_size": sz.batch_size, "max_batch_tokens": sz.max_batch_tokens, "nli_max_length": 512,
                     "new_tokens": sz.new_tokens, "repeats": sz.repeats},
        "tokenizer": {"vocab": toks["causal"].vocab_size,
                      "tokens_per_word": sum(len(toks["causal"](t)["input_ids"]) for t in corpus(chains)) / words},
        "workload": {"chains": len(chains), "steps": sum(len(c.conclusions) for c in chains),
                     "official_chains": len(official), "check_chains": len(check)},
        "models": {}, "roles": {},
    })  # fmt: skip
    print(f"[gpu_path] {a.size} on {name} (UDFs pick {device}); {len(chains)} chains", flush=True)
    configs = model_configs(a.size, ids)
    folders = {}
    for seed, (role, config) in enumerate(configs.items()):
        t0 = time.time()
        folder = a.work / a.size / role
        counts = build_model(role, config, toks[FAMILY[role]], folder, device, seed)
        run.results["models"][role] = {"shape": SHAPE[role], "family": FAMILY[role], **counts,
                                       "build_s": round(time.time() - t0, 1)}  # fmt: skip
        folders[role] = str(folder)
        print(f"[gpu_path] built {role} ({SHAPE[role]}): {counts['parameters'] / 1e6:.1f}M", flush=True)
    run.save()
    plan: list[tuple[str, Callable[[], dict]]] = [
        ("nli", lambda: nli_role(run, folders["nli"], chains, official, check)),
        *[(role, lambda role=role: loglik_role(run, role, folders[role], chains, official, check))
          for role in ("pvi_g", "pvi_null", "info_gain", "info_gain_small")],
        ("options seq2seq", lambda: options_role(run, "pvi_g", folders["pvi_g"], chains, official, check)),
        ("options causal", lambda: options_role(run, "info_gain_small", folders["info_gain_small"], chains, official,
                                                check)),
        ("generate causal", lambda: generation_role(run, "generator", folders["generator"], chains)),
        ("generate seq2seq", lambda: generation_role(run, "pvi_g", folders["pvi_g"], chains)),
    ]  # fmt: skip
    for key, part in plan:
        t0 = time.time()
        try:
            run.results["roles"][key] = part()
        except Exception as err:  # one run on a lent machine: a failing part is a finding, the others still run
            import traceback

            run.results["roles"][key] = {"error": f"{type(err).__name__}: {err}"[:2000],
                                         "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
            runtime.clear_cache()
            free()
        run.results["roles"][key]["seconds"] = round(time.time() - t0, 1)
        summarise(run)
        run.save()
        print(f"[gpu_path] {key}: {time.time() - t0:.1f}s {run.results['roles'][key].get('error', '')}", flush=True)
    if not a.no_sweep and not run.over_budget():
        try:
            run.results["sweep_bf16_b_s"] = sweep(run, folders, chains)
        except Exception as err:
            run.results["sweep_bf16_b_s"] = {"error": f"{type(err).__name__}: {err}"[:2000]}
    summarise(run)
    run.save()
    print(json.dumps({k: run.results[k] for k in ("chain_scoring", "gpu_vs_cpu_max_rel", "fp32_equal_to_cpu", "seconds")},
                     indent=1, default=float))  # fmt: skip
    return run.results


if __name__ == "__main__":
    main()
