"""A synthetic scoring workload shaped like EntailmentBank and GSM-8K: chains of random words, real size profile.

Step counts, context sizes and sentence lengths are drawn from the real EB task_1 test trees and the ROSCOE
GSM-8K chains (so padding, pair counts and LM lengths look like the real data); the words are drawn from
their vocabulary, so every chain is distinct and deduplication only finds what real nights find too (the g'
input and repeated L(k) prefixes), not copies. Seeded: the same (n, seed) gives the same chains.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from jobs.infra.config_paths import resolve_path
from jobs.metaeval.settings import HumanLabelSettings, PerturbSettings

ROOT = Path(__file__).resolve().parent.parent
# python -m jobs.infra.data fetch entailment_bank roscoe_gsm8k
EB_TEST = resolve_path(PerturbSettings().eb_task1_test)
GSM8K = resolve_path(HumanLabelSettings().generated)
WORD = re.compile(r"[A-Za-z]+|\d+")


@dataclass(frozen=True)
class Chain:
    chain_id: str
    context: list[str]  # context sentences (inter-step premises)
    premises: list[list[str]]  # per step: the premise RCUs
    conclusions: list[str]  # per step: the conclusion RCU
    answer: str

    @property
    def step_texts(self) -> list[str]:
        return [f"{' and '.join(p)}, so {c}." if p else f"{c}." for p, c in zip(self.premises, self.conclusions, strict=True)]


@dataclass(frozen=True)
class Profile:
    """Observed sizes per source: steps per chain, context sentences per chain, words per sentence."""

    steps: tuple[int, ...]
    context: tuple[int, ...]
    words: tuple[int, ...]
    premises: tuple[int, ...]  # premise RCUs per step
    vocabulary: tuple[str, ...]


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.?!])\s+", text.strip()) if s]


@lru_cache(maxsize=1)
def profiles() -> dict[str, Profile]:
    import sys

    sys.path.insert(0, str(ROOT))
    from jobs.metaeval import entailment_bank as eb

    vocab: set[str] = set()
    steps, context, words, premises = [], [], [], []
    for row in eb.load_jsonl(EB_TEST):
        proof = eb.parse_proof(row["proof"])
        texts = eb.node_texts(row)
        steps.append(len(proof))
        context.append(len(row["meta"]["triples"]) + 1)
        premises += [sum(p.startswith("sent") for p in s.parents) for s in proof]
        for text in texts.values():
            tokens = WORD.findall(text)
            words.append(len(tokens))
            vocab.update(t.lower() for t in tokens)
    out = {"eb": Profile(tuple(steps), tuple(context), tuple(words), tuple(premises), ())}

    steps, context, words = [], [], []
    for line in GSM8K.read_text().splitlines():
        item = json.loads(line)
        lines = [x for x in item["gpt-3"].strip().splitlines() if x.strip() and not x.startswith("A:")]
        question = _sentences(item["premise"])
        steps.append(max(1, len(lines)))
        context.append(len(question))
        for text in [*lines, *question]:
            tokens = WORD.findall(text)
            words.append(len(tokens))
            vocab.update(t.lower() for t in tokens)
    # GSM-8K steps compute from the question and earlier results: one premise clause per step.
    out["gsm8k"] = Profile(tuple(steps), tuple(context), tuple(words), (1,), ())
    words_sorted = tuple(sorted(vocab))
    return {k: Profile(p.steps, p.context, p.words, p.premises, words_sorted) for k, p in out.items()}


def _sentence(rng: random.Random, p: Profile) -> str:
    n = max(3, rng.choice(p.words))
    return " ".join(rng.choice(p.vocabulary) for _ in range(n)).capitalize()


def chains(n: int, seed: int = 0) -> list[Chain]:
    """n chains, half EB-shaped and half GSM-8K-shaped (alternating), reproducible for a seed."""
    prof = profiles()
    rng = random.Random(f"bench:{seed}")
    out = []
    for i in range(n):
        kind = "eb" if i % 2 == 0 else "gsm8k"
        p = prof[kind]
        context = [_sentence(rng, p) for _ in range(rng.choice(p.context))]
        n_steps = rng.choice(p.steps)
        premises, conclusions = [], []
        for _ in range(n_steps):
            k = rng.choice(p.premises)
            # EB steps combine context facts; GSM-8K steps state a fresh clause of their own.
            premises.append(rng.sample(context, min(k, len(context))) if kind == "eb" else [_sentence(rng, p)])
            conclusions.append(_sentence(rng, p))
        answer = " ".join(rng.choice(p.vocabulary) for _ in range(rng.randint(1, 3)))
        out.append(Chain(f"{kind}-{seed}-{i:07d}", context, premises, conclusions, answer))
    return out


def nli_pairs(chain: Chain) -> list[tuple[str, str]]:
    """Every NLI pair jobs.receval.nli_scores builds for the chain (history all), in step order, duplicates kept."""
    pairs = []
    for i, (premise, conclusion) in enumerate(zip(chain.premises, chain.conclusions, strict=True)):
        earlier = chain.conclusions[:i]
        intra = [*premise, *earlier]
        if intra:
            pairs.append((" and ".join(intra), conclusion))
        pairs += [(s, conclusion) for s in [*chain.context, *earlier]]
    return pairs


def frames(spark, items: list[Chain], config_hash: str = "bench"):
    """(steps, contexts) DataFrames in the scoring jobs' input schemas."""
    from schemas import steps as S

    step_rows = [
        (c.chain_id, config_hash, i, len(c.conclusions), text, prem, concl, "given", "position", "bench")
        for c in items
        for i, (text, prem, concl) in enumerate(zip(c.step_texts, c.premises, c.conclusions, strict=True))
    ]
    ctx_rows = [(c.chain_id, config_hash, c.context, c.answer, "given") for c in items]

    # Through an RDD in slices, not a local relation: 100k chains would put ~100 MB into the query plan.
    def frame(rows, schema):
        slices = max(spark.sparkContext.defaultParallelism, len(rows) // 20_000)
        return spark.createDataFrame(spark.sparkContext.parallelize(rows, slices), schema)

    return frame(step_rows, S.SCHEMA), frame(ctx_rows, S.CONTEXTS_SCHEMA)
