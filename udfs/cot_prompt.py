"""CoT Collection prompts as the official code builds them: source -> (truncated, round-tripped source) + suffix.

kaistAI/CoT-Collection `Datasets_end2end.py` (`convert_to_features`): the source is stripped, encoded with the
tokenizer's special tokens to at most `input_length - len(suffix tokens)` tokens (cut from the RIGHT: the start
of the source is kept), decoded with `skip_special_tokens=True`, and the suffix (`"\\n[ANSWER] "` or the CoT
trigger) appended. The round trip is not an identity for every tokenizer (T5's SentencePiece folds newlines
and runs of spaces into one space), so the model sees the round-tripped text; this module reproduces it.
Plain Python with a tokenizer; the Spark UDF is at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pandas as pd


def official_prompts(tokenizer: Any, sources: Sequence[str], suffix: str, input_length: int) -> list[tuple[str, bool]]:
    """[(prompt, truncated)]: each source stripped, cut to fit `input_length` with the suffix, decoded, + suffix."""
    room = max(1, input_length - len(tokenizer.encode(suffix, add_special_tokens=False)))
    out: list[tuple[str, bool]] = []
    for source in sources:
        stripped = source.strip()
        full = tokenizer.encode(stripped)
        ids = tokenizer.encode(stripped, max_length=room, truncation=True)
        # clean_up_tokenization_spaces=True: the default of the transformers the official code ran with.
        text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True)
        out.append((text + suffix, len(full) > len(ids)))
    return out


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer: Any, user: str, opening: str) -> str:
    """The chat template's text for one user turn, the assistant turn opened (generation prompt) and begun with
    `opening`: what the model continues."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)
    return text + opening


def chat_prompts(tokenizer: Any, sources: Sequence[str], suffix: str, input_length: int) -> list[tuple[str, bool]]:
    """[(prompt, truncated)]: each stripped source as the user turn of the chat template, the suffix without its
    leading newlines opening the assistant turn. A source that would make the prompt longer than `input_length`
    tokens is cut from the right, as the official source handling cuts (the start of the source is kept)."""
    opening = suffix.lstrip("\n")
    frame = len(tokenizer.encode(render_chat(tokenizer, "", opening), add_special_tokens=False))
    room = max(1, input_length - frame)
    out: list[tuple[str, bool]] = []
    for source in sources:
        ids = tokenizer.encode(source.strip(), add_special_tokens=False)
        user = tokenizer.decode(ids[:room], skip_special_tokens=True) if len(ids) > room else source.strip()
        out.append((render_chat(tokenizer, user, opening), len(ids) > room))
    return out


def build_prompts(tokenizer: Any, sources: Sequence[str], suffix: str, input_length: int, chat: bool = False,
                  roundtrip: bool = True) -> list[tuple[str, bool]]:  # fmt: skip
    """The prompts of the configured protocol: the chat template when asked and the tokenizer has one, else the
    official round trip, else source + suffix (cut later, from the left, by the model UDFs)."""
    if chat and has_chat_template(tokenizer):
        return chat_prompts(tokenizer, sources, suffix, input_length)
    if roundtrip:
        return official_prompts(tokenizer, sources, suffix, input_length)
    return [(source + suffix, False) for source in sources]


def load_tokenizer(path: str, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    from udfs.runtime import quiet, resolve_model_path

    quiet()
    return AutoTokenizer.from_pretrained(resolve_model_path(path), trust_remote_code=trust_remote_code)


def prompt_udf(path: str, suffix: str, input_length: int, trust_remote_code: bool = False, chat: bool = False,
               roundtrip: bool = True) -> Callable[..., Any]:  # fmt: skip
    """Iterator pandas UDF source -> struct(prompt, truncated) by `build_prompts`; the tokenizer loads once per
    Python worker."""
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("prompt string, truncated boolean")
    def prompts(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        tokenizer = load_tokenizer(path, trust_remote_code)
        for sources in batches:
            built = build_prompts(tokenizer, sources.fillna("").tolist(), suffix, input_length, chat, roundtrip)
            yield pd.DataFrame({"prompt": [p for p, _ in built], "truncated": [t for _, t in built]})

    return prompts
