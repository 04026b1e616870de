"""Option scoring with a shared prompt: (prompt, prefix, options) -> log-likelihood of every option (plain torch).

Every option of an example continues the same prompt, so the prompt is encoded once per example and reused:
- encoder-decoder: the encoder runs once per prompt, and so does the projection of its output to every decoder
  layer's cross-attention keys/values; each option row reads them, the decoder reads `prefix + option` and
  only the option tokens are scored;
- decoder-only: `prompt + prefix` runs once and every option row after it, in one packed pass per example
  (`udfs.loglik.logprob_sums` with one prefix group per example, the same code that scores a chain's L(k)).
Numbers equal `udfs.loglik.score` on (prompt + prefix, option) pairs (same tokenisation: source and target
encoded separately, EOS not scored) whenever nothing is truncated. Two protocol switches change the option tokens:
- `eos` (seq2seq): the option is encoded with the tokenizer's special tokens, so T5's closing `</s>` is scored
  too, as the CoT Collection's evaluation does (`batch_encode_plus` default). It matters when one option is a
  token prefix of another: without EOS the shorter one always scores at least as high (the longer only adds
  negative terms), so the longer can never win; with EOS the shorter pays log p(</s>) for stopping there.
- `move_space` (causal): trailing whitespace of the context moves to the front of every option, as
  lm-evaluation-harness's `_encode_pair` does, so "[ANSWER] " + "A" is scored as the token " A".
Under truncation the shared prompt is cut from the left to fit the LONGEST option, so all options of an example
see the same context.

The Spark side (`options_udf`) takes exploded (prompt, prefix, option) rows sorted by example and scores the
rows of one example together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from udfs.loglik import _start_id, causal_ids, causal_prefix, cut_left, logprob_sums, pad_id
from udfs.loglik import score as loglik_score
from udfs.loglik_batches import IGNORE, Encoded, decoder_start_id, token_logprobs
from udfs.model_udf import model_udf, narrowed
from udfs.prefix_sharing import PrefixGroup, select_cache
from udfs.runtime import length_batches


@dataclass(frozen=True)
class OptionScore:
    sum_logprob: float
    n_tokens: int
    n_bytes: int
    truncated: bool = False

    # An empty option has log-probability 0 however it is normalised (never NaN, which sorts above all).
    @property
    def per_token(self) -> float:
        return self.sum_logprob / self.n_tokens if self.n_tokens else 0.0

    @property
    def per_byte(self) -> float:
        return self.sum_logprob / self.n_bytes if self.n_bytes else 0.0


def _n_bytes(text: str) -> int:
    return len(text.encode("utf-8"))


@dataclass
class _Example:
    context: list[int]  # causal: prompt + prefix; seq2seq: encoder ids
    prefix: list[int]  # seq2seq decoder prefix (empty for causal)
    options: list[list[int]]
    truncated: bool


def _split_space(context: str) -> tuple[str, str]:
    """(context without its trailing whitespace, that whitespace): lm-evaluation-harness's _encode_pair rule."""
    kept = context.rstrip()
    return kept, context[len(kept) :]


def _encode(
    tokenizer: Any, family: str, prompts: Sequence[str], prefixes: Sequence[str], options: Sequence[Sequence[str]],
    max_length: int, eos: bool = False, move_space: bool = False,
) -> list[_Example]:  # fmt: skip
    if family == "causal" and move_space:
        split = [_split_space(p + x) for p, x in zip(prompts, prefixes, strict=True)]
        contexts = [c for c, _ in split]
        flat = [space + o for (_, space), opts in zip(split, options, strict=True) for o in opts]
    else:
        contexts = [p + x for p, x in zip(prompts, prefixes, strict=True)]
        flat = [o for opts in options for o in opts]
    # Seq2seq with `eos`: the tokenizer's own special tokens (T5 appends </s>), as the official code encodes options.
    special = family == "seq2seq" and eos
    opt_ids = tokenizer(flat, add_special_tokens=special)["input_ids"] if flat else []
    keep = causal_prefix(tokenizer) if family == "causal" else []
    if family == "causal":
        ctx_ids = causal_ids(tokenizer, contexts, keep)
        pre_ids: list[list[int]] = [[] for _ in prompts]
    else:
        ctx_ids = tokenizer(list(prompts), add_special_tokens=True)["input_ids"]
        pre_ids = tokenizer(list(prefixes), add_special_tokens=False)["input_ids"] if any(prefixes) else [
            [] for _ in prompts
        ]
    out: list[_Example] = []
    cursor = 0
    for i, opts in enumerate(options):
        ids = [list(t) for t in opt_ids[cursor : cursor + len(opts)]]
        cursor += len(opts)
        ctx, pre, cut = list(ctx_ids[i]), list(pre_ids[i]), False
        if family == "causal":
            if not ctx:
                ctx = [_start_id(tokenizer)]
            cap = max_length - 1
            if any(len(t) > cap for t in ids):
                ids, cut = [t[:cap] for t in ids], True
            room = max_length - max((len(t) for t in ids), default=0)
            if len(ctx) > room:
                ctx, cut = cut_left(ctx, room, keep), True
        else:
            if len(ctx) > max_length:
                ctx, cut = ctx[len(ctx) - max_length :], True
            if any(len(t) > max_length for t in ids):
                ids, cut = [t[:max_length] for t in ids], True
            room = max_length - max((len(t) for t in ids), default=0)
            if len(pre) > room:
                pre, cut = pre[len(pre) - room :], True
        out.append(_Example(ctx, pre, ids, cut))
    return out


