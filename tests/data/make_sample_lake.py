"""Regenerate the bundled sample lake (see tests/data/README.md): 24 ROSCOE GSM-8K generations (MIT), and
EntailmentBank test trees (CC BY 4.0) each as its gold chain and as two chains with one known error made by the
EB-challenge's perturbations (NEG: a step's conclusion negated; HALL: a step's conclusion replaced by a distractor
sentence of the tree's task_2 row), the errors ReCEval's correctness scores are made to catch.

    python -m jobs.infra.data fetch roscoe_gsm8k entailment_bank && python tests/data/make_sample_lake.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "data"  # paths.data, where `python -m jobs.infra.data` lays the datasets out


def gsm8k_rows(n: int = 24) -> list[dict]:
    rows = []
    with (DATA / "roscoe" / "generated" / "gsm8k.json").open() as f:
        for line in f:
            item = json.loads(line)
            chain = item["gpt-3"].strip()
            gold = item["hypothesis"].rsplit("A:", 1)[-1].strip()
            pred = chain.rsplit("A:", 1)[-1].strip() if "A:" in chain else None
            # "A: 18" is an answer line, not a reasoning step: keep the steps, give the answer separately.
            steps_text = re.sub(r"\n?A:\s*[^\n]*$", "", chain).strip()
            rows.append(
                {
                    "chain_id": item["key"],
                    "dataset": "gsm8k",
                    "question_id": item["key"],
                    "context": item["premise"],
                    "chain": steps_text,
                    "answer": pred,
                    "gold_answer": gold,
                    "labels": {"verifier_correct": 1.0 if item["answer"] == "yes" else 0.0},
                    "metadata": {"model": "gpt-3", "source": "roscoe/generated/gsm8k.json"},
                }
            )
            if len(rows) == n:
                break
    return rows


EB_TREES = 8
EB_KINDS = ("NEG", "HALL")


def entailment_bank_rows(n: int = EB_TREES, kinds: tuple[str, ...] = EB_KINDS) -> list[dict]:
    """The first `n` EB task_1 test trees that take every perturbation kind: each tree's gold chain (labels
    {kind: 1} for every kind) and one chain per kind with the error (labels {kind: 0}), as ingest reads them."""
    import sys

    sys.path.insert(0, str(HERE.parents[1]))
    from jobs.infra.config_layers import load_settings
    from jobs.metaeval import entailment_bank as EB
    from jobs.metaeval import perturb

    settings = load_settings(overrides=[f"paths.data={DATA}"], environ={})
    cfg = settings.perturb
    trees, task2, ids = perturb.kept_rows(cfg)
    res, _ = perturb.resources(settings, kinds)
    rows = []
    for tree, distractors, cid in zip(trees, task2, ids, strict=True):
        changed = {kind: perturb.perturb_tree(kind, tree, distractors, cid, cfg.seed, res) for kind in kinds}
        if any(c is None for c in changed.values()):
            continue
        gold = EB.to_chain(tree, "entailment_bank", chain_id=f"eb-{cid}")
        rows.append(_lake_row(gold, {kind: perturb.CLEAN for kind in kinds}, {"perturbation": "none"}))
        for kind, ((steps, texts), record, idx) in changed.items():
            chain = EB.to_chain(tree, "entailment_bank", steps, texts, chain_id=f"eb-{cid}-{kind}")
            rows.append(_lake_row(chain, {kind: perturb.PERTURBED},
                                  {"perturbation": kind, "perturbation_step": str(idx),
                                   "perturbation_node": str(record["node"])}))
        if len(rows) == n * (1 + len(kinds)):
            break
    return rows


def _lake_row(chain: dict, labels: dict[str, float], extra: dict[str, str]) -> dict:
    """A `chains` record as an input row: given steps, no chain text, no derived columns."""
    return {
        "chain_id": chain["chain_id"], "dataset": chain["dataset"], "question_id": chain["question_id"],
        "context": chain["context"], "question": chain["question"], "steps": chain["steps"],
        "answer": chain["answer"], "gold_answer": chain["gold_answer"], "gold_steps": chain["gold_steps"],
        "labels": labels,
        "metadata": {"source": "entailment_bank task_1 test (v2)", "tree": chain["question_id"], **extra},
    }


BAD_ROWS = [
    {"chain_id": "bad-no-context", "chain": "She sold 72 clips."},
    {"chain_id": "bad-empty-chain", "context": "A question.", "chain": "   "},
    {"chain_id": "bad-steps-type", "context": "A question.", "steps": "not a list"},
]


def main() -> None:
    out = HERE / "sample_lake"
    out.mkdir(exist_ok=True)
    with (out / "gsm8k_sample.jsonl").open("w") as f:
        for row in gsm8k_rows():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with (out / "entailment_bank_sample.jsonl").open("w") as f:
        for row in entailment_bank_rows():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with (out / "bad_rows.jsonl").open("w") as f:
        for row in BAD_ROWS:
            f.write(json.dumps(row) + "\n")
        f.write("{this is not json\n")


if __name__ == "__main__":
    main()
