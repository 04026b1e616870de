"""ingest.preset: rows in the shapes the producers write, each fixture with the source of its shape.

The validator tests run without Spark (ingest_rows.validate_chains is plain Python); one ingest run per join or
reader that only Spark does (the OpenAI batch input join, a `datasets` folder with a vLLM fan-out) checks the
written tables and that the counts reconcile. The lm-evaluation-harness round trip runs the harness itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from jobs.receval import ingest, ingest_readers, ingest_rows
from jobs.receval.ingest_presets import split_reasoning
from jobs.receval.settings import IngestSettings
from schemas import chains as C
from schemas import quarantine as Q
from tests.conftest import folder_settings

# -- shapes ------------------------------------------------------------------------------------------------------
# OpenAI Batch API (platform.openai.com/docs/guides/batch): input lines {"custom_id", "method", "url", "body"},
# output lines {"id", "custom_id", "response": {"status_code", "request_id", "body": <chat completion>}, "error"};
# a failed request has `error` {"code", "message"} and no response, or a response with a non-200 status.
BATCH_INPUT = [
    {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "Think step by step."},
                                                   {"role": "user", "content": "Tom has 3 apples and buys 5. How many?"}]}},
    {"custom_id": "req-2", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "What is 2 * 4?"}]}},
    {"custom_id": "req-3", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "What is 9 - 3?"}]}},
    {"custom_id": "req-4", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "What is 1 + 1?"}]}},
]


def _completion(text: str) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1711652795, "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 22, "completion_tokens": 2, "total_tokens": 24}}


BATCH_OUTPUT = [
    {"id": "batch_req_1", "custom_id": "req-1", "error": None,
     "response": {"status_code": 200, "request_id": "r1", "body": _completion("He has 3 + 5 = 8. The answer is 8.")}},
    {"id": "batch_req_2", "custom_id": "req-2", "error": None,
     "response": {"status_code": 200, "request_id": "r2", "body": _completion("2 * 4 = 8. So 8.")}},
    {"id": "batch_req_3", "custom_id": "req-3", "response": None,
     "error": {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}},
    {"id": "batch_req_4", "custom_id": "req-4", "error": None,
     "response": {"status_code": 429, "request_id": "r4",
                  "body": {"error": {"message": "Rate limit reached", "type": "requests"}}}},
    {"id": "batch_req_5", "custom_id": "req-5", "error": None,  # no such request in the input file
     "response": {"status_code": 200, "request_id": "r5", "body": _completion("Orphan.")}},
]

# vLLM offline inference: LLM.generate returns RequestOutput objects (vllm/outputs.py: request_id, prompt,
# prompt_token_ids, outputs: list[CompletionOutput(index, text, token_ids, cumulative_logprob, logprobs,
# finish_reason, stop_reason)], finished), written one per line as JSON; SamplingParams(n=3) gives 3 outputs.
VLLM = [
    {"request_id": "0", "prompt": "Q: What is 2 + 2?\nA:", "prompt_token_ids": [48, 25], "finished": True,
     "outputs": [{"index": 0, "text": "2 + 2 = 4. The answer is 4.", "token_ids": [1], "cumulative_logprob": -1.5,
                  "logprobs": None, "finish_reason": "stop", "stop_reason": None},
                 {"index": 1, "text": "Two and two make five. The answer is 5.", "token_ids": [2],
                  "cumulative_logprob": -3.1, "logprobs": None, "finish_reason": "stop", "stop_reason": None},
                 {"index": 2, "text": "  ", "token_ids": [3], "cumulative_logprob": -9.0, "logprobs": None,
                  "finish_reason": "length", "stop_reason": None}]},
    {"request_id": "1", "prompt": "Q: What is 3 * 3?\nA:", "prompt_token_ids": [48, 25], "finished": True,
     "outputs": []},  # n=0 is not a vLLM thing, but a filtered dump can hold it: a fan-out over an empty list
]

# Chat-completion logs (the OpenAI / Hugging Face chat template `messages` shape), one conversation per line.
CHAT = {"id": "conv-7", "model": "llama-3-8b-instruct",
        "messages": [{"role": "system", "content": "You are a careful tutor."},
                     {"role": "user", "content": "What is 2 + 3?"},
                     {"role": "assistant", "content": "2 + 3 = 5."},
                     {"role": "user", "content": [{"type": "text", "text": "And 5 * 2?"}]},
                     {"role": "assistant", "content": "5 * 2 = 10. The answer is 10."},
                     {"role": "user", "content": "Thanks!"}]}


def _settings(**values) -> IngestSettings:
    return IngestSettings.model_validate(values)


# -- validator, no Spark ------------------------------------------------------------------------------------------
def test_chat_preset_last_user_turn_before_the_answer_is_the_question():
    rec = ingest_rows.validate(json.dumps(CHAT), _settings(preset="chat"))
    assert (rec[C.CHAIN_ID], rec[C.CONTEXT], rec[C.QUESTION], rec[C.CHAIN_TEXT]) == (
        "conv-7", "And 5 * 2?", "And 5 * 2?", "5 * 2 = 10. The answer is 10.")
    assert rec[C.METADATA] == {"system": "You are a careful tutor.", "model": "llama-3-8b-instruct",
                               "producer": "chat"}
    with pytest.raises(ingest_rows.RowError) as err:  # a conversation without an assistant turn has no chain
        ingest_rows.validate(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}), _settings(preset="chat"))
    assert err.value.reason == "missing_chain"


def test_openai_batch_rows_with_their_input_and_failed_requests():
    cfg = _settings(preset="openai_batch", batch_input="in.jsonl")
    ctx = json.dumps({"_input": BATCH_INPUT[0]})
    rec = ingest_rows.validate(json.dumps(BATCH_OUTPUT[0]), cfg, ctx)
    assert (rec[C.CHAIN_ID], rec[C.CONTEXT], rec[C.CHAIN_TEXT]) == (
        "req-1", "Tom has 3 apples and buys 5. How many?", "He has 3 + 5 = 8. The answer is 8.")
    assert rec[C.METADATA] == {"model": "gpt-4o-mini-2024-07-18", "system": "Think step by step.",
                               "finish_reason": "stop", "producer": "openai_batch"}
    cases = [
        (BATCH_OUTPUT[2], json.dumps({"_input": BATCH_INPUT[2]}), "request_failed",
         "custom_id req-3: batch_expired: This request could not be executed"),
        (BATCH_OUTPUT[3], json.dumps({"_input": BATCH_INPUT[3]}), "request_failed",
         "custom_id req-4: status 429: Rate limit reached"),
        (BATCH_OUTPUT[4], None, "batch_input_missing", "custom_id 'req-5' has no line in ingest.batch_input"),
        (BATCH_OUTPUT[0], json.dumps({"_input_count": 2}), "batch_input_ambiguous", "custom_id req-1 has 2"),
    ]
    for row, extra, reason, detail in cases:
        with pytest.raises(ingest_rows.RowError) as err:
            ingest_rows.validate(json.dumps(row), cfg, extra)
        assert (err.value.reason, err.value.detail[: len(detail)]) == (reason, detail)


def test_vllm_fans_out_one_chain_per_output_each_with_its_sample_idx():
    out = ingest_rows.validate_chains(json.dumps(VLLM[0]), _settings(preset="vllm"))
    good = [r for r in out if isinstance(r, dict)]
    assert [(r[C.CHAIN_ID], r[C.QUESTION_ID], r[C.CHAIN_TEXT], r[C.METADATA]["sample_idx"]) for r in good] == [
        ("0-0", "0", "2 + 2 = 4. The answer is 4.", "0"),
        ("0-1", "0", "Two and two make five. The answer is 5.", "1"),
    ]
    assert all(r[C.CONTEXT] == "Q: What is 2 + 2?\nA:" and r[C.METADATA]["producer"] == "vllm" for r in good)
    bad = out[2]  # the blank third sample is quarantined alone, the others stay
    assert isinstance(bad, ingest_rows.RowError) and (bad.reason, bad.detail) == ("empty_chain", "sample 2: chain text is empty")
    with pytest.raises(ingest_rows.RowError) as err:
        ingest_rows.validate_chains(json.dumps(VLLM[1]), _settings(preset="vllm"))
    assert err.value.reason == "empty_fan_out"


@pytest.mark.parametrize(
    ("source", "reason"),
    [("resps[0][3]", "path_index_out_of_range"), ("resps[0][0].text", "path_through_scalar"),
     ("outputs[*]", "empty_fan_out")],
)
def test_path_problems_are_row_reasons(source, reason):
    row = {"context": "X", "resps": [["a chain."]], "outputs": []}
    verdicts = ingest_rows.validate_series(pd.Series([json.dumps(row)]), _settings(mapping={"chain_text": source}))
    assert [(v["error"], v["record"]) for v in verdicts[0]] == [(reason, None)]


def test_integer_ids_and_composed_ids():
    row = {"doc_id": 7, "task": "gsm", "context": "X", "chain": "A. So B."}
    assert ingest_rows.validate(json.dumps(row), _settings(mapping={"chain_id": "doc_id"}))[C.CHAIN_ID] == "7"
    composed = _settings(mapping={"chain_id": "{task}-{doc_id}-{sample_idx}"})
    assert ingest_rows.validate(json.dumps(row), composed)[C.CHAIN_ID] == "gsm-7-0"
    with pytest.raises(ingest_rows.RowError) as err:
        ingest_rows.validate(json.dumps({**row, "task": None}), composed)
    assert err.value.reason == "template_field_missing"


def test_reasoning_split():
    tags = ("<think>", "</think>")
    assert split_reasoning("<think>3 + 5 = 8.\nSo 8.</think>\n\nThe answer is 8.", tags) == (
        "3 + 5 = 8.\nSo 8.", "The answer is 8.")
    assert split_reasoning("3 + 5 = 8.</think>8", tags) == ("3 + 5 = 8.", "8")  # opening tag was in the prompt
    assert split_reasoning("<think>3 + 5 = 8, so", tags) == ("3 + 5 = 8, so", None)  # cut off: no answer
    assert split_reasoning("No tags. 8.", tags) == ("No tags. 8.", None)
    row = {"context": "X", "chain": "[R]a. So b.[/R] b", "answer": None}
    rec = ingest_rows.validate(json.dumps(row), _settings(reasoning=True, reasoning_tags=["[R]", "[/R]"]))
    assert (rec[C.CHAIN_TEXT], rec[C.ANSWER]) == ("a. So b.", "b")
    # an answer the mapping finds wins over the text after the tag
    rec = ingest_rows.validate(json.dumps({**row, "answer": "B"}), _settings(reasoning=True, reasoning_tags=["[R]", "[/R]"]))
    assert (rec[C.CHAIN_TEXT], rec[C.ANSWER]) == ("a. So b.", "B")


def test_lm_eval_file_facts(tmp_path: Path):
    run = "2026-12-03T13-25-50.880841"
    samples = tmp_path / f"samples_gsm_tiny_cot_{run}.jsonl"
    (tmp_path / f"results_{run}.json").write_text(json.dumps({"model_name": "models/tiny-gpt2",
                                                                "config": {"model": "hf"}}))
    assert ingest_readers.lm_eval_file(str(samples)) == {"task": "gsm_tiny_cot", "run": run, "model": "models/tiny-gpt2"}
    assert ingest_readers.lm_eval_file(str(tmp_path / "other.jsonl")) == {}


# -- one Spark run each -------------------------------------------------------------------------------------------
def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _tables(spark, settings):
    chains = {r[C.CHAIN_ID]: r for r in spark.read.format("delta").load(settings.table("chains")).collect()}
    quarantine = sorted(
        (r[Q.REASON], r[Q.SOURCE].rsplit("/", 1)[-1])
        for r in spark.read.format("delta").load(settings.table("quarantine")).collect()
    )
    return chains, quarantine


def test_openai_batch_joins_the_input_by_custom_id_and_fans_out_over_choices(spark, tmp_path: Path):
    # req-2 asked for n=2 choices; the mapping, overridden key by key, makes one chain per choice
    second = json.loads(json.dumps(BATCH_OUTPUT[1]))
    second["response"]["body"]["choices"].append(
        {"index": 1, "message": {"role": "assistant", "content": "2 * 4 is 6. So 6."}, "finish_reason": "stop"})
    out = _jsonl(tmp_path / "in" / "batch_output.jsonl", [BATCH_OUTPUT[0], second, *BATCH_OUTPUT[2:]])
    inp = _jsonl(tmp_path / "batch_input.jsonl", [*reversed(BATCH_INPUT)])  # the join does not rely on order
    settings = folder_settings(
        tmp_path, "ingest.preset=openai_batch", f"ingest.input={out}", f"ingest.batch_input={inp}",
        "ingest.mapping.chain_text=response.body.choices[*].message.content",
        "ingest.mapping.chain_id={custom_id}-{sample_idx}")
    counts = ingest.run(spark, settings, run_id="r1")
    # 5 rows read, req-2 gives 2 candidates: 6 = 3 inserted + 3 quarantined (2 failed requests, 1 without input)
    assert (counts["read"], counts["candidates"], counts["fanned_out"], counts["inserted"], counts["quarantined"],
            counts["reconciled"]) == (5, 6, 1, 3, 3, 1)
    chains, quarantine = _tables(spark, settings)
    assert {k: (r[C.CONTEXT], r[C.CHAIN_TEXT], r[C.METADATA]["producer"], r[C.METADATA]["sample_idx"])
            for k, r in chains.items()} == {
        "req-1-0": ("Tom has 3 apples and buys 5. How many?", "He has 3 + 5 = 8. The answer is 8.", "openai_batch", "0"),
        "req-2-0": ("What is 2 * 4?", "2 * 4 = 8. So 8.", "openai_batch", "0"),
        "req-2-1": ("What is 2 * 4?", "2 * 4 is 6. So 6.", "openai_batch", "1"),
    }
    assert chains["req-1-0"][C.METADATA]["system"] == "Think step by step."
    assert quarantine == [("batch_input_missing", "batch_output.jsonl"), ("request_failed", "batch_output.jsonl"),
                          ("request_failed", "batch_output.jsonl")]


@pytest.mark.slow  # ~12 s warm on 2 busy cores; the fan-out reconciliation runs in the default set above
def test_datasets_folder_with_vllm_rows_fans_out_and_reconciles(spark, tmp_path: Path):
    import datasets

    # vLLM results kept as a `datasets` folder (save_to_disk, two Arrow shards): the folder is the input.
    rows = [VLLM[0], VLLM[1], {**VLLM[0], "request_id": "2"}]
    folder = tmp_path / "vllm_ds"
    outputs = [[{"index": o["index"], "text": o["text"]} for o in r["outputs"]] for r in rows]
    datasets.Dataset.from_dict({"request_id": [r["request_id"] for r in rows], "prompt": [r["prompt"] for r in rows],
                                "outputs": outputs}).save_to_disk(str(folder), num_shards=2)
    settings = folder_settings(tmp_path, "ingest.preset=vllm", "ingest.format=hf_datasets",
                               f"ingest.input={folder}")
    counts = ingest.run(spark, settings, run_id="r1")
    # 3 rows read; rows 0 and 2 fan out to 3 candidates each (2 good, 1 blank), row 1 over nothing: 7 candidates
    assert (counts["read"], counts["candidates"], counts["fanned_out"], counts["inserted"], counts["quarantined"],
            counts["reconciled"]) == (3, 7, 4, 4, 3, 1)
    chains, quarantine = _tables(spark, settings)
    assert sorted((k, r[C.METADATA]["sample_idx"]) for k, r in chains.items()) == [
        ("0-0", "0"), ("0-1", "1"), ("2-0", "0"), ("2-1", "1")]
    assert chains["2-1"][C.CHAIN_TEXT] == "Two and two make five. The answer is 5."
    assert [reason for reason, _ in quarantine] == ["empty_chain", "empty_chain", "empty_fan_out"]
    assert ingest_readers.input_files(str(folder)) == [str(folder)]


# -- lm-evaluation-harness itself ---------------------------------------------------------------------------------
GSM_TINY = [
    {"question": "Tom has 3 apples and buys 5 more. How many apples does he have?", "answer": "3 + 5 = 8\n#### 8"},
    {"question": "A box holds 4 pens. How many pens are in 2 boxes?", "answer": "4 * 2 = 8\n#### 8"},
    {"question": "Sara had 10 sweets and ate 4. How many are left?", "answer": "10 - 4 = 6\n#### 6"},
    {"question": "A week has 7 days. How many days are in 2 weeks?", "answer": "7 * 2 = 14\n#### 14"},
    {"question": "Ann reads 6 pages a day. How many pages does she read in 3 days?", "answer": "6 * 3 = 18\n#### 18"},
]
# A GSM-8K-style generate_until task (lm_eval/tasks/gsm8k/gsm8k-cot-zeroshot.yaml, trimmed) over a local file.
TASK_YAML = """\
task: gsm_tiny_cot
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "Q: {{{{question}}}}\\nA: Let's think step by step."
doc_to_target: "{{{{answer.split('#### ')[-1]}}}}"
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
generation_kwargs:
  until: ["Q:"]
  do_sample: false
  max_gen_toks: 16
