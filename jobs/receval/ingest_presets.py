"""`ingest.mapping` defaults and the producer presets (`ingest.preset`), in one place.

The effective mapping is DEFAULT_MAPPING <- the preset's mapping <- the user's keys (a user key overrides,
null removes a field). Keys are chains fields, `step_*` (paths inside a step object) or `metadata.<name>` (one
metadata entry each). Values are `udfs.paths` sources: dotted paths with list indices and one `[*]` fan-out,
`a | b` alternatives, `{...}` templates.

Some fields cannot be a path into the producer's own row; the ingest validator adds them under reserved keys:
- `_file`: facts of the input file (lm_eval: `task` and `run` from `samples_<task>_<run>.jsonl`, `model` from the
  sibling `results_<run>.json`);
- `_input`: the OpenAI batch input line with the same `custom_id` (`ingest.batch_input`);
- `_chat`: from a `messages` list (chat; openai_batch: the input's `body.messages`): `system` (first system
  turn), `user` (last user turn before the answer), `assistant` (the last assistant turn).
Every chain a preset produces has `metadata.producer` = the preset's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

Preset = Literal["lm_eval", "openai_batch", "chat", "vllm", "hf_datasets"]

DEFAULT_MAPPING: dict[str, str | None] = {
    "chain_id": "chain_id",
    "dataset": "dataset",
    "question_id": "question_id",
    "context": "context",
    "question": "question",
    "steps": "steps",
    # a step given as an object carries its own RCUs: these name its fields (paths inside it)
    "step_text": "text",
    "step_premises": "premises",
    "step_conclusion": "conclusion",
    "chain_text": "chain",
    "answer": "answer",
    "gold_answer": "gold_answer",
    "gold_steps": "gold_steps",
    "labels": "labels",
    "metadata": "metadata",
}
# Paths read inside each step object, not the row: the fan-out rule and `_chat` do not apply to them.
STEP_KEYS = ("step_text", "step_premises", "step_conclusion")
METADATA_PREFIX = "metadata."

# The fields of DEFAULT_MAPPING a producer's rows do not have: null, so a stray column of that name in a
# producer's file is not read as a chains field.
_NONE = dict.fromkeys(["dataset", "question_id", "steps", "gold_steps", "labels", "metadata", "answer"])

PRESETS: dict[str, dict[str, str | None]] = {
    # lm-evaluation-harness 0.4.13 `--log_samples` (evaluator.evaluate, EvaluationTracker.save_results_samples):
    # one line per document and filter; `resps[0][0]` the first request's first generation, `filtered_resps[0]`
    # its filtered answer, `target` the gold, `arguments.gen_args_0.arg_0` the rendered prompt.
    "lm_eval": {
        **_NONE,
        "chain_id": "{_file.task}/{_file.run}/{doc_id}/{filter}",
        "dataset": "_file.task",
        "question_id": "{_file.task}/{doc_id}",
        # the question as the task's documents state it, else the prompt the model saw
        "context": "doc.question | doc.problem | doc.input | arguments.gen_args_0.arg_0",
        "question": "arguments.gen_args_0.arg_0",
        "chain_text": "resps[0][0]",
        "answer": "filtered_resps[0]",
        "gold_answer": "target",
        "metadata.model": "_file.model",
        "metadata.task": "_file.task",
        "metadata.doc_id": "doc_id",
        "metadata.filter": "filter",
    },
    # OpenAI Batch API output lines ({"id", "custom_id", "response": {"status_code", "body": <chat completion>},
    # "error"}), joined to the input file's lines by custom_id for the prompt.
    "openai_batch": {
        **_NONE,
        "chain_id": "custom_id",
        "context": "_chat.user",
        "question": "_chat.user",
        "chain_text": "response.body.choices[0].message.content",
        "metadata.model": "response.body.model",
        "metadata.system": "_chat.system",
        "metadata.finish_reason": "response.body.choices[0].finish_reason",
    },
    # Chat-completion logs: {"messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...], ...}.
    "chat": {
        **_NONE,
        "chain_id": "id",
        "context": "_chat.user",
        "question": "_chat.user",
        "chain_text": "_chat.assistant",
        "metadata.system": "_chat.system",
        "metadata.model": "model",
    },
    # vLLM offline results, RequestOutput as JSON: {"request_id", "prompt", "outputs": [{"index", "text",
    # "finish_reason", ...}], "finished"}: one chain per output.
    "vllm": {
        **_NONE,
        "chain_id": "{request_id}-{sample_idx}",
        "question_id": "request_id",
        "context": "prompt",
        "question": "prompt",
        "chain_text": "outputs[*].text",
    },
    # A `datasets` save_to_disk folder holding rows of this project's own shape: the default mapping.
    "hf_datasets": {},
}
PRESET_FORMAT: dict[str, str] = {"hf_datasets": "hf_datasets"}


def effective_mapping(preset: str | None, user: Mapping[str, str | None] | None) -> dict[str, str | None]:
    """DEFAULT_MAPPING <- preset <- user, key by key; a null value removes the field."""
    merged: dict[str, str | None] = {**DEFAULT_MAPPING, **(PRESETS[preset] if preset else {}), **(user or {})}
    return merged


def chat_fields(messages: Any) -> dict[str, str | None] | None:
    """`messages` -> {system, user, assistant}: the first system turn, the last assistant turn and the last
    user turn before it (the question it answers). None when `messages` is not a list of turns."""
    if not isinstance(messages, list):
        return None
    turns = [(m.get("role"), _content(m.get("content"))) for m in messages if isinstance(m, Mapping)]
    system = next((c for r, c in turns if r in ("system", "developer")), None)
    last_assistant = max((i for i, (r, _) in enumerate(turns) if r == "assistant"), default=None)
    before = turns if last_assistant is None else turns[:last_assistant]
    user = next((c for r, c in reversed(before) if r == "user"), None)
    assistant = turns[last_assistant][1] if last_assistant is not None else None
    return {"system": system, "user": user, "assistant": assistant}


def _content(value: Any) -> str | None:
    """A turn's content: text, or the text parts of a list of content parts ([{"type": "text", "text": ...}])."""
    if isinstance(value, list):
        parts = [p.get("text") for p in value if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        return "\n".join(parts) if parts else None
    return value if isinstance(value, str) else None


def batch_failure(row: Mapping[str, Any]) -> str | None:
    """Why an OpenAI batch output line is a failed request (its `error`, or a non-200 status), else None."""
    error = row.get("error")
    response = row.get("response")
    status = response.get("status_code") if isinstance(response, Mapping) else None
    if error is None and status == 200:
        return None
    if isinstance(error, Mapping):
        return f"{error.get('code')}: {error.get('message')}"
    if error is not None:
        return str(error)
    body = response.get("body") if isinstance(response, Mapping) else None
    inner = body.get("error") if isinstance(body, Mapping) else None
    message = inner.get("message") if isinstance(inner, Mapping) else None
    return f"status {status}" + (f": {message}" if message else "")


def split_reasoning(text: str, tags: tuple[str, str]) -> tuple[str, str | None]:
    """`<think>chain</think>answer` -> (chain, answer). A missing opening tag (templates often put it in the
    prompt) reads from the start; an unclosed one (a cut-off generation) gives no answer; no tags: unchanged."""
    open_tag, close_tag = tags
    start = text.find(open_tag)
    end = text.find(close_tag, start + len(open_tag) if start >= 0 else 0)
    if start < 0 and end < 0:
        return text, None
    begin = start + len(open_tag) if start >= 0 else 0
    if end < 0:
        return text[begin:].strip(), None
    answer = text[end + len(close_tag) :].strip()
    return text[begin:end].strip(), answer or None
