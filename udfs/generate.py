"""Batched text generation for causal and seq2seq LMs (plain torch / transformers; Spark UDF at the end).

- Decoder-only prompts are left-padded so every row's next token sits in the last column; prompts longer
  than the room left for `max_new_tokens` are cut from the left (flagged `truncated`).
- `min_new_tokens` keeps EOS away until that many tokens exist (the CoT Collection's >= 8-token rationale).
- `stop_strings` end a row once its new text contains one of them, but never before `min_new_tokens`.
- Greedy by default; sampling (`do_sample`) is seeded from the seed and the batch's prompts, so a rerun over
  the same batches draws the same text.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from udfs.loglik import pad_id
from udfs.model_udf import model_udf, narrowed


@dataclass(frozen=True)
class Generation:
    text: str  # the new text, special tokens removed
    n_tokens: int  # new tokens before EOS/padding
    truncated: bool


class _StopAfter:
    """Stopping criterion: a row is done when its new text holds a stop string and it has >= `min_new` tokens."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], start: int, min_new: int) -> None:
        self.tokenizer, self.stops, self.start, self.min_new = tokenizer, list(stops), start, min_new

    def __call__(self, input_ids: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
        new = input_ids[:, self.start :]
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if new.shape[1] < self.min_new:
            return done
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        for i, text in enumerate(texts):
            done[i] = any(s in text for s in self.stops)
        return done


def _prompt_ids(tokenizer: Any, family: str, prompts: Sequence[str], room: int) -> tuple[list[list[int]], list[bool]]:
    ids = tokenizer(list(prompts), add_special_tokens=(family == "seq2seq"))["input_ids"]
    out, cut = [], []
    for seq in ids:
        seq = list(seq)
        if family == "causal" and not seq:
            seq = [tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id]
        cut.append(len(seq) > room)
        out.append(seq[len(seq) - room :] if len(seq) > room else seq)
    return out, cut


def _seed_for(seed: int, prompts: Sequence[str]) -> int:
    return (seed * 1_000_003 + zlib.crc32("\x1e".join(prompts).encode())) % (2**31)


@torch.inference_mode()
def generate(
    model: Any,
    tokenizer: Any,
    family: str,
    prompts: Sequence[str],
    max_new_tokens: int = 64,
    min_new_tokens: int = 0,
    stop_strings: Sequence[str] = (),
    do_sample: bool = False,
    top_p: float = 1.0,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 8,
    max_length: int = 512,
    device: str = "cpu",
    no_repeat_ngram_size: int = 0,
    clean_up_spaces: bool | None = None,
) -> list[Generation]:
    """New text for every prompt, in input order (batches are formed by length, then put back).

    `no_repeat_ngram_size` bans repeating any n-gram (the CoT Collection uses 3; transformers counts the decoder's
    sequence, which for a causal LM includes the prompt);
    `clean_up_spaces` is passed to decode as clean_up_tokenization_spaces (None: the tokenizer's default; the
    official CoT evaluation decodes with True).
    """
    from transformers import GenerationConfig, StoppingCriteriaList

    if family not in ("causal", "seq2seq"):
        raise ValueError(f"family must be causal or seq2seq, got {family!r}")
    # A causal LM's prompt and new tokens share the context window; an encoder has it to itself.
    room = max(1, max_length - max_new_tokens) if family == "causal" else max_length
    ids, cut = _prompt_ids(tokenizer, family, prompts, room)
    pad = pad_id(tokenizer)
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = set(eos) if isinstance(eos, list) else {eos}
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens or None,
        do_sample=do_sample,
        top_p=top_p if do_sample else None,
        temperature=temperature if do_sample else None,
        top_k=None,
        num_beams=1,
        no_repeat_ngram_size=no_repeat_ngram_size or None,
        pad_token_id=pad,
        eos_token_id=eos,
        decoder_start_token_id=model.config.decoder_start_token_id if family == "seq2seq" else None,
    )
    results: list[Generation | None] = [None] * len(prompts)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    for start in range(0, len(order), batch_size):
        group = order[start : start + batch_size]
        width = max(len(ids[i]) for i in group)
        batch = torch.full((len(group), width), pad, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for b, i in enumerate(group):
            seq = ids[i]
            if family == "causal":  # left padding
                batch[b, width - len(seq) :] = torch.tensor(seq)
                mask[b, width - len(seq) :] = 1
            else:
                batch[b, : len(seq)] = torch.tensor(seq)
                mask[b, : len(seq)] = 1
        new_start = width if family == "causal" else 1  # seq2seq output starts with the decoder start token
        criteria = StoppingCriteriaList()
        if stop_strings:
            criteria.append(_StopAfter(tokenizer, stop_strings, new_start, min_new_tokens))
        if do_sample:
            torch.manual_seed(_seed_for(seed, [prompts[i] for i in group]))
        out = model.generate(
            input_ids=batch.to(device),
            attention_mask=mask.to(device),
            generation_config=config,
            stopping_criteria=criteria,
        )
        new = out[:, new_start:].cpu()
        for b, i in enumerate(group):
            row = new[b].tolist()
            n = len(row)
            for k, tok in enumerate(row):  # generation ends at the first EOS; pads follow it
                if tok in eos_ids:
                    n = k
                    break
            clean = {} if clean_up_spaces is None else {"clean_up_tokenization_spaces": clean_up_spaces}
            text = tokenizer.decode(row[:n], skip_special_tokens=True, **clean)
            results[i] = Generation(text, n, cut[i])
    return results  # type: ignore[return-value]


# --- Spark -------------------------------------------------------------------------------------------------

UDF_FIELDS = "text string, n_tokens int, truncated boolean, error string"
GenerateFn = Callable[[Sequence[str]], list[Generation]]


def model_generator_factory(
    path: str,
    family: str,
    device: str = "auto",
    dtype: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
    torch_threads: int | None = None,
    cache_size: int | None = None,
    **options: Any,
) -> Callable[[], GenerateFn]:
    """Picklable factory: on the executor, load the model once per worker; `options` go to `generate`."""

    def factory() -> GenerateFn:
        from udfs import runtime

        model, tok, dev = runtime.task_model(
            path, family, device, dtype, revision, torch_threads, trust_remote_code, cache_size
        )

        def run(prompts: Sequence[str]) -> list[Generation]:
            return generate(model, tok, family, prompts, device=dev, **options)

        return run

    return factory


def generate_frame(fn: GenerateFn, prompts: Sequence[str], on_error: str) -> pd.DataFrame:
    """One generation per prompt under the model-UDF error policy (udfs.model_udf); failed prompts carry `error`."""
    gens, errors = narrowed(lambda idx: fn([prompts[i] for i in idx]), len(prompts), on_error, "generation",
                            lambda i: prompts[i], "prompts")  # fmt: skip
    out = [{"text": g.text, "n_tokens": g.n_tokens, "truncated": g.truncated, "error": None} if g is not None
           else {"text": None, "n_tokens": None, "truncated": None, "error": e}
           for g, e in zip(gens, errors, strict=True)]  # fmt: skip
    frame = pd.DataFrame(out, columns=["text", "n_tokens", "truncated", "error"])
    return frame.astype({"n_tokens": "Int32", "truncated": "boolean"})


def generate_udf(factory: Callable[[], GenerateFn], on_error: str = "fail"):
    """Iterator pandas UDF prompt -> struct(text, n_tokens, truncated, error); build once and reuse."""
    return model_udf("generated", UDF_FIELDS, factory, lambda fn, prompts: generate_frame(fn, prompts, on_error), 1)