def _causal(
    model: Any, tokenizer: Any, examples: list[_Example], batch_size: int, device: str, max_tokens: int | None = None
) -> list[list[float]]:
    """Each example's context runs once and every option after it, in one packed pass (udfs.loglik)."""
    encoded: list[Encoded] = []
    groups: list[PrefixGroup] = []
    owner: list[tuple[int, int]] = []
    for x, e in enumerate(examples):
        rows = []
        for k, option in enumerate(e.options):
            rows.append((len(encoded), len(e.context) - 1))
            encoded.append(Encoded(e.context, option, e.truncated))
            owner.append((x, k))
        if len(e.context) > 1 and rows:  # a one-token context has nothing to share
            groups.append(PrefixGroup(e.context[:-1], rows))
    sums = logprob_sums(
        model, "causal", encoded, pad_id(tokenizer), batch_size, device, "left", groups=groups, max_tokens=max_tokens
    )
    out: list[list[float]] = [[0.0] * len(e.options) for e in examples]
    for i, (x, k) in enumerate(owner):
        out[x][k] = sums[i]
    return out


def _cross_keys(model: Any, hidden: torch.Tensor, mask: torch.Tensor) -> Any:
    """A cache of every decoder layer's cross-attention keys and values over `hidden`, or None where the model
    keeps none.

    One decoder step fills them (the cache a generation step keeps); the option rows then read them instead of
    projecting the whole prompt again per option, which costs about as much as the encoder itself on BBH.
    """
    from transformers import EncoderDecoderCache
    from transformers.modeling_outputs import BaseModelOutput

    start = torch.full((hidden.shape[0], 1), decoder_start_id(model), dtype=torch.long, device=hidden.device)
    out = model(
        encoder_outputs=BaseModelOutput(last_hidden_state=hidden), attention_mask=mask, decoder_input_ids=start,
        use_cache=True,
    )
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if not isinstance(cache, EncoderDecoderCache) or not cache.is_updated or not all(cache.is_updated.values()):
        return None
    return cache.cross_attention_cache


def _rows_cache(model: Any, cross: Any, index: torch.Tensor) -> Any:
    """A fresh cache for option rows `index`: empty self-attention, their prompts' cross-attention keys/values."""
    from transformers import DynamicCache, EncoderDecoderCache

    return EncoderDecoderCache(DynamicCache(config=model.config), select_cache(cross, index, model.config))


