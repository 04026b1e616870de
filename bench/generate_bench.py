"""Generation throughput and fidelity of the project's batched generation on a real LM (issue 44).

One run, the same GSM-8K prompts (ROSCOE's GSM-8K test questions under sample_chains' zero-shot CoT prompt), one
model (default the registry's Qwen2.5-Coder-0.5B-Instruct, fp32), torch threads as given:
- raw:      `model.generate` on left-padded batches of `--batch` prompts (HF's own sampling when sampling);
- stage:    `udfs.generate.generate` as sample_chains and the CoT job call it (token-budget batches, per-row
            seeded sampling, end-of-turn stop tokens);
- batch 1:  the stage's generate one prompt at a time (on `--single` prompts: 10 tokens/s makes 64 take long);
- int8:     the stage's greedy generate with `dtype: int8` (dynamic int8 Linear layers), and how many greedy texts
            differ from fp32;
- equality: batched greedy vs one-at-a-time greedy on `--equal` prompts (`--equal-tokens` new tokens); where a
            text differs, the log-probabilities of the two competing tokens at the first difference (a near tie
            within 1e-3 nats is float noise of padding, not a bug).
Throughput = new tokens (before the end token) / wall seconds.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/generate_bench.py [--model registry:gemma3-270m] [--out f.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs.infra.config_paths import dataset_file  # noqa: E402
from jobs.selection.settings import SampleSettings  # noqa: E402


def prompts(n: int) -> list[str]:
    from udfs.sampling import prompt_for

    cfg = SampleSettings()
    path = dataset_file(cfg.questions_path, "sample.questions_path", "roscoe_gsm8k")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [prompt_for(cfg.prompt, r[cfg.question_field]) for r in rows[:n]]


def raw_generate(model, tok, texts: list[str], new: int, batch: int, sample: bool, seed: int) -> tuple[int, float]:
    """(new tokens, seconds) of plain transformers generate on left-padded batches."""
    import torch

    from udfs.generate import stop_token_ids

    eos = stop_token_ids(model, tok)
    tok.padding_side = "left"
    tokens, started = 0, time.perf_counter()
    torch.manual_seed(seed)
    for i in range(0, len(texts), batch):
        enc = tok(texts[i : i + batch], return_tensors="pt", padding=True)
        kw = dict(do_sample=True, temperature=0.7, top_p=1.0, top_k=None) if sample else dict(do_sample=False)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=new, eos_token_id=eos, pad_token_id=eos[0], **kw)
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            tokens += next((k for k, t in enumerate(row) if t in eos), len(row))
    return tokens, time.perf_counter() - started


def stage(model, tok, texts: list[str], new: int, batch: int, sample: bool, seed: int):
    from udfs.generate import generate

    started = time.perf_counter()
    out = generate(model, tok, "causal", texts, max_new_tokens=new, batch_size=batch, max_tokens=65536,
                   samples=[0] * len(texts) if sample else None, temperature=0.7, seed=seed, max_length=2048)
    return out, time.perf_counter() - started


def first_difference(model, tok, prompt: str, a: str, b: str) -> dict:
    """Log-probabilities of the two texts' first differing tokens after their common prefix (one unpadded pass)."""
    import torch

    ids_p = tok(prompt)["input_ids"]
    ta, tb = tok(a, add_special_tokens=False)["input_ids"], tok(b, add_special_tokens=False)["input_ids"]
    k = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))
    with torch.inference_mode():
        logits = model(torch.tensor([ids_p + ta[:k]])).logits[0, -1].float()
    logp = torch.log_softmax(logits, -1)
    pick = [t[k] if k < len(t) else None for t in (ta, tb)]
    values = [float(logp[t]) if t is not None else None for t in pick]
    gap = abs(values[0] - values[1]) if None not in values else None
    return {"position": k, "batched_token": pick[0], "single_token": pick[1], "logprobs": values, "gap": gap}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="registry:qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--single", type=int, default=8, help="prompts for the one-at-a-time throughput")
    ap.add_argument("--equal", type=int, default=64, help="prompts for batched vs one-at-a-time greedy")
    ap.add_argument("--equal-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", nargs="*", default=[], help="parts to skip: raw stage single int8 equality")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    from udfs import runtime

    torch.set_num_threads(args.threads)
    texts = prompts(args.prompts)
    model, tok = runtime.load_model(args.model, "causal", "cpu", "fp32")
    res: dict = {"model": args.model, "prompts": len(texts), "batch": args.batch, "new_tokens": args.new_tokens,
                 "threads": args.threads, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                 "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
                 "load_before": os.getloadavg()[0], "cpus": os.cpu_count(),
                 "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                          capture_output=True, text=True).stdout.strip()}  # fmt: skip

    def report(name: str, tokens: int, seconds: float, **extra) -> None:
        res[name] = {"tokens": tokens, "seconds": round(seconds, 1), "tokens_per_s": round(tokens / seconds, 1),
                     **extra}  # fmt: skip
        print(name, json.dumps(res[name]), flush=True)

    greedy = None
    if "raw" not in args.skip:
        report("raw_sample", *raw_generate(model, tok, texts, args.new_tokens, args.batch, True, 0))
        report("raw_greedy", *raw_generate(model, tok, texts, args.new_tokens, args.batch, False, 0))
    if "stage" not in args.skip:
        out, sec = stage(model, tok, texts, args.new_tokens, args.batch, True, 0)
        report("stage_sample", sum(g.n_tokens for g in out), sec, ended=sum(g.n_tokens < args.new_tokens for g in out))
        greedy, sec = stage(model, tok, texts, args.new_tokens, args.batch, False, 0)
        report("stage_greedy", sum(g.n_tokens for g in greedy), sec,
               ended=sum(g.n_tokens < args.new_tokens for g in greedy))  # fmt: skip
    if "single" not in args.skip:
        out, sec = stage(model, tok, texts[: args.single], args.new_tokens, 1, True, 0)
        report("stage_sample_batch1", sum(g.n_tokens for g in out), sec)
    if "int8" not in args.skip:
        quant, _ = runtime.load_model(args.model, "causal", "cpu", "int8")
        out, sec = stage(quant, tok, texts, args.new_tokens, args.batch, False, 0)
        changed = sum(a.text != b.text for a, b in zip(out, greedy, strict=True)) if greedy else None
        report("int8_greedy", sum(g.n_tokens for g in out), sec, texts_changed_vs_fp32=changed)
        del quant
    if "equality" not in args.skip:
        from udfs.generate import generate

        few = texts[: args.equal]
        batched = generate(model, tok, "causal", few, max_new_tokens=args.equal_tokens, batch_size=args.batch,
                           max_tokens=65536, max_length=2048)  # fmt: skip
        single = [generate(model, tok, "causal", [p], max_new_tokens=args.equal_tokens, max_length=2048)[0] for p in few]
        diffs = [dict(index=i, **first_difference(model, tok, p, a.text, b.text))
                 for i, (p, a, b) in enumerate(zip(few, batched, single, strict=True)) if a.text != b.text]  # fmt: skip
        res["equality"] = {"prompts": len(few), "new_tokens": args.equal_tokens,
                           "identical": len(few) - len(diffs), "differences": diffs}  # fmt: skip
        print("equality", json.dumps(res["equality"]), flush=True)
    for a, b in (("stage_sample", "raw_sample"), ("stage_greedy", "raw_greedy"), ("stage_sample", "stage_sample_batch1")):
        if a in res and b in res:
            res[f"ratio_{a}_vs_{b}"] = round(res[a]["tokens_per_s"] / res[b]["tokens_per_s"], 2)
    res["load_after"] = os.getloadavg()[0]
    print(json.dumps({k: v for k, v in res.items() if k.startswith("ratio")}))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
