"""EntailmentBank rows (task_1/task_2 jsonl, task_1 processed TSVs) -> proof steps, rendered step texts and `chains` records.

Plain Python (no Spark), run on the driver: the EB-challenge perturbations (jobs.metaeval.perturb) and the PVI
training data (jobs.training.train_pvi) read EB with it; the steps job's tests and the benchmarks render EB chains
with it.

Rendering follows the official ReCEval code (`evaluate_receval.get_reasoning_chain_text`) exactly, so scores
stay comparable with the paper:
- a step is `"<parent texts not yet mentioned, joined by ' and '>, so <child text>."`, or `"so <child text>."`
  when every parent was mentioned before; a node counts as mentioned once it appeared as a parent or as a child
  in an earlier step;
- node texts are used verbatim: no capitalisation (EB facts are lower case and stay so), no trailing period
  stripped or added inside the parents; only the one final "." is appended;
- a parent listed twice in the same step is rendered twice, as the official list comprehension does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas import chains

HYPOTHESIS = "hypothesis"


@dataclass(frozen=True)
class ProofStep:
    """One proof step: parents ("sentN" / "intN" ids) -> child ("intN" or "hypothesis")."""

    parents: tuple[str, ...]
    child: str


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# The EB paper's processed TSVs (data/processed_data/tsvs/task_1/{train,dev,test}.tsv): one tree per line,
# "$proof$ ; $question$ = Q ; $answer$ = A ; $hypothesis$ = H ; $context$ = sent1: F1 sent2: F2 ..." TAB
# "$proof$ = sent1 & sent3 -> int1: <text>; int1 & sent2 -> hypothesis; ". Task_1 train exists only in this form.
_TSV_FIELD = re.compile(r"\$(\w+)\$ = (.*?)(?= ; \$\w+\$ = |$)")
_TSV_FACT = re.compile(r"(sent\d+): (.*?)(?= sent\d+: |$)")


def tsv_row(line: str, row_id: str = "") -> dict[str, Any]:
    """One processed-TSV line -> a row shaped like the EB v2 jsonl (question, hypothesis, proof, meta.triples,
    meta.intermediate_conclusions), so `parse_proof` / `node_texts` / `render` read both alike."""
    source, tab, target = line.rstrip("\r\n").partition("\t")
    fields = dict(_TSV_FIELD.findall(source))
    if not tab or "hypothesis" not in fields or "context" not in fields or not target.startswith("$proof$ ="):
        raise ValueError(f"not an EntailmentBank processed TSV line: {line[:120]!r}")
    proof = target[len("$proof$ =") :].strip()
    triples = {name: text.strip() for name, text in _TSV_FACT.findall(fields["context"])}
    conclusions: dict[str, str] = {}
    for part in proof.split(";"):
        child = part.split("->", 1)[1] if "->" in part else ""
        if ":" in child:
            name, text = child.split(":", 1)
            conclusions[name.strip()] = text.strip()
    return {"id": row_id, "question": fields.get("question", ""), "answer": fields.get("answer"),
            HYPOTHESIS: fields["hypothesis"].strip(), "proof": proof,
            "meta": {"triples": triples, "intermediate_conclusions": conclusions}}


def load_tsv(path: str | Path) -> list[dict[str, Any]]:
    """Every tree of a processed TSV, ids `<file stem>-<line number>`."""
    with Path(path).open(encoding="utf-8") as f:
        return [tsv_row(line, f"{Path(path).stem}-{n}") for n, line in enumerate(f, 1) if line.strip()]


def parse_proof(proof: str) -> list[ProofStep]:
    """`"sent2 & sent3 -> int1: <text>; int1 & sent1 -> hypothesis; "` -> steps in proof order.

    The `: <text>` after an intN child is ignored here: node texts come from `node_texts` (in EB v2 they are
    identical to `meta.intermediate_conclusions`, checked for all 340 task_1 test rows).
    """
    steps: list[ProofStep] = []
    for part in proof.split(";"):
        part = part.strip()
        if not part:
            continue
        if "->" not in part:
            raise ValueError(f"proof step without '->': {part!r}")
        left, right = part.split("->", 1)
        parents = tuple(p.strip() for p in left.split("&") if p.strip())
        child = right.split(":", 1)[0].strip()
        if not parents or not child:
            raise ValueError(f"proof step without parents or child: {part!r}")
        steps.append(ProofStep(parents, child))
    return steps


def node_texts(row: Mapping[str, Any]) -> dict[str, str]:
    """sentN -> fact (meta.triples), intN -> intermediate conclusion, "hypothesis" -> the hypothesis sentence."""
    meta = row.get("meta") or {}
    texts: dict[str, str] = {}
    texts.update(meta.get("triples") or {})
    texts.update(meta.get("intermediate_conclusions") or {})
    texts[HYPOTHESIS] = row[HYPOTHESIS]
    return texts


def fresh_steps(steps: Sequence[ProofStep], texts: Mapping[str, str]) -> list[tuple[list[str], str]]:
    """Per step: the texts of its parents not mentioned before (the premise RCUs) and its child's text."""
    mentioned: set[str] = set()
    out: list[tuple[list[str], str]] = []
    for step in steps:
        out.append(([texts[p] for p in step.parents if p not in mentioned], texts[step.child]))
        mentioned.update(step.parents)
        mentioned.add(step.child)
    return out