@torch.inference_mode()
def _seq2seq(
    model: Any, tokenizer: Any, examples: list[_Example], batch_size: int, device: str, max_tokens: int | None = None
) -> list[list[float]]:
    from transformers.modeling_outputs import BaseModelOutput

    from udfs.loglik_batches import _decoder_inputs

    pad = pad_id(tokenizer)
    sums: list[list[float]] = [[0.0] * len(e.options) for e in examples]
    encoder = model.get_encoder()
    for group in length_batches([len(e.context) for e in examples], batch_size, max_tokens=max_tokens):
        width = max(len(examples[i].context) for i in group)
        ids = torch.full((len(group), width), pad, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for b, i in enumerate(group):
            ctx = examples[i].context
            ids[b, : len(ctx)] = torch.tensor(ctx)
            mask[b, : len(ctx)] = 1
        ids, mask = ids.to(device), mask.to(device)
        hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state  # once per prompt
        rows = [(b, k) for b, i in enumerate(group) for k, t in enumerate(examples[i].options) if t]
        cross = _cross_keys(model, hidden, mask) if rows else None  # once per prompt too
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            seqs = [(examples[group[b]].prefix, examples[group[b]].options[k]) for b, k in chunk]
            t_width = max(len(p) + len(t) for p, t in seqs)
            labels = torch.full((len(chunk), t_width), IGNORE, dtype=torch.long)
            scored = torch.zeros((len(chunk), t_width), dtype=torch.bool)
            for r, (p, t) in enumerate(seqs):
                labels[r, : len(p) + len(t)] = torch.tensor(p + t)
                scored[r, len(p) : len(p) + len(t)] = True  # the prefix conditions, only the option counts
            index = torch.tensor([b for b, _ in chunk], device=device)
            labels = labels.to(device)
            reuse = {"cache": _rows_cache(model, cross, index), "use_cache": True} if cross is not None else {"use_cache": False}
            out = model(
                encoder_outputs=BaseModelOutput(last_hidden_state=hidden.index_select(0, index)),
                attention_mask=mask.index_select(0, index),
                decoder_input_ids=_decoder_inputs(model, labels),
                **reuse,
            )
            logp = token_logprobs(out.logits, labels, scored.to(device)).sum(-1).double().cpu().tolist()
            for (b, k), total in zip(chunk, logp, strict=True):
                sums[group[b]][k] = total
    return sums


def score_options(
    model: Any,
    tokenizer: Any,
    family: str,
    prompts: Sequence[str],
    options: Sequence[Sequence[str]],
    prefixes: Sequence[str] | None = None,
    batch_size: int = 32,
    max_length: int = 512,
    device: str = "cpu",
    max_tokens: int | None = None,
    eos: bool = False,
    move_space: bool = False,
) -> list[list[OptionScore]]:
    """Log-likelihood of every option of every example, the prompt encoded once per example.

    `eos` (seq2seq) scores the tokenizer's closing token after each option; `move_space` (causal) moves the
    context's trailing whitespace into each option (module docstring). `n_bytes` counts the option text as given.

    `max_tokens` caps each batch at rows x longest row positions (runtime.max_batch_tokens; see loglik).

    `prefixes` (CoT: rationale + "\\n[ANSWER] ") sit between prompt and option: appended to the context of a
    causal LM, the decoder's first tokens for a seq2seq model; they condition but are not scored.
    Examples may have different numbers of options. Results come back in input order.
    """
    if family not in ("causal", "seq2seq"):
        raise ValueError(f"family must be causal or seq2seq, got {family!r}")
    if len(prompts) != len(options):
        raise ValueError(f"{len(prompts)} prompts but {len(options)} option lists")
    prefixes = list(prefixes) if prefixes is not None else [""] * len(prompts)
    examples = _encode(tokenizer, family, prompts, prefixes, options, max_length, eos, move_space)
    run = _causal if family == "causal" else _seq2seq
    sums = run(model, tokenizer, examples, batch_size, device, max_tokens)
    return [
        [
            OptionScore(sums[i][k] if e.options[k] else 0.0, len(e.options[k]), _n_bytes(options[i][k]), e.truncated)
            for k in range(len(e.options))
        ]
        for i, e in enumerate(examples)
    ]


def score_options_separately(
    model: Any,
    tokenizer: Any,
    family: str,
    prompts: Sequence[str],
    options: Sequence[Sequence[str]],
    prefixes: Sequence[str] | None = None,
    batch_size: int = 32,
    max_length: int = 512,
    device: str = "cpu",
    max_tokens: int | None = None,
) -> list[list[OptionScore]]:
    """Every (prompt + prefix, option) pair scored on its own by `udfs.loglik.score` (no sharing).

    The reference the shared path must equal; for seq2seq it supports only empty prefixes (loglik has no
    decoder prefix).
    """
    prefixes = list(prefixes) if prefixes is not None else [""] * len(prompts)
    if family == "seq2seq" and any(prefixes):
        raise ValueError("seq2seq separate scoring has no decoder prefix; use score_options")
    sources = [p + x for p, x, opts in zip(prompts, prefixes, options, strict=True) for _ in opts]
    targets = [o for opts in options for o in opts]
    side = "left" if family == "causal" else "right"
    flat = loglik_score(model, tokenizer, family, sources, targets, batch_size, max_length, device, side, max_tokens=max_tokens)
    out, cursor = [], 0
    for opts in options:
        part = flat[cursor : cursor + len(opts)]
        cursor += len(opts)
        out.append([OptionScore(s.sum_logprob, s.n_tokens, _n_bytes(o), s.truncated) for s, o in zip(part, opts, strict=True)])
    return out


# --- Spark -------------------------------------------------------------------------------------------------

UDF_FIELDS = "sum_logprob double, n_tokens int, n_bytes int, truncated boolean, error string"
_COLUMNS = ["sum_logprob", "n_tokens", "n_bytes", "truncated", "error"]

OptionScoreFn = Callable[[Sequence[str], Sequence[Sequence[str]], Sequence[str]], list[list[OptionScore]]]


def model_options_factory(
    path: str,
    family: str,
    device: str = "auto",
    dtype: str = "auto",
    revision: str | None = None,
    batch_size: int = 32,
    max_length: int = 512,
    torch_threads: int | None = None,
    trust_remote_code: bool = False,
    share_prompt: bool = True,
    max_tokens: int | None = None,
    eos: bool = False,
    move_space: bool = False,
    cache_size: int | None = None,
) -> Callable[[], OptionScoreFn]:
    """Picklable factory: on the executor, load the model once per worker and return an option scorer."""

    def factory() -> OptionScoreFn:
        from udfs import runtime

        model, tok, dev = runtime.task_model(
            path, family, device, dtype, revision, torch_threads, trust_remote_code, cache_size
        )
        if not share_prompt and (eos or move_space):
            raise ValueError("share_prompt=false scores through udfs.loglik, which has no eos/move_space switch")

        def scorer(prompts, options, prefixes):
            if not share_prompt:
                return score_options_separately(
                    model, tok, family, prompts, options, prefixes, batch_size, max_length, dev, max_tokens
                )
            return score_options(
                model, tok, family, prompts, options, prefixes, batch_size, max_length, dev, max_tokens, eos, move_space
            )

        return scorer

    return factory


def group_rows(prompts: Sequence[str], prefixes: Sequence[str]) -> list[tuple[int, int]]:
    """[start, end) runs of consecutive rows sharing (prompt, prefix): the options of one example."""
    runs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(prompts) + 1):
        if i == len(prompts) or prompts[i] != prompts[start] or prefixes[i] != prefixes[start]:
            runs.append((start, i))
            start = i
    return runs if prompts else []


