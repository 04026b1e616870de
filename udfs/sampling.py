"""k sampled chains + one greedy decode per question, answers parsed from them (the ReCEval paper's downstream
chain selection).

Plain torch/transformers on top of `udfs.generate`; the Spark UDF is at the end.
- The k samples and the greedy decode of every question go to `generate` as rows of one call: rows of many
  questions share a batch (sorted by length, up to a row count and a token budget). Each sampled row draws from
  its own generator, seeded from (seed, prompt, sample index), so a chain does not depend on which rows share
  its batch and the same settings give the same chains on any partitioning.
- The greedy decode is a greedy row and never one of the k candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from udfs.cot_text import ANSWER_RULES, boxed_answer, extract_answer, outside_code, parse_number
from udfs.generate import Generation, generate
from udfs.model_udf import model_udf, narrowed


@dataclass(frozen=True)
class Drawn:
    samples: list[Generation]  # k sampled chains, in sample order
    greedy: Generation


def prompt_for(template: str, question: str) -> str:
    return template.replace("{question}", question.strip())


def final_answer(text: str | None, indicators: Sequence[str], rule: str = "final") -> str | None:
    """The chain's answer, written plainly ("18.0" -> "18"); None when the text is empty.

    `last_number`: the last number after the last indicator (else in the whole text); the text after the indicator
    when it holds no number. `final` (what chat and code models need, the same on plain prose): the last non-empty
    `\\boxed{...}` when there is one; else `last_number` on the text outside fenced code blocks, so a "let's check
    with Python" block and the ```output the model writes itself are not read as its answer; the whole text when
    the prose holds no number and no indicator."""
    if rule not in ANSWER_RULES:
        raise ValueError(f"answer rule {rule!r}: expected one of {ANSWER_RULES}")
    if text is None:
        return None
    if rule == "final":
        boxed = boxed_answer(text)
        if boxed is not None:
            return _plain(boxed)
        prose = outside_code(text)
        if parse_number(prose) is not None or any(i in prose for i in indicators):
            text = prose
    return _plain(extract_answer(text, indicators))


def _plain(tail: str) -> str | None:
    value = parse_number(tail)
    if value is None:
        return tail or None
    return str(int(value)) if value.is_integer() else repr(value)


def gold_answer(solution: str | None, marker: str) -> str | None:
    """GSM-8K's gold answer: the text after the solution's last `marker` ("... A: 18" -> "18")."""
    if not solution or marker not in solution:
        return None
    return solution.rsplit(marker, 1)[1].strip() or None


def draw(model: Any, tokenizer: Any, family: str, prompts: Sequence[str], k: int, temperature: float,
         top_p: float, seed: int, max_new_tokens: int, max_length: int = 512, batch_size: int = 64,
         max_tokens: int | None = None, top_k: int | None = None, device: str = "cpu") -> list[Drawn]:
    """For each prompt: k seeded samples and its greedy decode, all (prompts x (k + 1) rows) in one `generate`
    call, so rows of many questions fill each batch (`batch_size`, `max_tokens`)."""
    rows = [p for p in prompts for _ in range(k + 1)]
    samples: list[int | None] = [None if j == k else j for _ in prompts for j in range(k + 1)]  # greedy last
    out = generate(model, tokenizer, family, rows, samples=samples, temperature=temperature, top_p=top_p, seed=seed,
                   max_new_tokens=max_new_tokens, max_length=max_length, batch_size=batch_size, max_tokens=max_tokens,
                   top_k=top_k, device=device)  # fmt: skip
    return [Drawn(out[q * (k + 1) : q * (k + 1) + k], out[q * (k + 1) + k]) for q in range(len(prompts))]


# --- Spark -------------------------------------------------------------------------------------------------

CHAIN_FIELDS = "sample_idx int, greedy boolean, text string, answer string, n_tokens int, truncated boolean"
UDF_FIELDS = f"chains array<struct<{CHAIN_FIELDS}>>, error string"
DrawFn = Callable[[Sequence[str]], list[Drawn]]
REPLACEMENT = "\ufffd"  # what decode writes for bytes that are not valid UTF-8


def rows_of(drawn: Drawn, indicators: Sequence[str], rule: str = "final") -> list[dict[str, Any]]:
    """The question's chains as rows: samples 0..k-1, then the greedy decode (sample_idx null, greedy true)."""
    def row(idx: int | None, g: Generation) -> dict[str, Any]:
        # A byte-level tokenizer's output cut by max_new_tokens inside a multi-byte character decodes to a trailing
        # U+FFFD: an artefact of the cut, not text. One left inside is the model's own (the job quarantines it).
        text = g.text.rstrip(REPLACEMENT)
        return {"sample_idx": idx, "greedy": idx is None, "text": text, "answer": final_answer(text, indicators, rule),
                "n_tokens": g.n_tokens, "truncated": g.truncated}  # fmt: skip

    return [row(i, g) for i, g in enumerate(drawn.samples)] + [row(None, drawn.greedy)]


def draw_frame(fn: DrawFn, prompts: Sequence[str], indicators: Sequence[str], on_error: str,
               rule: str = "final") -> pd.DataFrame:
    """A question's chains per prompt under the model-UDF error policy (udfs.model_udf)."""
    def call(idx: list[int]) -> list[list[dict[str, Any]]]:
        return [rows_of(d, indicators, rule) for d in fn([prompts[i] for i in idx])]  # a bad answer parse narrows too

    chains, errors = narrowed(call, len(prompts), on_error, "chain sampling", lambda i: prompts[i], "prompts")
    out = [{"chains": c, "error": e} for c, e in zip(chains, errors, strict=True)]
    return pd.DataFrame(out, columns=["chains", "error"])


def model_draw_factory(path: str, family: str, device: str = "auto", dtype: str = "auto", revision: str | None = None,
                       torch_threads: int | None = None, cache_size: int | None = None,
                       **options: Any) -> Callable[[], DrawFn]:
    """Picklable factory: on the executor the model loads once per worker (udfs.runtime); `options` go to `draw`."""

    def factory() -> DrawFn:
        from udfs import runtime

        model, tok, dev = runtime.task_model(path, family, device, dtype, revision, torch_threads, cache_size=cache_size)

        def run(prompts: Sequence[str]) -> list[Drawn]:
            return draw(model, tok, family, prompts, device=dev, **options)

        return run

    return factory


def draw_udf(factory: Callable[[], DrawFn], indicators: Sequence[str], on_error: str = "fail", rule: str = "final"):
    """Iterator pandas UDF prompt -> struct(chains, error); build once and reuse."""
    wanted = list(indicators)
    return model_udf("drawn", UDF_FIELDS, factory, lambda fn, prompts: draw_frame(fn, prompts, wanted, on_error, rule), 1)
