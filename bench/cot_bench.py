"""Direct option scoring on the BBH classification tasks: prompt-shared batched scoring vs an unbatched loop.

Same model, same inputs, one run: `udfs.options.score_options` (prompt encoded once per example, options
batched) against a loop calling `udfs.loglik.score` once per (example, option) with batch size 1. Reports
examples per second for both, the speed-up and the largest score difference, and appends a section to
bench/RESULTS.md.

    .venv/bin/python bench/cot_bench.py                  # 10 examples per task, both model families
    .venv/bin/python bench/cot_bench.py --limit 0        # every BBH classification example
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


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except Exception:
        return platform.processor() or "unknown"


def bench_models(root: Path, d_model: int, layers: int) -> dict[str, tuple[Path, str]]:
    """Timing-sized random T5 and GPT-2 (bigger than the test models, so model time, not Python, dominates)."""
    from jobs.infra.tiny_models import build_gpt2, build_t5

    t5, gpt2 = root / f"bench-t5-{d_model}x{layers}", root / f"bench-gpt2-{d_model}x{layers}"
    if not (t5 / "config.json").exists():
        build_t5(t5, d_model=d_model, layers=layers, heads=4)
    if not (gpt2 / "config.json").exists():
        build_gpt2(gpt2, d_model=d_model, layers=layers, heads=4)
    return {"seq2seq": (t5, "seq2seq"), "causal": (gpt2, "causal")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=10, help="examples per BBH task (0 = all)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-batch-tokens", type=int, default=2048, help="runtime.max_batch_tokens (0: none)")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--families", default="seq2seq,causal")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    from jobs.cot.data import load_bbh
    from jobs.cot.settings import CotSettings
    from jobs.infra.config_paths import resolve_path
    from udfs.cot_text import direct_prompt
    from udfs.loglik import score
    from udfs.options import score_options

    torch.set_num_threads(args.threads)
    rows = [r for r in load_bbh(resolve_path(CotSettings().data_root)) if r["options"] is not None]
    if args.limit:
        seen: dict[str, int] = {}
        kept = []
        for r in rows:
            seen[r["task"]] = seen.get(r["task"], 0) + 1
            if seen[r["task"]] <= args.limit:
                kept.append(r)
        rows = kept
    prompts = [direct_prompt(r["source"]) for r in rows]
    options = [r["options"] for r in rows]
    n_tasks = len({r["task"] for r in rows})
    n_options = sum(len(o) for o in options)
    header = [
        "",
        "## CoT evaluation: Direct option scoring on BBH (bench/cot_bench.py)",
        "",
        f"- Date: {dt.date.today().isoformat()}; machine: {_cpu()}, {args.threads} torch threads "
        f"({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start); device {args.device}.",
        f"- Inputs: {len(rows)} examples from {n_tasks} BBH classification tasks "
        f"({'all' if not args.limit else f'first {args.limit} per task'}), Direct prompt `source + \"\\n[ANSWER] \"`, "
        f"options as letters / label sets; max_length {args.max_length}.",
        f"- Models: random T5 / GPT-2 from jobs.infra.tiny_models, d_model {args.d_model}, {args.layers} layers "
        "(timing-sized; accuracy is meaningless).",
        f"- Shared: `udfs.options.score_options` (prompt encoded once per example, batch {args.batch_size}, "
        f"at most {args.max_batch_tokens or 'no'} padded positions per batch); "
        "loop: `udfs.loglik.score` once per (example, option), batch 1. One run, same process.",
        "- max |diff| = largest difference of option log-likelihoods between the two (untruncated examples); "
        "truncated = examples whose prompt was cut to max_length.",
        "",
        "| model | examples | options | shared ex/s | loop ex/s | speed-up | max abs diff | truncated |",
        "|---|---|---|---|---|---|---|---|",
    ]
    results = ROOT / "bench" / "RESULTS.md"
    if not args.no_record:
        with results.open("a") as f:
            f.write("\n".join(header) + "\n")
    for family in args.families.split(","):
        path, fam = bench_models(ROOT / "models", args.d_model, args.layers)[family]
        cls = AutoModelForCausalLM if fam == "causal" else AutoModelForSeq2SeqLM
        model = cls.from_pretrained(path).to(args.device).eval()
        tok = AutoTokenizer.from_pretrained(path)
        # Warm-up: first calls allocate and pick kernels.
        score_options(model, tok, fam, prompts[:2], options[:2], batch_size=2, max_length=args.max_length, device=args.device)

        start = time.perf_counter()
        shared = score_options(
            model, tok, fam, prompts, options, batch_size=args.batch_size, max_length=args.max_length,
            device=args.device, max_tokens=args.max_batch_tokens or None,
        )
        t_shared = time.perf_counter() - start

        side = "left" if fam == "causal" else "right"
        start = time.perf_counter()
        loop = [
            [score(model, tok, fam, [p], [o], 1, args.max_length, args.device, side)[0].sum_logprob for o in opts]
            for p, opts in zip(prompts, options, strict=True)
        ]
        t_loop = time.perf_counter() - start

        # Equal where nothing was truncated (the shared prompt is cut to the longest option when it is).
        diffs = [
            abs(s.sum_logprob - x)
            for ss, xs in zip(shared, loop, strict=True)
            for s, x in zip(ss, xs, strict=True)
            if not s.truncated
        ]
        n_trunc = sum(any(s.truncated for s in ss) for ss in shared)
        line = (
            f"| {fam} ({path.name}) | {len(rows)} | {n_options} | {len(rows) / t_shared:.1f} | "
            f"{len(rows) / t_loop:.1f} | **{t_loop / t_shared:.1f}x** | {max(diffs, default=0.0):.1e} | {n_trunc} |"
        )
        print(line, flush=True)
        if not args.no_record:
            with results.open("a") as f:
                f.write(line + "\n")

    if not args.no_record:
        print(f"appended to {results}")


if __name__ == "__main__":
    main()
