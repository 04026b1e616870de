"""Sanity checks of the registered models once fetched (docs/MODELS.md): each loaded by its `registry:` path
through udfs.runtime.load_model (safetensors only, no remote code), on CPU, one thread unless told.

    python scripts/check_real_models.py [--threads N] [NAME...]

gemma3-270m: mean log-probability of " Paris" and of " Tokyo" after "The capital of France is".
qwen2.5-coder-0.5b-instruct: a short greedy reply through its chat template, with tokens per second.
all-mpnet-base-v2: cosine similarity (mean pooling, as its modules.json says) of a paraphrase and of an unrelated
sentence to one sentence.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from udfs.runtime import load_model  # noqa: E402


def mean_logprob(model, tokenizer, prefix: str, continuation: str) -> float:
    ids = tokenizer(prefix, return_tensors="pt").input_ids
    full = tokenizer(prefix + continuation, return_tensors="pt").input_ids
    with torch.no_grad():
        logp = torch.log_softmax(model(full).logits[0, :-1].float(), dim=-1)
    targets = full[0, ids.shape[1] :]
    picked = logp[ids.shape[1] - 1 :].gather(1, targets[:, None])[:, 0]
    return float(picked.mean())


def check_gemma() -> dict:
    model, tok = load_model("registry:gemma3-270m", "causal")
    prefix = "The capital of France is"
    return {name: round(mean_logprob(model, tok, prefix, name), 3) for name in (" Paris", " Tokyo")}


def check_qwen(max_new_tokens: int = 48) -> dict:
    model, tok = load_model("registry:qwen2.5-coder-0.5b-instruct", "causal")
    messages = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have? "
                                            "Answer step by step."}]  # fmt: skip
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    start = time.monotonic()
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    seconds = time.monotonic() - start
    new = out[0, ids["input_ids"].shape[1] :]
    return {"reply": tok.decode(new, skip_special_tokens=True), "new_tokens": int(new.shape[0]),
            "tokens_per_s": round(new.shape[0] / seconds, 1)}  # fmt: skip


def check_mpnet() -> dict:
    model, tok = load_model("registry:all-mpnet-base-v2", "embedding")
    texts = [
        "A man is playing a guitar.",
        "Someone plays an acoustic guitar.",
        "The stock market fell today.",
    ]
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    emb = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    return {"paraphrase": round(float(emb[0] @ emb[1]), 3), "unrelated": round(float(emb[0] @ emb[2]), 3)}


CHECKS = {
    "gemma3-270m": check_gemma,
    "qwen2.5-coder-0.5b-instruct": check_qwen,
    "all-mpnet-base-v2": check_mpnet,
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", default=list(CHECKS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.names:
        start = time.monotonic()
        result = CHECKS[name]()
        print(
            json.dumps({"model": name, **result, "seconds": round(time.monotonic() - start, 1)}), flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
