"""Few-shot CoT prompts (an option, `cot.fewshot`): exemplar files -> (prefix, suffix) put around an example's source.

The CoT Collection paper and its official code evaluate zero-shot; this exists for parity with lm-evaluation-harness,
whose users expect its `bbh_cot_fewshot` and `mgsm_native_cot` / `mgsm_en_cot` prompts:

- BBH (Suzgun et al. 2022, `cot-prompts/<task>.txt`, shipped with the data): the file's task description and its
  three "Q: ...\\nA: Let's think step by step. ..." exemplars, verbatim (the canary header above the `-----` line
  dropped), then `"\\n\\nQ: " + input + "\\nA: Let's think step by step.\\n"` (lm-eval's bbh_cot_fewshot prompt).
- MGSM (Shi et al. 2022, `exemplars.py`): each exemplar `question + "\\n" + answer` in the language (native) or in
  English (english), joined by a blank line (lm-eval's fewshot_delimiter), then the query in the same frame:
  `question prefix + question + "\\n" + answer cue` ("Frage: ...\\nSchritt-für-Schritt-Antwort:").

Plain Python: no tokenizer, no Spark; jobs/cot/data.py reads the files, jobs/cot/evaluate.py builds the prompts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

BBH_QUERY = "Q: "
BBH_TRIGGER = "\nA: Let's think step by step.\n"
_BBH_CANARY_RULE = "\n-----\n"  # upstream files open with a canary line, then this rule
_BBH_EXEMPLAR = "\n\nQ: "
# The frame word of an MGSM exemplar: everything up to the first colon (ASCII or full-width, as in ja/zh).
_MGSM_FRAME = re.compile(r"^[^:：\n]*[:：]")


class FewshotError(ValueError):
    """An exemplar file is missing or not in the layout the few-shot prompt expects; the message names it."""


def bbh_exemplars(text: str, where: str = "cot-prompt") -> tuple[str, list[str]]:
    """(task description, [exemplar "Q: ...\\nA: ..."]) of a BBH cot-prompts file, canary header dropped."""
    _, rule, body = text.partition(_BBH_CANARY_RULE)
    body = (body if rule else text).strip()
    description, *rest = body.split(_BBH_EXEMPLAR)
    if not rest and description.startswith(BBH_QUERY):  # a file without a description line
        description, rest = "", [description[len(BBH_QUERY) :]]
    exemplars = [BBH_QUERY + e for e in rest]
    if not exemplars or any("\nA: " not in e for e in exemplars):
        raise FewshotError(f"{where}: expected a description and 'Q: ...\\nA: ...' exemplars separated by blank lines")
    return description, exemplars


def bbh_fewshot(text: str, shots: int, where: str = "cot-prompt") -> tuple[str, str]:
    """(prefix, suffix) of a BBH few-shot CoT prompt from its cot-prompts file: the first `shots` exemplars.

    With all three shots the prefix is the file's body verbatim (lm-eval renders the same text).
    """
    description, exemplars = bbh_exemplars(text, where)
    if shots > len(exemplars):
        raise FewshotError(f"{where}: cot.fewshot={shots} but the file holds {len(exemplars)} exemplars")
    blocks = ([description] if description else []) + exemplars[:shots]
    return "\n\n".join(blocks) + "\n\n" + BBH_QUERY, BBH_TRIGGER


def mgsm_frame(exemplars: Sequence[Mapping[str, str]], where: str = "mgsm exemplars") -> tuple[str, str]:
    """(question prefix, answer cue) shared by a language's exemplars: ("Frage: ", "Schritt-für-Schritt-Antwort:").

    Read from the exemplars themselves (the query must be framed as they are); a language whose exemplars disagree
    is refused rather than guessed.
    """
    prefixes, cues = set(), set()
    for ex in exemplars:
        q, a = _MGSM_FRAME.match(ex["q"]), _MGSM_FRAME.match(ex["a"])
        if q is None or a is None:
            raise FewshotError(f"{where}: exemplar {ex['q'][:40]!r} has no 'Question:' / 'Answer:' frame word")
        # The question prefix keeps the space after the colon ("Frage: "); ja/zh have none ("问题：").
        prefixes.add(ex["q"][: q.end() + (1 if ex["q"][q.end() : q.end() + 1] == " " else 0)])
        cues.add(a.group(0))
    if len(prefixes) != 1 or len(cues) != 1:
        raise FewshotError(f"{where}: exemplars use several frames: {sorted(prefixes)} / {sorted(cues)}")
    return prefixes.pop(), cues.pop()


def mgsm_fewshot(exemplars: Sequence[Mapping[str, str]], shots: int, where: str = "mgsm exemplars") -> tuple[str, str]:
    """(prefix, suffix) of an MGSM few-shot CoT prompt: the first `shots` exemplars (upstream order), then the frame.

    lm-eval draws its shots from the same eight exemplars in a seeded random order; the upstream order is kept here
    so the prompt does not depend on a sampler.
    """
    if shots > len(exemplars):
        raise FewshotError(f"{where}: cot.fewshot={shots} but there are {len(exemplars)} exemplars")
    prefix, cue = mgsm_frame(exemplars, where)
    shown = "".join(f"{ex['q']}\n{ex['a']}\n\n" for ex in exemplars[:shots])
    return shown + prefix, "\n" + cue


def fewshot_prompt(prefix: str, source: str, suffix: str) -> str:
    """The prompt a model sees: the source unstripped between prefix and suffix, as lm-eval renders `{{input}}`."""
    return prefix + source + suffix
