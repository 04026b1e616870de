"""EntailmentBank task_1 test (+ task_2 distractors) -> EB-challenge `chains` (one dataset per perturbation type).

Semantics follow the official `perturb_EB.py` (docs/design/RECEVAL.md "Meta-evaluation"): keep trees with at least
`min_steps` steps, perturb one step whose child is an intermediate node (never the final, hypothesis step):
HALL  its conclusion becomes a task_2 distractor sentence that is not in the tree;
NEG   its conclusion is negated (jobs.metaeval.negation, spaCy rules);
SWAP  one of its parents and its child trade places; later references to the child point to that parent;
REP   it concludes a copy node, and a new step "so <child>." follows;
PAR   the same with a paraphrase of the child (models.paraphrase: a seq2seq model, or a causal chat model);
RED   the same with a distractor sentence;
REMOVE the step is dropped and its parents are passed to the steps that used its child.
Fixed official bugs: the clean half is drawn without replacement, so exactly floor(n * clean_fraction)
chains are clean (126 of 253); every draw comes from a generator seeded by (seed, type, chain), so output does not depend
on row order or on other types; a step that cannot be perturbed (no negation rule applies, the paraphrase is
empty or unchanged, no distractor left) is swapped for another candidate step, never left empty; a tree with
no such step stays clean and the next tree in the seeded order is perturbed, so the split stays exact.
Each chain records what changed in `metadata` (perturbation_type, _step, _node, _before, _after).
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.progress import Progress
from jobs.infra.stage import Job, Stage
from jobs.metaeval import entailment_bank as EB
from jobs.metaeval.entailment_bank import ProofStep
from jobs.metaeval.settings import PerturbSettings
from schemas import chains as C

log = logging.getLogger(__spec__.name)

TYPES = ("HALL", "NEG", "SWAP", "REP", "PAR", "RED", "REMOVE")
CLEAN, PERTURBED = 1.0, 0.0

Tree = tuple[list[ProofStep], dict[str, str]]


@dataclass(frozen=True)
class Resources:
    """What the perturbations draw from, built once per run on the driver."""

    negate: Callable[[str], str | None] | None = None
    # sentences -> {sentence: candidate paraphrases, best first}; memoised, so a batch call primes it.
    paraphrase: Callable[[Sequence[str]], dict[str, list[str]]] | None = None


def candidates(steps: Sequence[ProofStep]) -> list[int]:
    """Indexes of steps whose child is an intermediate node (intN), as the official code picks them."""
    return [i for i, s in enumerate(steps) if s.child.startswith("int")]


def fresh_node(texts: dict[str, str]) -> str:
    """An intN id used nowhere in the tree (the official 'int' + str(len + 1) can hit the hypothesis id)."""
    used = [int(k[3:]) for k in texts if k.startswith("int") and k[3:].isdigit()]
    return f"int{max(used, default=0) + 1}"


def distractors(tree_texts: dict[str, str], task2_row: dict[str, Any]) -> list[str]:
    """task_2 sentences not in the tree (official rule), in a stable order without duplicates."""
    present = set(tree_texts.values())
    triples = (task2_row.get("meta") or {}).get("triples") or {}
    return sorted({v for v in triples.values() if v not in present})


def _with_child_text(steps: list[ProofStep], texts: dict[str, str], idx: int, text: str) -> Tree:
    new_texts = dict(texts)
    new_texts[steps[idx].child] = text
    return list(steps), new_texts


def _insert_after(steps: list[ProofStep], texts: dict[str, str], idx: int, text: str) -> Tree:
    """Step idx concludes a new node with `text`; a new step "so <child>." follows (REP, PAR, RED)."""
    child = steps[idx].child
    node = fresh_node(texts)
    new_texts = dict(texts)
    new_texts[node] = text
    new_steps = list(steps)
    new_steps[idx] = replace(steps[idx], child=node)
    new_steps.insert(idx + 1, ProofStep((node,), child))
    return new_steps, new_texts


def swap(steps: list[ProofStep], texts: dict[str, str], idx: int, parent: str) -> Tree:
    child = steps[idx].child
    new_steps = list(steps)
    parents = [p for p in steps[idx].parents if p != parent] + [child]
    new_steps[idx] = ProofStep(tuple(parents), parent)
    for j in range(idx + 1, len(steps)):
        if child in steps[j].parents:
            moved = [p for p in steps[j].parents if p != child] + [parent]
            new_steps[j] = ProofStep(tuple(moved), steps[j].child)
    return new_steps, dict(texts)


def remove(steps: list[ProofStep], texts: dict[str, str], idx: int) -> Tree:
    child, parents = steps[idx].child, steps[idx].parents
    new_steps = []
    for j, step in enumerate(steps):
        if j == idx:
            continue
        if child in step.parents:
            step = ProofStep(tuple([p for p in step.parents if p != child] + list(parents)), step.child)
        new_steps.append(step)
    return new_steps, dict(texts)


def perturb_at(kind: str, steps: list[ProofStep], texts: dict[str, str], idx: int, rng: random.Random,
               pool: list[str], res: Resources) -> tuple[Tree, dict[str, str]] | None:
    """Apply one perturbation at step idx; None when this step cannot take it (the caller tries another)."""
    child = steps[idx].child
    old = texts[child]
    if kind in ("HALL", "RED"):
        if not pool:
            return None
        new = rng.choice(pool)
        tree = _with_child_text(steps, texts, idx, new) if kind == "HALL" else _insert_after(steps, texts, idx, new)
        return tree, {"node": child, "old_text": old, "new_text": new}
    if kind == "NEG":
        new = res.negate(old) if res.negate else None
        if not new or not new.strip():
            return None
        return _with_child_text(steps, texts, idx, new), {"node": child, "old_text": old, "new_text": new}
    if kind == "PAR":
        found = res.paraphrase([old]).get(old, []) if res.paraphrase else []
        options = [p for p in found if p.strip() and _norm(p) != _norm(old)]
        if not options:
            return None
        new = options[0]
        return _insert_after(steps, texts, idx, new), {"node": child, "old_text": old, "new_text": new}
    if kind == "REP":
        return _insert_after(steps, texts, idx, old), {"node": child, "old_text": old, "new_text": old}
    if kind == "SWAP":
        parent = rng.choice(list(steps[idx].parents))
        return swap(steps, texts, idx, parent), {"node": child, "swapped_with": parent}
    if kind == "REMOVE":
        return remove(steps, texts, idx), {"node": child, "old_text": old}
    raise ValueError(f"unknown perturbation type {kind!r} (known: {', '.join(TYPES)})")


def _norm(text: str) -> str:
    return " ".join(text.lower().strip().rstrip(".").split())


def row_rng(seed: int, kind: str, chain_id: str) -> random.Random:
    # str seeds are hashed with sha512 by random.Random: stable across processes, unlike hash().
    return random.Random(f"{seed}:{kind}:{chain_id}")


def perturb_tree(kind: str, row: dict[str, Any], task2_row: dict[str, Any], chain_id: str, seed: int,
                 res: Resources) -> tuple[Tree, dict[str, str], int] | None:
    """Perturb one tree: candidate steps in a seeded random order, the first that takes the change wins."""
    steps = EB.parse_proof(row["proof"])
    texts = EB.node_texts(row)
    rng = row_rng(seed, kind, chain_id)
    order = candidates(steps)
    rng.shuffle(order)
    pool = distractors(texts, task2_row)
    for idx in order:
        done = perturb_at(kind, steps, texts, idx, rng, pool, res)
        if done is not None:
            tree, record = done
            return tree, record, idx
    return None


def kept_rows(cfg: PerturbSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """Task_1 trees with >= min_steps steps, their task_2 rows (same order, checked by id), unique chain ids."""
    task1 = EB.load_jsonl(resolve_path(cfg.eb_task1_test))
    # No task_2 file (a split EntailmentBank ships without one here, e.g. dev): no distractors; HALL and RED,
    # which need them, are reported as not produced (`resources`).
    task2 = EB.load_jsonl(resolve_path(cfg.eb_task2_test)) if cfg.eb_task2_test else [{"id": r["id"]} for r in task1]
    if [r["id"] for r in task1] != [r["id"] for r in task2]:
        raise ValueError("EB task_1 and task_2 test files do not hold the same ids in the same order")
    ids = EB.chain_ids(task1)
    kept = [i for i, r in enumerate(task1) if len(EB.parse_proof(r["proof"])) >= cfg.min_steps]
    kept = [i for i in kept if candidates(EB.parse_proof(task1[i]["proof"]))]
    if cfg.max_rows is not None:
        kept = kept[: cfg.max_rows]
    return [task1[i] for i in kept], [task2[i] for i in kept], [ids[i] for i in kept]


def build(kind: str, rows: list[dict[str, Any]], task2: list[dict[str, Any]], ids: list[str],
          cfg: PerturbSettings, res: Resources) -> list[dict[str, Any]]:
    """`chains` records for one perturbation type: exactly floor(n * clean_fraction) clean. Pure.

    Trees are visited in a seeded random order (without replacement) and perturbed until n - n_clean of
    them took the change; a tree that cannot take it anywhere stays clean and the next one is drawn.
    """
    n = len(rows)
    n_perturbed = n - math.floor(n * cfg.clean_fraction)
    order = list(range(n))
    random.Random(f"{cfg.seed}:{kind}:split").shuffle(order)
    if kind == "PAR" and res.paraphrase is not None:
        # One batched generation for the trees most likely to be used, instead of one call per tree.
        res.paraphrase([EB.node_texts(rows[i])[s.child] for i in order[:n_perturbed]
                        for s in EB.parse_proof(rows[i]["proof"]) if s.child.startswith("int")])
    done: dict[int, tuple[Tree, dict[str, str], int]] = {}
    for i in order:
        if len(done) == n_perturbed:
            break
        attempt = perturb_tree(kind, rows[i], task2[i], ids[i], cfg.seed, res)
        if attempt is not None:
            done[i] = attempt
    if len(done) < n_perturbed:
        raise ValueError(f"{kind}: only {len(done)} of {n} trees can be perturbed, {n_perturbed} are needed")
    dataset = f"{cfg.dataset_prefix}_{kind}"
    records = []
    for i, (row, cid) in enumerate(zip(rows, ids, strict=True)):
        chain_id = f"{dataset}:{cid}"
        meta: dict[str, Any] = {"perturbation_type": kind, "perturbed": i in done, "seed": cfg.seed}
        if i in done:
            (steps, texts), record, idx = done[i]
            original = EB.render(EB.parse_proof(row["proof"]), EB.node_texts(row))
            changed = EB.render(steps, texts)
            meta.update(
                perturbation_step=idx,
                perturbation_node=record["node"],
                perturbation_before=json.dumps(original[idx:], ensure_ascii=False),
                perturbation_after=json.dumps(changed[idx:], ensure_ascii=False),
                perturbation_detail=json.dumps(record, ensure_ascii=False),
            )
            chain = EB.to_chain(row, dataset, steps, texts, chain_id=chain_id, metadata=meta, gold_rcus=cfg.gold_rcus)
        else:
            chain = EB.to_chain(row, dataset, chain_id=chain_id, metadata=meta, gold_rcus=cfg.gold_rcus)
        chain[C.LABELS] = {kind: PERTURBED if i in done else CLEAN}
        chain[C.SOURCE] = cfg.eb_task1_test
        records.append(chain)
    return records


class Paraphraser:
    """Memoised batched paraphrasing with the configured model (beam search: deterministic): a seq2seq model
    given `perturb.paraphrase_prefix` + the sentence, or an instruction-tuned causal chat model given
    `perturb.paraphrase_instruction` through its chat template."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cache: dict[str, list[str]] = {}

    def __call__(self, sentences: Sequence[str]) -> dict[str, list[str]]:
        missing = sorted({s for s in sentences if s not in self.cache}, key=len)
        if missing:
            self.cache.update(self._generate(missing))
        return {s: self.cache[s] for s in sentences}

    def _generate(self, sentences: list[str]) -> dict[str, list[str]]:
        import torch

        from udfs import runtime

        ref, cfg, rt = self.settings.models.paraphrase, self.settings.perturb, self.settings.runtime
        device = runtime.task_device(rt.device)
        causal = ref.family == "causal"
        model, tokenizer = runtime.load_model(ref.path, "causal" if causal else "seq2seq", device, rt.dtype,
                                              ref.revision)
        beams = cfg.paraphrase_num_beams
        out: dict[str, list[str]] = {}
        with torch.inference_mode():
            for start in range(0, len(sentences), rt.batch_size):
                chunk = sentences[start : start + rt.batch_size]
                if causal:
                    prompts = [tokenizer.apply_chat_template(
                        [{"role": "user", "content": cfg.paraphrase_instruction.format(sentence=s)}],
                        tokenize=False, add_generation_prompt=True) for s in chunk]
                    # Left padding: generation continues every row from its own last token. Per call, so the
                    # worker's cached tokenizer keeps its own side for the other jobs that share it.
                    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                                    add_special_tokens=False).to(device)
                else:
                    enc = tokenizer([cfg.paraphrase_prefix + s for s in chunk], return_tensors="pt", padding=True,
                                    truncation=True, max_length=rt.max_length).to(device)
                gen = model.generate(**enc, max_new_tokens=cfg.paraphrase_max_new_tokens, num_beams=beams,
                                     num_return_sequences=beams, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
                if causal:  # the reply only, its first line (a chat model may add a note after it)
                    replies = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
                    texts = [(t.strip().splitlines() or [""])[0].strip().strip('"') for t in replies]
                else:
                    texts = tokenizer.batch_decode(gen, skip_special_tokens=True)
                for j, sentence in enumerate(chunk):
                    out[sentence] = [t.strip().rstrip(".").strip() for t in texts[j * beams : (j + 1) * beams]]
        return out


DISTRACTOR_TYPES = {"HALL", "RED"}  # their new sentence is a task_2 distractor


def resources(settings: Settings, kinds: Sequence[str]) -> tuple[Resources, dict[str, str]]:
    """Load what the requested types need; a type whose resource is missing is reported, not produced."""
    skipped: dict[str, str] = {}
    negate = paraphrase = None
    if not settings.perturb.eb_task2_test:
        for kind in DISTRACTOR_TYPES & set(kinds):
            skipped[kind] = ("not produced: perturb.eb_task2_test is not set, and this type draws its sentence from "
                             "the task_2 distractors of the tree")
    if "NEG" in kinds:
        import spacy

        from jobs.metaeval.negation import negate as negate_text

        # The lemmatizer stays in: do-support needs the verb's lemma ("produces" -> "does not produce").
        nlp = spacy.load(settings.models.spacy, exclude=["ner"])
        negate = lambda text: negate_text(text, nlp)  # noqa: E731
    if "PAR" in kinds:
        from udfs import runtime

        ref = settings.models.paraphrase
        try:
            if ref is None:
                raise runtime.ModelUnavailable("models.paraphrase is not set")
            runtime.check_available(ref.path, "paraphrase")
            if ref.family == "causal":
                from transformers import AutoTokenizer

                if not AutoTokenizer.from_pretrained(runtime.resolve_model_path(ref.path)).chat_template:
                    raise runtime.ModelUnavailable(
                        f"models.paraphrase {ref.path!r} is a causal LM without a chat template: a causal "
                        "paraphraser must be an instruction-tuned chat model")
            paraphrase = Paraphraser(settings)
        except runtime.ModelUnavailable as err:
            skipped["PAR"] = f"not produced: {err}"
    return Resources(negate=negate, paraphrase=paraphrase), skipped


def run(spark: SparkSession, settings: Settings) -> dict[str, Any]:
    cfg = settings.perturb
    unknown = sorted(set(cfg.types) - set(TYPES))
    if unknown:
        raise ValueError(f"perturb.types: unknown {unknown} (known: {', '.join(TYPES)})")
    rows, task2, ids = kept_rows(cfg)
    res, skipped = resources(settings, cfg.types)
    records = []
    report: dict[str, Any] = {"trees": len(rows)}
    # Driver-side work per perturbation type: trees done over all types, rate and ETA in the log.
    with Progress("perturb", len(rows) * len(cfg.types), "trees", settings.log.progress_seconds, logger=log) as progress:
        for kind in cfg.types:
            if kind in skipped:
                report[kind] = skipped[kind]
                log.info(f"[perturb] {kind} {skipped[kind]}")
            else:
                built = build(kind, rows, task2, ids, cfg, res)
                records.extend(built)
                report[kind] = sum(1 for r in built if r[C.LABELS][kind] == PERTURBED)
            progress.commit(len(rows))
    df = spark.createDataFrame([{f.name: r.get(f.name) for f in C.SCHEMA.fields} for r in records], C.SCHEMA)
    df = df.withColumn(C.INGESTED_AT, tables.now())
    path = settings.table("chains")
    existing = tables.read(spark, path, C.SCHEMA).select(C.CHAIN_ID, F.col(C.CONTENT_HASH).alias("_old"))
    conflicts = df.join(existing, C.CHAIN_ID).where(F.col("_old") != F.col(C.CONTENT_HASH)).count()
    if conflicts:
        # Another seed or source already wrote these ids: never replace chains that may be scored.
        raise ValueError(
            f"{conflicts} EB-challenge chain ids are already in `chains` with other content; "
            "use another perturb.dataset_prefix for a new seed"
        )
    report["inserted"] = tables.insert_new(spark, df, path, C.SCHEMA, [C.CHAIN_ID])
    report["rows"] = len(records)
    return report


def _body(job: Job) -> dict[str, Any]:
    spark, settings, tracked = job.spark, job.settings, job.tracked
    report = run(spark, settings)
    tracked.log_metrics({f"perturbed_{k}": v for k, v in report.items() if isinstance(v, int)})
    tracked.set_tags({f"skipped_{k}": v for k, v in report.items() if isinstance(v, str)})
    tracked.log_text("perturb/report.json", json.dumps(report, indent=2))
    log.info(f"[perturb] {report}")
    return report


STAGE = Stage("perturb", __doc__, _body, writes=("chains",), section="perturb")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
