"""udfs.cot_prompt with a chat template: the source as the user turn, the suffix opening the assistant turn."""

from __future__ import annotations

import pytest

from udfs import cot_prompt as P

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture()
def tokenizers(tiny_models):
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(tiny_models["tiny-gpt2"])
    chat = AutoTokenizer.from_pretrained(tiny_models["tiny-gpt2"])
    chat.chat_template = TEMPLATE
    return plain, chat


def test_chat_prompt_renders_user_turn_and_opens_assistant_turn(tokenizers):
    _, chat = tokenizers
    cot = P.build_prompts(chat, ["  What is 2 + 2?\n"], "\n\nLet's think step by step.\n", 512, chat=True)
    assert cot == [("<|user|>What is 2 + 2?<|end|>\n<|assistant|>Let's think step by step.\n", False)]
    direct = P.build_prompts(chat, ["What is 2 + 2?"], "\n[ANSWER] ", 512, chat=True)
    assert direct == [("<|user|>What is 2 + 2?<|end|>\n<|assistant|>[ANSWER] ", False)]


def test_chat_prompt_without_template_keeps_the_official_prompt(tokenizers):
    plain, _ = tokenizers
    source = ["What is 2 + 2?"]
    assert not P.has_chat_template(plain)
    assert P.build_prompts(plain, source, "\n[ANSWER] ", 512, chat=True) == P.official_prompts(plain, source, "\n[ANSWER] ", 512)
    # chat off and no round trip: the raw source + suffix, cut later by the model UDFs.
    assert P.build_prompts(plain, source, "\n[ANSWER] ", 512, roundtrip=False) == [("What is 2 + 2?\n[ANSWER] ", False)]


def test_chat_prompt_long_source_cut_from_the_right_and_flagged(tokenizers):
    _, chat = tokenizers
    source = "Natalia sold clips to her friends. " * 40
    [(prompt, cut)] = P.build_prompts(chat, [source], "\n[ANSWER] ", 64, chat=True)
    assert cut
    assert len(chat.encode(prompt, add_special_tokens=False)) <= 64
    assert prompt.startswith("<|user|>Natalia sold clips") and prompt.endswith("<|end|>\n<|assistant|>[ANSWER] ")
    [(short, short_cut)] = P.build_prompts(chat, ["Natalia sold clips."], "\n[ANSWER] ", 64, chat=True)
    assert not short_cut
