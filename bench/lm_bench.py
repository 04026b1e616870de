"""PVI / information-gain scoring throughput: the Spark job vs the official shape vs raw batched forwards.

One run, the same EntailmentBank chains, one GPT-2-architecture causal LM (random weights, about 26M
parameters, built into a tmp folder) standing in for g, g' and the information-gain LM:
- official: an unbatched loop; per step two LM passes for info gain (L(i), L(i-1)), one g and one g' pass;
- raw:      the passes actually needed (n+1 per chain for info gain, g per step, g' per distinct conclusion),
            deduplicated, length-sorted and batched, shared prefixes run once (a chain's L(k), the constant g'
            source), in one process, no Spark;
- spark:    jobs.receval.pvi_scores.transform on local[2] (models warmed up in the workers first).
Throughput = needed target tokens / wall seconds (the same numerator for all three).

    .venv/bin/python bench/lm_bench.py [--chains 120] [--device cuda --dtype bf16]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs.infra.config_paths import resolve_path  # noqa: E402
from jobs.metaeval.settings import PerturbSettings  # noqa: E402

EB_TEST = resolve_path(PerturbSettings().eb_task1_test)  # python -m jobs.infra.data fetch entailment_bank


def eb_chains(limit: int) -> list[dict]:
    """EB test trees -> chains with steps, premises (fresh parent texts), conclusions and a_hat = hypothesis."""
    from jobs.metaeval import entailment_bank as eb

    out = []
    for cid, row in zip(eb.chain_ids(eb.load_jsonl(EB_TEST)), eb.load_jsonl(EB_TEST), strict=True):
        steps = eb.parse_proof(row["proof"])
        texts = eb.node_texts(row)
        rendered = eb.render(steps, texts)
        concluded: set[str] = set()
        premises = []
        for s in steps:
            premises.append([texts[p] for p in s.parents if p not in concluded])
            concluded.add(s.child)
        out.append({"chain_id": cid, "steps": rendered, "premises": premises,
                    "conclusions": [texts[s.child] for s in steps], "answer": texts[eb.HYPOTHESIS]})
        if len(out) >= limit:
            break
    return out


def official(model, tok, chains, device, stats=None) -> float:
    """Unbatched: for each step L(i) and L(i-1) recomputed, g and g' passes (4 passes per step)."""
    from udfs import loglik
    from udfs import pvi_prompts as P

    start = time.perf_counter()
    for c in chains:
        reqs = P.chain_requests(c["steps"], c["premises"], c["conclusions"], c["answer"])
        for r in reqs:  # g, null, ig_prev, ig_cur per step: every request, none shared
            loglik.score(model, tok, "causal", [r.source], [r.target], batch_size=1, device=device, stats=stats)
    return time.perf_counter() - start


def needed_pairs(chains) -> list[tuple[str, str]]:
    from udfs import pvi_prompts as P
    pairs = {(r.role, r.source, r.target) for c in chains
             for r in P.chain_requests(c["steps"], c["premises"], c["conclusions"], c["answer"])}
    return sorted(pairs)


def raw(model, tok, pairs, batch_size, device, max_tokens=None, stats=None) -> float:
    from udfs import loglik

    start = time.perf_counter()
    for role in ("pvi_g", "pvi_null", "info_gain"):
        mine = [(s, t) for r, s, t in pairs if r == role]
        loglik.score(model, tok, "causal", [s for s, _ in mine], [t for _, t in mine], batch_size=batch_size,
                     device=device, padding_side="left", share_prefix=True, max_tokens=max_tokens, stats=stats)
    return time.perf_counter() - start