def render(steps: Sequence[ProofStep], texts: Mapping[str, str]) -> list[str]:
    """Each step as the official code writes it (see the module docstring)."""
    return [
        f"{' and '.join(fresh)}, so {child}." if fresh else f"so {child}." for fresh, child in fresh_steps(steps, texts)
    ]


def context(row: Mapping[str, Any]) -> str:
    """The input context X as ReCEval builds it for EB: facts then question, joined by '. '."""
    triples = (row.get("meta") or {}).get("triples") or {}
    return ". ".join([*triples.values(), row["question"]])


def _metadata(row: Mapping[str, Any], extra: Mapping[str, Any] | None) -> dict[str, str]:
    meta = row.get("meta") or {}
    keyed: dict[str, Any] = {
        "proof": row.get("proof"),
        "depth_of_proof": row.get("depth_of_proof"),
        "length_of_proof": row.get("length_of_proof"),
        "hypothesis_id": meta.get("hypothesis_id"),
        **(extra or {}),
    }
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in keyed.items() if v is not None}


def to_chain(
    row: Mapping[str, Any],
    dataset: str = "entailment_bank",
    steps: Sequence[ProofStep] | None = None,
    texts: Mapping[str, str] | None = None,
    chain_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    gold_rcus: bool = False,
) -> dict[str, Any]:
    """One EB row -> a `chains` record (schemas.chains field names).

    `steps`/`texts` default to the row's own gold proof; perturbation code passes the changed tree instead,
    and gold_steps stay the row's gold proof. The predicted answer a_hat is the hypothesis sentence: the
    official code scores information gain towards `sentences['hypothesis']` (the tree's final conclusion, a
    declarative sentence), not the short multiple-choice answer, which is kept as gold_answer.
    With `gold_rcus`, each step also carries the tree's units as given RCUs (`step_rcus`): its fresh parents as
    premises, its child as conclusion, exactly the texts `render` joins.
    """
    gold_steps = parse_proof(row["proof"])
    gold_texts = node_texts(row)
    steps = gold_steps if steps is None else steps
    texts = gold_texts if texts is None else texts
    record: dict[str, Any] = {
        "chain_id": chain_id or str(row["id"]),
        "dataset": dataset,
        "question_id": str(row["id"]),
        "context": context(row),
        "question": row["question"],
        "steps": render(steps, texts),
        "chain_text": None,
        "answer": texts.get(HYPOTHESIS, row[HYPOTHESIS]),
        "gold_answer": row.get("answer"),
        "gold_steps": render(gold_steps, gold_texts),
        "labels": None,
        "metadata": _metadata(row, metadata),
        "step_rcus": (
            [{"premises": fresh, "conclusion": child} for fresh, child in fresh_steps(steps, texts)] if gold_rcus else None
        ),
    }
    record["content_hash"] = chains.content_hash(record)
    return record


def chain_ids(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Row ids made unique: EB task_1 test holds "Mercury_SC_405304" twice (two trees, lines 298 and 299).

    The first occurrence keeps the plain id, the k-th later one becomes "<id>#k", so ids are stable across runs.
    """
    seen: dict[str, int] = {}
    out = []
    for row in rows:
        rid = str(row["id"])
        seen[rid] = seen.get(rid, 0) + 1
        out.append(rid if seen[rid] == 1 else f"{rid}#{seen[rid]}")
    return out


def to_chains(
    rows: Iterable[Mapping[str, Any]], dataset: str = "entailment_bank", gold_rcus: bool = False
) -> list[dict[str, Any]]:
    rows = list(rows)
    return [to_chain(row, dataset, chain_id=cid, gold_rcus=gold_rcus) for row, cid in zip(rows, chain_ids(rows), strict=True)]