filter_list:
  - name: get-answer
    filter:
      - function: regex
        regex_pattern: "(-?[0-9]+)"
        group_select: -1
      - function: take_first
metadata:
  version: 1.0
"""


def run_lm_eval(folder: Path, model: Path) -> Path:
    """lm-eval's Python API with its HF backend on `model`, samples logged and written through its
    EvaluationTracker as `lm_eval --log_samples --output_path folder/out` does; returns the samples file."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    tasks = folder / "tasks"
    _jsonl(tasks / "gsm_tiny.jsonl", GSM_TINY)
    (tasks / "gsm_tiny_cot.yaml").write_text(TASK_YAML.format(data=tasks / "gsm_tiny.jsonl"))
    tracker = EvaluationTracker(output_path=str(folder / "out"))
    results = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={model},device=cpu", tasks=["gsm_tiny_cot"],
        task_manager=TaskManager(include_path=str(tasks)), log_samples=True, evaluation_tracker=tracker, batch_size=8)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for name in results["configs"]:
        tracker.save_results_samples(task_name=name, samples=samples[name])
    (found,) = (folder / "out").rglob("samples_gsm_tiny_cot_*.jsonl")
    return found


@pytest.mark.slow  # the harness run alone is ~25 s on 2 cores
def test_lm_eval_samples_round_trip(spark, tmp_path: Path, tiny_models):
    samples = run_lm_eval(tmp_path, tiny_models["tiny-gpt2"])
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(lines) == len(GSM_TINY)
    run = samples.name.removeprefix("samples_gsm_tiny_cot_").removesuffix(".jsonl")
    (results,) = samples.parent.glob("results_*.json")
    model = json.loads(results.read_text())["model_name"]
    # the harness's output folder as the input: its results_*.json beside the samples is not read as chains
    settings = folder_settings(tmp_path, "ingest.preset=lm_eval", f"ingest.input={samples.parent}")
    assert ingest_readers.ingest_files(settings.ingest) == [str(samples)]
    counts = ingest.run(spark, settings, run_id="r1")
    chains, quarantine = _tables(spark, settings)
    expected_chains, expected_quarantine = {}, []
    for line in lines:
        # the tiny random GPT-2 writes text that is noise, sometimes with U+FFFD where a generation cut a character:
        # valid UTF-8, so under ingest.replacement_char=strip_end (the default) it goes at the end and stays inside
        chain = line["resps"][0][0].rstrip("\ufffd")
        if not chain.strip():
            expected_quarantine.append(("empty_chain", samples.name))
            continue
        expected_chains[f"gsm_tiny_cot/{run}/{line['doc_id']}/{line['filter']}"] = (
            f"gsm_tiny_cot/{line['doc_id']}", line["doc"]["question"], line["arguments"]["gen_args_0"]["arg_0"],
            chain, line["filtered_resps"][0].rstrip("\ufffd"), line["target"], "gsm_tiny_cot",
            {"producer": "lm_eval", "model": model, "task": "gsm_tiny_cot", "doc_id": str(line["doc_id"]),
             "filter": line["filter"]},
        )
    got = {k: (r[C.QUESTION_ID], r[C.CONTEXT], r[C.QUESTION], r[C.CHAIN_TEXT], r[C.ANSWER], r[C.GOLD_ANSWER],
               r[C.DATASET], r[C.METADATA]) for k, r in chains.items()}
    assert got == expected_chains
    assert expected_chains, "every generation was quarantined: the round trip proved nothing"
    assert quarantine == sorted(expected_quarantine)
    assert (counts["read"], counts["inserted"], counts["quarantined"], counts["reconciled"]) == (
        len(lines), len(expected_chains), len(expected_quarantine), 1)


def test_pipeline_fingerprints_the_batch_input_and_datasets_folders(tmp_path: Path):
    from jobs.infra.config_layers import load_settings
    from jobs.receval.input_files import input_fingerprints

    out = _jsonl(tmp_path / "out.jsonl", BATCH_OUTPUT[:1])
    inp = _jsonl(tmp_path / "in.jsonl", BATCH_INPUT[:1])
    s = load_settings(overrides=["ingest.preset=openai_batch", f"ingest.input={out}", f"ingest.batch_input={inp}"],
                      environ={})
    before = input_fingerprints(s)
    assert [p for p, _, _, _ in before] == [str(out), str(inp)]
    _jsonl(inp, BATCH_INPUT[:2])  # a new input file changes the output's chains: the pipeline must see it
    assert input_fingerprints(s) != before
    folder = tmp_path / "ds"
    folder.mkdir()
    for name, text in (("state.json", "{}"), ("dataset_info.json", "{}"), ("data-00000-of-00001.arrow", "x" * 10)):
        (folder / name).write_text(text)
    s = load_settings(overrides=[f"ingest.input={folder}"], environ={})
    ((path, size, _, _),) = input_fingerprints(s)
    assert (path, size) == (str(folder), 14)