def score_rows(
    scorer: OptionScoreFn, prompts: Sequence[str], prefixes: Sequence[str], options: Sequence[str], on_error: str
) -> pd.DataFrame:
    """One output row per input (prompt, prefix, option) row; consecutive rows of one example share the prompt.

    The unit of the model-UDF error policy (udfs.model_udf) is the example: a failing one flags all its rows.
    """
    runs = group_rows(prompts, prefixes)

    def call(chosen: list[int]) -> list[list[OptionScore]]:
        picked = [runs[r] for r in chosen]
        return scorer(
            [prompts[s] for s, _ in picked], [list(options[s:e]) for s, e in picked], [prefixes[s] for s, _ in picked]
        )

    scored, errors = narrowed(call, len(runs), on_error, "option scoring", lambda r: prompts[runs[r][0]], "examples")
    rows: list[dict] = []
    for (start, end), scores, error in zip(runs, scored, errors, strict=True):
        if scores is None:
            rows += [{"sum_logprob": None, "n_tokens": None, "n_bytes": None, "truncated": None, "error": error}
                     for _ in range(end - start)]  # fmt: skip
        else:
            rows += [{"sum_logprob": s.sum_logprob, "n_tokens": s.n_tokens, "n_bytes": s.n_bytes,
                      "truncated": s.truncated, "error": None} for s in scores]  # fmt: skip
    out = pd.DataFrame(rows, columns=_COLUMNS)
    return out.astype({"n_tokens": "Int32", "n_bytes": "Int32", "truncated": "boolean"})


def options_udf(factory: Callable[[], OptionScoreFn], on_error: str = "fail"):
    """Iterator pandas UDF over (prompt, prefix, option) -> struct; build once and reuse.

    Rows must arrive sorted so that an example's options are consecutive (the job sorts within partitions);
    an example split across two Arrow batches is still scored correctly, its prompt just runs twice.
    """

    def frame(scorer: OptionScoreFn, prompts: list[str], prefixes: list[str], options: list[str]) -> pd.DataFrame:
        return score_rows(scorer, prompts, prefixes, options, on_error)

    return model_udf("option_scores", UDF_FIELDS, factory, frame, 3)
