"""udfs.paths: mapping sources with list indices, one fan-out, alternatives and templates; bad paths fail at
config-check time naming the field, rows a path cannot follow give a quarantine reason. No Spark."""

from __future__ import annotations

import pytest

from jobs.infra.config import ConfigError
from jobs.infra.config_layers import load_settings
from jobs.receval.ingest_presets import DEFAULT_MAPPING, PRESETS
from jobs.receval.settings import IngestSettings
from udfs.paths import PathError, PathSyntaxError, compile_source, parse

LM_EVAL_ROW = {"doc_id": 3, "resps": [["chain a", "chain b"]], "filtered_resps": ["8"],
               "choices": [{"message": {"content": "c0"}}, {"message": {"content": "c1"}}]}


@pytest.mark.parametrize(
    ("path", "steps"),
    [
        ("resps.0.0", ("resps", "0", "0")),
        ("resps[0][0]", ("resps", 0, 0)),
        ("choices[0].message.content", ("choices", 0, "message", "content")),
        ("outputs[*].text", ("outputs", "*", "text")),
        ("outputs.*.text", ("outputs", "*", "text")),
        ("a[-1]", ("a", -1)),
        (" doc.question ", ("doc", "question")),
    ],
)
def test_parse(path, steps):
    assert parse(path) == steps


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ("resps.0.0", "chain a"),
        ("resps[0][1]", "chain b"),
        ("resps[0][-1]", "chain b"),
        ("choices[-2].message.content", "c0"),
        ("doc_id", 3),
        ("missing.deeper[0]", None),  # a missing key on the way is a missing field, as before
        ("missing | resps[0][0]", "chain a"),
        ("resps[0][5] | filtered_resps[0]", "8"),  # an alternative's row-time error is not raised when one gives a value
        ("{doc_id}-{filtered_resps[0]}-{sample_idx}", "3-8-0"),
        ("{{literal}}-{doc_id}", "{literal}-3"),
    ],
)
def test_resolve(source, value):
    assert compile_source(source).resolve(LM_EVAL_ROW) == value


def test_fan_out_gives_one_value_per_element_and_templates_see_the_index():
    assert compile_source("choices[*].message.content").resolve(LM_EVAL_ROW) == ["c0", "c1"]
    assert compile_source("resps[0][*]").resolve(LM_EVAL_ROW) == ["chain a", "chain b"]
    assert compile_source("{doc_id}-{sample_idx}").resolve(LM_EVAL_ROW, sample_idx=4) == "3-4"
    # a row's own sample_idx field wins over the fan-out index
    assert compile_source("{sample_idx}").resolve({"sample_idx": "s9"}, sample_idx=4) == "s9"


@pytest.mark.parametrize(
    ("source", "row", "reason"),
    [
        ("resps[0][2]", LM_EVAL_ROW, "path_index_out_of_range"),
        ("resps[3]", LM_EVAL_ROW, "path_index_out_of_range"),
        ("resps.0.-3", LM_EVAL_ROW, "path_index_out_of_range"),
        ("doc_id.name", LM_EVAL_ROW, "path_through_scalar"),
        ("filtered_resps[0][0]", LM_EVAL_ROW, "path_through_scalar"),
        ("resps.first", LM_EVAL_ROW, "path_through_scalar"),
        ("doc_id[0]", LM_EVAL_ROW, "path_through_scalar"),
        ("outputs[*].text", {"outputs": []}, "empty_fan_out"),
        ("outputs[*].text", {"outputs": "one"}, "path_through_scalar"),
        ("outputs[*].text[1]", {"outputs": [{"text": ["a"]}]}, "path_index_out_of_range"),
        ("{missing}-{doc_id}", LM_EVAL_ROW, "template_field_missing"),
        ("{resps}", LM_EVAL_ROW, "template_field_missing"),
        ("resps[9] | resps[8]", LM_EVAL_ROW, "path_index_out_of_range"),
    ],
)
def test_rows_a_path_cannot_follow_raise_a_reason(source, row, reason):
    with pytest.raises(PathError) as err:
        compile_source(source).resolve(row)
    assert err.value.reason == reason


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("resps[0", "unbalanced '['"),
        ("resps]0", "unbalanced ']'"),
        ("a..b", "empty segment"),
        ("a.", "ends with a dot"),
        (".a", "empty segment"),
        ("a[x]", "an index is an integer or '*'"),
        ("a[0]b", "a name must follow a dot"),
        ("", "empty path"),
        ("{doc_id", "unbalanced brace"),
        ("{outputs[*].text}", "a template cannot fan out"),
        ("a[*] | b", "cannot be one of several alternatives"),
    ],
)
def test_bad_syntax(source, message):
    with pytest.raises(PathSyntaxError, match=None) as err:
        compile_source(source)
    assert message in str(err.value)


def test_bad_path_fails_config_check_naming_the_field():
    with pytest.raises(ConfigError) as err:
        load_settings(overrides=["ingest.mapping.steps=resps[0"], environ={})
    assert "ingest.mapping.steps: unbalanced '['" in str(err.value)
    with pytest.raises(ConfigError, match=r"ingest\.mapping: steps and chain_text both fan out"):
        load_settings(overrides=["ingest.mapping.steps=a[*]", "ingest.mapping.chain_text=b[*].t"], environ={})
    with pytest.raises(ConfigError, match=r"ingest\.mapping\.step_text: a path inside a step object cannot fan out"):
        load_settings(overrides=["ingest.mapping.step_text=t[*]"], environ={})
    with pytest.raises(ConfigError, match=r"ingest\.mapping\.chain: not a chains field"):
        load_settings(overrides=["ingest.mapping.chain=x"], environ={})
    with pytest.raises(ConfigError, match=r"ingest\.preset: Input should be 'lm_eval'"):
        load_settings(overrides=["ingest.preset=lmeval"], environ={})
    with pytest.raises(ConfigError, match="set ingest.batch_input"):
        load_settings(overrides=["ingest.preset=openai_batch"], environ={})


def test_mapping_merges_default_then_preset_then_user_key_by_key():
    s = load_settings(overrides=["ingest.preset=vllm", "ingest.mapping.answer=outputs[0].answer",
                                 "ingest.mapping.question=null"], environ={})
    expected = {**DEFAULT_MAPPING, **PRESETS["vllm"], "answer": "outputs[0].answer", "question": None}
    assert s.ingest.mapping == expected
    # without a preset one --set key changes one field and keeps the rest of the default mapping
    plain = load_settings(overrides=["ingest.mapping.chain_text=output.text"], environ={})
    assert plain.ingest.mapping == {**DEFAULT_MAPPING, "chain_text": "output.text"}
    # the hf_datasets preset picks its input format unless the user names one
    assert load_settings(overrides=["ingest.preset=hf_datasets"], environ={}).ingest.format == "hf_datasets"
    assert IngestSettings(preset="hf_datasets", format="jsonl").format == "jsonl"
