"""Batched text generation for causal and seq2seq LMs (plain torch / transformers; Spark UDF at the end).

- Prompts from many questions share a batch: sorted by length (longest first) and cut into batches of at most
  `batch_size` rows and `max_tokens` positions (rows x (longest prompt + max_new_tokens)), the KV cache held by
  `model.generate`. Decoder-only prompts are left-padded so every row's next token sits in the last column;
  prompts longer than the room left for `max_new_tokens` (in `max_length` and in the model's own context) are
  cut from the left and flagged `truncated`.
- `min_new_tokens` keeps EOS away until that many tokens exist (the CoT Collection's >= 8-token rationale).
- A row ends at any of the model's end tokens (`stop_token_ids`: the generation config's, the tokenizer's, and a
  chat model's end-of-turn token) or, never before `min_new_tokens`, once its new text holds a stop string (after
  the first check only the last tokens are decoded: a new stop string can only be there).
- Greedy by default. Sampling draws every row from its own generator, seeded from (seed, prompt, sample index):
  a row's text depends on its prompt and seed only, not on which rows share its batch, so the same seed and data
  give the same chains on any partitioning and batch size (up to float noise in the logits). Greedy rows and
  sampled rows can share one batch (`samples`). Temperature, top-k and top-p are transformers' logits warpers;
  the draw from what they leave is ours, one generator per row, over the vector the sampler drew from before
  the warpers were transformers' (`draw_token`), so a seed still draws the chains it drew then.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from udfs.loglik import causal_ids, causal_prefix, cut_left, pad_id, position_limit
from udfs.model_udf import model_udf, narrowed
from udfs.runtime import length_batches

# End-of-turn tokens of common chat templates. Qwen2.5 ends an assistant turn with <|im_end|> and its base text
# with <|endoftext|>, and its generation config lists only one of them; Gemma ends a turn with <end_of_turn>.
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|end|>")
# Nucleus sampling looks at the top TOP_P_WINDOW tokens first and sorts the whole vocabulary only for a row whose
# nucleus is wider: the same distribution as a full sort, without sorting 152k logits per row and step (which
# transformers' TopPLogitsWarper does on whatever it is given: here a window, see nucleus_size).
TOP_P_WINDOW = 256
# A stop string that was not in a row's text a step earlier lies in its last 2 x (the stop string's UTF-8 bytes) +
# STOP_TAIL_MARGIN tokens that are not special tokens (_StopAfter). Every such token decodes to at least one
# byte, so the tokens an occurrence spans are its bytes' and at most one space per character that
# clean_up_tokenization_spaces removes before punctuation (2 x bytes). It ends in what the new token changed: the
# token's text and at most 3 bytes before it (an incomplete UTF-8 character completed) or a cleaned space, so at
# most 4 tokens follow it; and a tail decoded alone differs from the end of the whole text only in its first
# tokens (U+FFFD for a character cut there: at most 3 bytes; a leading space a SentencePiece decoder drops; a
# WordPiece "##"): 4 more. 16 is twice those 8.
STOP_TAIL_MARGIN = 16


@dataclass(frozen=True)
class Generation:
    text: str  # the new text, special tokens removed
    n_tokens: int  # new tokens before EOS/padding
    truncated: bool


class _StopAfter:
    """Stopping criterion: a row is done when its new text holds a stop string and it has >= `min_new` tokens.

    The first check (at `min_new` tokens) decodes each row's new text. Every later one decodes only the row's
    last tokens, where a stop string that was not in the text a step earlier must lie (STOP_TAIL_MARGIN), and the
    whole text only to confirm a stop string found there (a tail decoded alone can start with a stray character),
    so a step costs the same however long the rows have grown. Rows already stopped are not decoded again.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str], start: int, min_new: int) -> None:
        self.tokenizer, self.stops, self.start, self.min_new = tokenizer, list(stops), start, min_new
        self.done: torch.Tensor | None = None
        self.checked = False  # a check ran: from then on a row not done holds no stop string
        self.tail = 2 * max((len(s.encode()) for s in self.stops), default=0) + STOP_TAIL_MARGIN
        self.special = torch.tensor(sorted(set(getattr(tokenizer, "all_special_ids", None) or [])), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
        new = input_ids[:, self.start :]
        if self.done is None:
            self.done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if new.shape[1] < self.min_new:
            return self.done.clone()
        starts = self.tail_starts(new) if self.checked else [0] * new.shape[0]
        for i in (~self.done).nonzero().flatten().tolist():
            self.done[i] = self.holds_stop(new[i, starts[i] :]) and (starts[i] == 0 or self.holds_stop(new[i]))
        self.checked = True
        return self.done.clone()

    def holds_stop(self, ids: torch.Tensor) -> bool:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return any(s in text for s in self.stops)

    def tail_starts(self, new: torch.Tensor) -> list[int]:
        """Per row, where its last `self.tail` tokens that are not special tokens begin (0: it has fewer).
        Special tokens decode to nothing (skip_special_tokens), so they are passed over, not counted."""
        shown = ~torch.isin(new.cpu(), self.special)
        after = shown.flip(1).cumsum(1).flip(1)  # tokens shown from each position to the end
        return (after > self.tail).sum(1).tolist()


class RowSampler:
    """Logits processor that samples each row from its own torch.Generator (None: the row stays greedy).

    It runs after transformers' own processors (no-repeat-ngram, min-new-tokens) with do_sample=False, and
    returns logits that are -inf everywhere but the drawn token, so generate's argmax takes the draw. The
    warping is transformers' (see `draw_token`); only the draw is done here, row by row, because generate's own
    sampling draws the whole batch from one generator, and a row's text would then depend on its batch.
    """

    def __init__(self, generators: Sequence[torch.Generator | None], temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int | None = None) -> None:  # fmt: skip
        self.generators, self.temperature, self.top_p, self.top_k = list(generators), temperature, top_p, top_k

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        rows = [row for row, gen in enumerate(self.generators) if gen is not None]
        if not rows:
            return out
        # The generators are CPU generators, so the sampled rows' logits are drawn from on the CPU (one copy from
        # an accelerator; none on a CPU run).
        logits = scores[rows].float().cpu()
        for k, row in enumerate(rows):
            pick = draw_token(logits[k], self.generators[row], self.temperature, self.top_p, self.top_k)
            out[row].fill_(float("-inf"))
            out[row, pick] = 0.0
        return out


def draw_token(logits: torch.Tensor, gen: torch.Generator, temperature: float = 1.0, top_p: float = 1.0,
               top_k: int | None = None) -> int:  # fmt: skip
    """One token drawn from softmax(logits / temperature), restricted to the top-k, then to the top-p nucleus
    (the most likely tokens while the mass before them is below top_p; the first always stays): transformers'
    TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper, in the order generate applies them.

    The draw is torch.multinomial's, which draws one exponential variate per entry of the vector it is given:
    the token it picks depends on that vector's length and order, not only on the probabilities. So that a seed
    keeps drawing the chains it drew before the warping was transformers', the vector is the one drawn from
    then: the top-k in torch.topk's order; for top-p alone the TOP_P_WINDOW most likely tokens, most likely
    first (or all of them by argsort when the nucleus is wider than the window); else the whole vocabulary in
    its own order; tokens outside the nucleus stay in it with probability 0.
    """
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

    scores = TemperatureLogitsWarper(float(temperature))(None, logits[None])[0]
    vocab = scores.shape[-1]
    order = None
    if top_k is not None and 0 < top_k < vocab:
        # TopKLogitsWarper keeps the k most likely tokens; torch.topk gives them in the draw's order. A token tied
        # with the k-th, which the warper also keeps, stays out of the draw, as before.
        order = torch.topk(scores, top_k).indices
        kept = TopKLogitsWarper(top_k)(None, scores[None])[0, order]
        probs, share = torch.softmax(kept, -1), 1.0
    elif top_p < 1.0:
        everything = torch.softmax(scores, -1)
        window, order = torch.topk(everything, min(TOP_P_WINDOW, vocab))
        share = float(window.sum())
        if share < top_p:  # the nucleus is wider than the window: sort everything
            order, share = torch.argsort(everything, descending=True), 1.0
        kept, probs = scores[order], everything[order]
    else:
        probs = torch.softmax(scores, -1)
    if top_p < 1.0:
        nucleus = nucleus_size(kept, top_p / share)
        probs[nucleus:] = 0.0  # probs is a fresh tensor here (a softmax or a gather)
        probs = probs / probs.sum()
    pick = torch.multinomial(probs, 1, generator=gen)
    return int(order[pick] if order is not None else pick)


def nucleus_size(ranked: torch.Tensor, top_p: float) -> int:
    """How many of `ranked` (logits, most likely first) transformers' TopPLogitsWarper keeps at `top_p`.

    `ranked` is all the tokens with any mass left, or the top of the vocabulary holding a `share` of its mass
    that covers top_p; the warper normalises over what it is given, so the caller passes top_p / share: the
    mass before a token is below top_p exactly when its share of the window's is below top_p / share. The
    warper tells how many tokens stay, the draw keeps the first that many: among tokens tied at the nucleus's
    edge it keeps the first in `ranked` (the warper's sort is not stable and would keep any of them).
    """
    from transformers.generation.logits_process import TopPLogitsWarper

    warped = TopPLogitsWarper(min(top_p, 1.0))(None, ranked[None])
    return int(torch.isfinite(warped).sum())


def row_seed(seed: int, prompt: str, sample: int) -> int:
    """The generator seed of one sampled row: its prompt, its sample index and the configured seed."""
    return (seed * 1_000_003 + zlib.crc32(f"{sample}\x1e{prompt}".encode())) % (2**63)


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every token that ends a row: the generation config's EOS (one or a list), the tokenizer's, and the
    end-of-turn tokens of END_OF_TURN the tokenizer knows as special tokens."""
    found: list[int] = []
    for value in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        found += value if isinstance(value, list) else [value] if value is not None else []
    special = set(getattr(tokenizer, "all_special_tokens", []) or []) | set(
        getattr(tokenizer, "added_tokens_encoder", {}) or {})  # fmt: skip
    for token in END_OF_TURN:
        if token in special:
            tid = tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None):
                found.append(tid)
    return list(dict.fromkeys(int(t) for t in found))


def _prompt_ids(tokenizer: Any, family: str, prompts: Sequence[str], room: int) -> tuple[list[list[int]], list[bool]]:
    causal = family == "causal"
    prefix = causal_prefix(tokenizer) if causal else []
    ids = causal_ids(tokenizer, prompts, prefix) if causal else tokenizer(list(prompts))["input_ids"]
    out, cut = [], []
    for seq in ids:
        seq = list(seq)
        if causal and not seq:
            seq = [tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id]
        cut.append(len(seq) > room)
        out.append(cut_left(seq, room, prefix))
    return out, cut


def prompt_room(model: Any, tokenizer: Any, family: str, max_length: int, max_new_tokens: int) -> int:
    """Tokens a prompt may keep: a causal LM's prompt and new tokens share `max_length` and the model's own
    context (position embeddings); an encoder has `max_length` (and its own limit) to itself."""
    limit = position_limit(model, tokenizer) if family == "causal" else None
    window = min(max_length, limit) if limit else max_length
    return max(1, window - max_new_tokens) if family == "causal" else max_length


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
    max_tokens: int | None = None,
    samples: Sequence[int | None] | None = None,
    top_k: int | None = None,
) -> list[Generation]:
    """New text for every prompt, in input order (batches are formed by length, then put back).

    `max_tokens` caps a batch's positions, rows x (longest prompt + max_new_tokens) (None: `batch_size` only).
    `samples` gives each row its sample index (None: that row is greedy); without it every row is sampled as
    sample 0 when `do_sample`, else greedy. The k samples of a question are k rows with the same prompt and
    indices 0..k-1, in any batch.
    `no_repeat_ngram_size` bans repeating any n-gram (the CoT Collection uses 3; transformers counts the decoder's
    sequence, which for a causal LM includes the prompt);
    `clean_up_spaces` is passed to decode as clean_up_tokenization_spaces (None: the tokenizer's default; the
    official CoT evaluation decodes with True).
    """
    from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

    if family not in ("causal", "seq2seq"):
        raise ValueError(f"family must be causal or seq2seq, got {family!r}")
    if samples is not None and len(samples) != len(prompts):
        raise ValueError(f"{len(samples)} sample indices for {len(prompts)} prompts")
    ids, cut = _prompt_ids(tokenizer, family, prompts, prompt_room(model, tokenizer, family, max_length, max_new_tokens))
    if samples is None:
        samples = [0 if do_sample else None] * len(prompts)
    pad = pad_id(tokenizer)
    eos = stop_token_ids(model, tokenizer)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens or None,
        do_sample=False,  # sampled rows draw in RowSampler, each from its own generator
        top_p=None,
        temperature=None,
        top_k=None,
        num_beams=1,
        no_repeat_ngram_size=no_repeat_ngram_size or None,
        pad_token_id=pad,
        eos_token_id=eos,
        decoder_start_token_id=model.config.decoder_start_token_id if family == "seq2seq" else None,
    )
    results: list[Generation | None] = [None] * len(prompts)
    new_len = max_new_tokens if family == "causal" else 0  # an encoder's rows do not grow
    for group in length_batches([len(s) + new_len for s in ids], batch_size, max_tokens=max_tokens):
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
        processors = LogitsProcessorList()
        gens = [None if samples[i] is None else torch.Generator().manual_seed(row_seed(seed, prompts[i], samples[i]))
                for i in group]  # fmt: skip
        if any(g is not None for g in gens):
            processors.append(RowSampler(gens, temperature, top_p, top_k))
        out = model.generate(
            input_ids=batch.to(device),
            attention_mask=mask.to(device),
            generation_config=config,
            stopping_criteria=criteria,
            logits_processor=processors,
        )
        new = out[:, new_start:].cpu()
        for b, i in enumerate(group):
            row = new[b].tolist()
            n = len(row)
            for k, tok in enumerate(row):  # generation ends at the first end token; pads follow it
                if tok in eos:
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
