"""sample_chains: GSM-8K questions -> k seeded samples + one real greedy decode each, in the shape ingest reads."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from jobs.infra import tables
from jobs.receval import ingest_rows
from jobs.selection import sample_chains as SC
from schemas import chains as C
from schemas import quarantine as Q

# ROSCOE's generated/gsm8k.json shape: question in premise, gold solution ending "A: <answer>" in hypothesis.
LINES = [
    {"premise": "Janet has 3 apples and buys 4 more. How many apples does she have?",
     "hypothesis": "IGNORE THIS. 3 + 4 = <<3+4=7>>7\nA: 7", "key": "gsm8k_0"},
    {"premise": "A robe takes 2 bolts of blue fiber and half that much white fiber. How many in total?",
     "hypothesis": "IGNORE THIS. 2 / 2 = 1, 2 + 1 = 3\nA: 3", "key": "gsm8k_1"},
    {"premise": "Tom reads 5 pages a day. How many pages in 6 days?", "hypothesis": "no gold marker here",
     "key": "gsm8k_2"},
    {"premise": "Sam has 10 dollars and spends 4. How many dollars are left?",
     "hypothesis": "IGNORE THIS. 10 - 4 = 6\nA: 6", "key": "gsm8k_3"},
]


def _questions(tmp_path: Path) -> Path:
    path = tmp_path / "gsm8k.json"
    path.write_text("\n".join([json.dumps(x) for x in LINES] + ["{not json"]) + "\n")
    return path


def _chains(folder: str) -> list[dict]:
    rows = [json.loads(line) for p in sorted(Path(folder).glob("*.json")) for line in p.read_text().splitlines()]
    return sorted(rows, key=lambda r: r["chain_id"])


def test_read_questions_names_the_dataset_to_fetch_when_the_file_is_missing(tmp_path, make_settings):
    cfg = make_settings(f"sample.questions_path={tmp_path / 'absent.jsonl'}").sample
    with pytest.raises(FileNotFoundError, match=r"sample.questions_path: .*absent.jsonl is missing.*fetch roscoe_gsm8k"):
        SC.read_questions(cfg)


def test_read_questions_and_seeded_choice(tmp_path, make_settings):
    cfg = make_settings(f"sample.questions_path={_questions(tmp_path)}", "sample.questions=2", "sample.seed=3").sample
    good, bad = SC.read_questions(cfg)
    assert [(q[C.QUESTION_ID], q[C.GOLD_ANSWER]) for q in good] == [("gsm8k_0", "7"), ("gsm8k_1", "3"),
                                                                   ("gsm8k_3", "6")]
    assert good[0]["prompt"] == f"Q: {LINES[0]['premise']}\nA: Let's think step by step.\n"
    assert sorted(b["reason"] for b in bad) == ["missing_gold", "not_json"]
    picked = [q[C.QUESTION_ID] for q in SC.choose(good, cfg)]
    assert picked == [q[C.QUESTION_ID] for q in SC.choose(good, cfg)]  # seeded
    assert len(picked) == 2 and picked == sorted(picked)  # file order kept


def test_sample_chains_tiny_t5_end_to_end(spark, tiny_models, tmp_path, make_settings):
    """Real tiny T5: k samples + one greedy per question, rerun identical, greedy = plain generate, ingest reads it."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    k, new = 3, 10
    settings = make_settings(
        f"sample.questions_path={_questions(tmp_path)}", f"sample.k={k}", f"sample.max_new_tokens={new}",
        "sample.temperature=1.0", "sample.seed=5", "sample.model.path=models/tiny-t5", "sample.model.family=seq2seq",
        "runtime.torch_threads=1", f"sample.output={tmp_path / 'out'}",
    )  # fmt: skip
    counts = SC.run(spark, settings)
    first = _chains(counts["output"])
    assert counts["questions_chosen"] == 3 and counts["questions_bad"] == 2 and counts["reconciled"] == 1
    assert counts["chains_written"] + counts["chains_empty"] == 3 * (k + 1)
    by_q: dict[str, list[dict]] = {}
    for row in first:
        by_q.setdefault(row[C.QUESTION_ID], []).append(row)
    assert set(by_q) == {"gsm8k_0", "gsm8k_1", "gsm8k_3"}
    torch.set_num_threads(1)
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_models["tiny-t5"]).eval()
    tok = AutoTokenizer.from_pretrained(tiny_models["tiny-t5"])
    for qid, rows in by_q.items():
        greedy = [r for r in rows if r["metadata"]["greedy"] == "true"]
        samples = sorted(r["metadata"]["sample_idx"] for r in rows if r["metadata"]["greedy"] == "false")
        assert len(greedy) == 1 and "sample_idx" not in greedy[0]["metadata"]
        assert greedy[0]["chain_id"] == f"{qid}-greedy"
        assert samples == [str(i) for i in range(k)][: len(samples)]  # 0..k-1 (an empty one would be missing)
        assert {r["gold_answer"] for r in rows} == {{"gsm8k_0": "7", "gsm8k_1": "3", "gsm8k_3": "6"}[qid]}
        question = next(x["premise"] for x in LINES if x["key"] == qid)
        ids = tok(f"Q: {question}\nA: Let's think step by step.\n", return_tensors="pt")["input_ids"]
        plain = tok.decode(model.generate(input_ids=ids, do_sample=False, max_new_tokens=new)[0, 1:],
                           skip_special_tokens=True)
        assert greedy[0]["chain"] == plain  # the greedy row is a real greedy decode of the same prompt
        assert greedy[0]["metadata"]["temperature"] == "1.0" and greedy[0]["metadata"]["seed"] == "5"
    # Rerun with the same settings: the same chains, word for word.
    assert _chains(SC.run(spark, settings)["output"]) == first
    # Every written row passes ingest's validator as it is (the pipeline's input contract).
    cfg = settings.ingest
    for row in first:
        record = ingest_rows.validate(json.dumps(row), cfg)
        assert (record[C.CHAIN_ID], record[C.CHAIN_TEXT], record[C.METADATA]) == (row["chain_id"], row["chain"],
                                                                                  row["metadata"])
    quarantined = tables.read(spark, settings.table("quarantine")).where(f"{Q.STAGE} = 'sample_chains'")
    reasons = sorted(r[Q.REASON] for r in quarantined.collect())
    # missing_gold + not_json once each (a rerun adds no duplicate), and any empty chain the random model made.
    assert [r for r in reasons if r != "empty_chain"] == ["missing_gold", "not_json"]
    assert reasons.count("empty_chain") == counts["chains_empty"]


