"""A tokenizer that puts a BOS token before every text by itself, as Gemma's does (tiny-gpt2's BPE, its
`<|endoftext|>` as the BOS): the causal-LM code must read texts with it, and once only."""

from __future__ import annotations

import copy
from typing import Any


def with_bos(tokenizer: Any) -> Any:
    from tokenizers import processors

    bos = tokenizer.bos_token
    out = copy.deepcopy(tokenizer)
    out.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.bos_token_id)]
    )
    return out