def spark_run(spark, settings, chains) -> float:
    from jobs.receval import pvi_scores as P
    from schemas import steps as ST

    steps = [(c["chain_id"], "h", i, len(c["steps"]), text, prem, concl, "given", "position", "eb")
             for c in chains for i, (text, prem, concl) in enumerate(zip(c["steps"], c["premises"], c["conclusions"],
                                                                          strict=True))]
    ctx = [(c["chain_id"], "h", [], c["answer"], "given") for c in chains]
    steps_df = spark.createDataFrame(steps, ST.SCHEMA).cache()
    ctx_df = spark.createDataFrame(ctx, ST.CONTEXTS_SCHEMA).cache()
    steps_df.count(), ctx_df.count()
    start = time.perf_counter()
    scored = P.transform(steps_df, ctx_df, settings.pvi, settings.models, settings.runtime)
    rows = scored.where("error is null").count()
    elapsed = time.perf_counter() - start
    assert rows == len(steps), f"{rows} scored of {len(steps)} steps"
    return elapsed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=120)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-batch-tokens", type=int, default=2048, help="LM batch budget (runtime.max_batch_tokens)")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--no-write", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch

    from jobs.infra.config_layers import load_settings
    from jobs.infra.tiny_models import build_gpt2
    from udfs import loglik_batches, runtime

    tmp = Path(tempfile.mkdtemp(prefix="lm_bench_"))
    model_dir = build_gpt2(tmp / "gpt2-bench", d_model=args.d_model, layers=args.layers, heads=8, vocab=600)
    device = "cuda:0" if args.device == "cuda" else "cpu"
    model, tok = runtime.load_model(str(model_dir), "causal", device, args.dtype)
    n_params = sum(p.numel() for p in model.parameters())
    chains = eb_chains(args.chains)
    n_steps = sum(len(c["steps"]) for c in chains)
    pairs = needed_pairs(chains)
    tokens = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for _, _, t in pairs)
    official_passes = 4 * n_steps
    print(f"model {n_params / 1e6:.1f}M params, {len(chains)} chains, {n_steps} steps, "
          f"{len(pairs)} needed passes (official shape {official_passes}), {tokens} needed target tokens")

    torch.set_num_threads(2 if device == "cpu" else torch.get_num_threads())
    raw(model, tok, pairs[:64], args.batch_size, device, args.max_batch_tokens)  # warm-up
    # Positions run (padding excluded): the work each path does. Their ratio bounds the speed-up wherever both
    # run their forwards equally efficiently (as batch 1 and batched rows of ~100 tokens do on a CPU).
    need_work, off_work = loglik_batches.Stats(), loglik_batches.Stats()
    t_raw = raw(model, tok, pairs, args.batch_size, device, args.max_batch_tokens, need_work)
    print(f"raw batched: {t_raw:.1f}s, {need_work.positions} positions in {need_work.forwards} forwards")
    t_off = official(model, tok, chains, device, off_work)
    print(f"official shape: {t_off:.1f}s, {off_work.positions} positions in {off_work.forwards} forwards")
    bound = off_work.positions / need_work.positions

    from jobs.infra.session import build_session

    ref = f"{{path: {model_dir}, family: causal}}"
    settings = load_settings(overrides=[
        "spark.master=local[2]", "spark.shuffle_partitions=2", f"models.pvi_g={ref}", f"models.pvi_null={ref}",
        f"models.info_gain={ref}", f"runtime.device={args.device}", f"runtime.dtype={args.dtype}",
        f"pvi.batch_size={args.batch_size}", "runtime.on_row_error=fail", f"runtime.max_batch_tokens={args.max_batch_tokens}",
    ], environ={})
    spark = build_session(settings.spark, extra={"spark.driver.memory": "2g"})
    try:
        spark_run(spark, settings, chains[:4])  # warm-up: Python workers load the model once
        t_spark = spark_run(spark, settings, chains)
    finally:
        spark.stop()
    print(f"spark local[2]: {t_spark:.1f}s")

    rate = {k: tokens / v for k, v in (("official", t_off), ("raw", t_raw), ("spark", t_spark))}
    vs_official, vs_raw = t_off / t_spark, t_spark / t_raw
    print(f"tokens/s: official {rate['official']:.0f}, raw {rate['raw']:.0f}, spark {rate['spark']:.0f}; "
          f"spark = {vs_official:.2f}x official, {vs_raw:.2f}x raw time")
    if args.no_write:
        return
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout
    cpu = cpu.split(":", 1)[-1].strip()
    load = os.getloadavg()[0]
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else "none"
    section = f"""
## PVI / information-gain LM scoring (bench/lm_bench.py, {args.device} {args.dtype})

- Date: {dt.date.today().isoformat()}; machine: {cpu or platform.processor()}; cores: {os.cpu_count()}; GPU: {gpu};
  1-minute load average at the end: {load:.1f} (other jobs share the cores: compare ratios, not rates);
  Spark local[2]; torch threads: raw/official 2, Spark 1 per task (2 tasks).
- Model: GPT-2 architecture, random weights, {n_params / 1e6:.1f}M parameters (d_model {args.d_model},
  {args.layers} layers, vocab 600), used as g, g' and the information-gain LM; batch size {args.batch_size},
  at most {args.max_batch_tokens} padded positions per batch; shared prefixes run once (raw and Spark).
- Data: {len(chains)} EntailmentBank task_1 test chains, {n_steps} steps. Needed passes {len(pairs)}
  (n+1 per chain for L(k), one g per step, one g' per distinct conclusion, deduplicated) vs {official_passes}
  in the official shape (4 per step); {tokens} needed target tokens.
- Work: the official shape runs {off_work.positions} token positions in {off_work.forwards} forwards, the needed
  passes {need_work.positions} in {need_work.forwards} (shared prefixes once): {bound:.2f}x less, the speed-up
  to expect where both run their forwards equally efficiently.

| method | wall s | needed target tokens/s | vs official |
|---|---|---|---|
| official shape (unbatched loop, 4 passes/step) | {t_off:.1f} | {rate['official']:.0f} | 1.00x |
| raw batched forward of the needed passes (no Spark) | {t_raw:.1f} | {rate['raw']:.0f} | {t_off / t_raw:.2f}x |
| jobs.receval.pvi_scores.transform on local[2] | {t_spark:.1f} | {rate['spark']:.0f} | {vs_official:.2f}x |

Spark job time / raw batched time = {vs_raw:.2f} (target <= 1.3); Spark vs official = {vs_official:.2f}x
(target >= 2.5x on CPU, >= 20x on GPU).
"""
    results = ROOT / "bench" / "RESULTS.md"
    with results.open("a") as f:
        if results.stat().st_size == 0:
            f.write("# Benchmark results\n")
        f.write(section)
    print(f"appended to {results}")


if __name__ == "__main__":
    main()