def test_generation_error_quarantines_the_question(spark, tmp_path, make_settings):
    """A question whose generation fails goes to quarantine whole; the others are written."""
    from pyspark.sql.functions import pandas_udf

    from udfs.sampling import UDF_FIELDS

    @pandas_udf(UDF_FIELDS)
    def fake(prompts: pd.Series) -> pd.DataFrame:
        out = []
        for p in prompts:
            if "robe" in p:
                out.append({"chains": None, "error": "RuntimeError: boom"})
            else:
                chains = [{"sample_idx": i, "greedy": False, "text": f"so the answer is {i}", "answer": str(i),
                           "n_tokens": 5, "truncated": False} for i in range(2)]  # fmt: skip
                chains[1]["text"] = "so \ufffd the answer is 1" if "Sam" in p else " \n\x1f\xa0"  # broken bytes; blank
                chains.append({"sample_idx": None, "greedy": True, "text": "", "answer": None, "n_tokens": 0,
                               "truncated": False})  # an empty greedy decode: quarantined, not written
                out.append({"chains": chains, "error": None})
        return pd.DataFrame(out, columns=["chains", "error"])

    settings = make_settings(f"sample.questions_path={_questions(tmp_path)}", "sample.k=2",
                             f"sample.output={tmp_path / 'out'}")  # fmt: skip
    counts = SC.run(spark, settings, draw=fake)
    assert (counts["questions_failed"], counts["chains_written"], counts["chains_empty"],
            counts["chains_undecodable"], counts["reconciled"]) == (1, 2, 3, 1, 1)
    assert [r["chain_id"] for r in _chains(counts["output"])] == ["gsm8k_0-s0", "gsm8k_3-s0"]
    rows = tables.read(spark, settings.table("quarantine")).where(f"{Q.STAGE} = 'sample_chains'").collect()
    got = sorted((r[Q.REASON], r[Q.CHAIN_ID]) for r in rows if r[Q.REASON] not in ("missing_gold", "not_json"))
    assert got == [("empty_chain", "gsm8k_0-greedy"), ("empty_chain", "gsm8k_0-s1"), ("empty_chain", "gsm8k_3-greedy"),
                   ("generation_error", "gsm8k_1"), ("undecodable_text", "gsm8k_3-s1")]


@pytest.mark.dataset("roscoe_gsm8k")
def test_reads_roscoe_gsm8k(make_settings):
    good, bad = SC.read_questions(make_settings().sample)
    assert (len(good), len(bad)) == (1319, 0)
    assert good[0][C.QUESTION_ID] == "gsm8k_0" and good[0][C.GOLD_ANSWER] == "18"


def test_missing_model_fails_before_any_table(spark, tmp_path, make_settings):
    from udfs.runtime import ModelUnavailable

    settings = make_settings(f"sample.questions_path={_questions(tmp_path)}", f"sample.model.path={tmp_path / 'none'}")
    with pytest.raises(ModelUnavailable, match="sample.model.path="):
        SC.run(spark, settings)
    assert not tables.exists(spark, settings.table("quarantine"))
    assert not Path(SC.output_folder(settings)).exists()


def test_output_folder_of_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an earlier sample"):
        SC._check_replaceable(str(tmp_path))
    assert (tmp_path / "notes.txt").exists()
    SC._check_replaceable(str(tmp_path / "absent"))  # a new folder is fine


def test_chat_prompts_render_the_question_as_the_user_turn(tiny_models, tmp_path, make_settings):
    """sample.chat_template: the question is the user turn and the assistant turn opens with Kojima's trigger; a
    tokenizer without a template keeps the plain prompt; off by default."""
    from transformers import AutoTokenizer

    chat, plain = tmp_path / "chat-tok", tmp_path / "plain-tok"
    tok = AutoTokenizer.from_pretrained(tiny_models["tiny-gpt2"])
    tok.save_pretrained(plain)
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip
    tok.save_pretrained(chat)

    def questions():
        return [{C.QUESTION_ID: "q", C.CONTEXT: "What is 2 + 3?", C.GOLD_ANSWER: "5", "prompt": "Q: What is 2 + 3?"}]

    cfg = make_settings(f"sample.model.path={chat}", "sample.chat_template=true").sample
    rendered = questions()
    assert SC.chat_prompts(rendered, cfg) is True
    assert rendered[0]["prompt"] == "<|user|>What is 2 + 3?<|end|>\n<|assistant|>Let's think step by step.\n"
    kept = questions()
    assert SC.chat_prompts(kept, make_settings(f"sample.model.path={plain}", "sample.chat_template=true").sample) is False
    assert SC.chat_prompts(kept, make_settings(f"sample.model.path={chat}").sample) is False
    assert kept == questions()
