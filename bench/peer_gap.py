"""Where the last 1e-4 nats of the real-model peer check go (issue 44 item 4): our Direct option log-likelihoods and
lm-evaluation-harness's (HFLM) on the same prompts, each against a float64 reference computed one pair at a time.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/peer_gap.py [--model qwen2.5-coder-0.5b-instruct] [--chat]

The prompts and options (`pairs_of`: 5 BBH tasks, a seeded 10 examples each, every option) are also the manual
peer test's (tests/udfs/test_cot_peer_real_models.py imports them from here). Four float32 scorings: ours (udfs.options.score_options, the CoT job's path,
batch 32 and batch 1) and lm-eval's (HFLM.loglikelihood, batch 8 and batch 1); one float64 reference (the same
weights cast to float64, `[prefix] + context + option` in one unpadded forward per pair, the option's tokens
summed). Prints max / mean |difference| of every pairing, in nats. A gap that both sides share against float64
is float32 arithmetic (matmul shapes, padding); one that only one side has is a protocol difference.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TASKS = ("date_understanding", "disambiguation_qa", "logical_deduction_five_objects", "movie_recommendation",
         "geometric_shapes")  # fmt: skip
PER_TASK = 10


def pairs_of(tok, chat: bool) -> tuple[list[str], list[list[str]]]:
    from jobs.cot.data import load_bbh
    from jobs.cot.settings import CotSettings
    from jobs.infra.config_paths import resolve_path
    from udfs.cot_prompt import build_prompts

    cfg = CotSettings()
    rows = load_bbh(resolve_path(cfg.data_root), TASKS)
    rng = random.Random(0)
    chosen = [r for t in TASKS for r in rng.sample([x for x in rows if x["task"] == t], PER_TASK)]
    prompts = [p for p, _ in build_prompts(tok, [r["source"] for r in chosen], cfg.direct_suffix, cfg.max_length,
                                           chat=chat)]  # fmt: skip
    return prompts, [list(r["options"]) for r in chosen]


def reference(model, tok, prompts: list[str], options: list[list[str]]) -> list[float]:
    """float64, one pair per forward, no padding: context's trailing whitespace moved into the option (as both
    ours with move_space and lm-eval do), the tokenizer's own prefix (BOS) first when it has one."""
    import torch

    from udfs.loglik import causal_prefix

    prefix = causal_prefix(tok)
    out = []
    for prompt, opts in zip(prompts, options, strict=True):
        for option in opts:
            context, continuation = prompt, option
            stripped = context.rstrip()
            continuation, context = context[len(stripped):] + continuation, stripped
            ctx = tok(context, add_special_tokens=False)["input_ids"]
            whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
            cont = whole[len(ctx):]
            ids = torch.tensor([[*prefix, *whole]])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].double()
            logp = torch.log_softmax(logits, dim=-1)
            start = len(prefix) + len(whole) - len(cont)
            out.append(float(sum(logp[start - 1 + i, t] for i, t in enumerate(cont))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--chat", action="store_true", help="the chat template (as the peer test does for Qwen)")
    args = parser.parse_args()
    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from udfs import options as O
    from udfs.runtime import load_model, registry_folder

    folder = str(registry_folder(args.model))
    model, tok = load_model(folder, "causal", "cpu", "fp32")
    prompts, options = pairs_of(tok, args.chat)
    pairs = [(p, o) for p, opts in zip(prompts, options, strict=True) for o in opts]
    got: dict[str, list[float]] = {}
    seconds: dict[str, float] = {}
    for batch in (32, 1):
        t0 = time.time()
        got[f"ours b{batch}"] = [s.sum_logprob for row in O.score_options(
            model, tok, "causal", prompts, options, batch_size=batch, move_space=True) for s in row]  # fmt: skip
        seconds[f"ours b{batch}"] = time.time() - t0
    for batch in (8, 1):
        lm = HFLM(pretrained=folder, backend="causal", device="cpu", dtype="float32", batch_size=batch)
        requests = [Instance(request_type="loglikelihood", doc={}, arguments=p, idx=i) for i, p in enumerate(pairs)]
        t0 = time.time()
        got[f"lm-eval b{batch}"] = [lp for lp, _ in lm.loglikelihood(requests, disable_tqdm=True)]
        seconds[f"lm-eval b{batch}"] = time.time() - t0
        del lm
    t0 = time.time()
    got["float64"] = reference(model.double(), tok, prompts, options)
    seconds["float64"] = time.time() - t0
    names = list(got)
    print(f"{args.model} (chat={args.chat}): {len(pairs)} option scorings, {len(TASKS)} BBH tasks, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    print("| scoring | seconds | max abs vs float64 | mean abs vs float64 | max abs vs lm-eval b8 | within 1e-4 of lm-eval b8 |")
    print("|---|---|---|---|---|---|")
    ref, peer = np.array(got["float64"]), np.array(got["lm-eval b8"])
    for n in names:
        v = np.array(got[n])
        within = int((np.abs(v - peer) <= 1e-4).sum())
        print(f"| {n} | {seconds[n]:.0f} | {np.abs(v - ref).max():.2e} | {np.abs(v - ref).mean():.2e} | "
              f"{np.abs(v - peer).max():.2e} | {within} / {len(v)} |")


if __name__ == "__main__":
    main()
