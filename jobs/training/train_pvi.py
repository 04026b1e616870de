"""Gold chains (EntailmentBank trees or JSONL gold step lists) -> a fine-tuned seq2seq PVI model (folder + MLflow run).

Three kinds of model (docs/design/RECEVAL.md "Training the PVI models"), trained on exactly the strings the scoring job
(jobs.receval.pvi_scores) sends:
- g:         "Generate entailed sentence: " + " & ".join(premises + earlier conclusions) + " ->"  ->  " " + conclusion
             (no premise text: the official empty join "Generate entailed sentence:  ->", pvi.empty_premises)
- g_null:    "Generate entailed sentence: None ->"  ->  " " + conclusion
- info_gain: "Generate final answer:" + " " + " ".join(s(1..k)) + " Therefore,"  ->  " " + answer, k = 0..n
Recipe (paper): AdamW lr 3e-5, weight decay 0.1, 10 epochs, batch 16, early stopping on dev ROUGE-L
(rouge-score), label padding -100; every value is in `train_pvi` settings. Split (defaults): EntailmentBank task_1
train to train, task_1 dev to early-stop; a train or dev path to EB test trees (the EB-challenge's source) is
refused before anything is read. The best dev epoch's model (dev ROUGE-L, or dev loss with
`train_pvi.select_on: loss`; not the last epoch) is saved to
`<train_pvi.output_dir>/<kind>` (point models.pvi_g.path / pvi_null.path / info_gain.path there) and logged to
the MLflow run as the MLflow model `pvi_<kind>` (pyfunc; registered under `train_pvi.registered_model` when set)
and as the artifact folder `model`.

    python -m jobs.training.train_pvi --set train_pvi.kind=g --set train_pvi.epochs=10
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jobs.infra.config import Settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.progress import Progress
from jobs.infra.stage import Job, Stage
from jobs.training.settings import TrainPviSettings
from udfs import pvi_prompts as P
from udfs.model_paths import PVI_RECORD

log = logging.getLogger(__spec__.name)

KINDS = ("g", "g_null", "info_gain")
SCRATCH = "scratch"  # train_pvi.base_model: a T5 from random weights (train_pvi.scratch), tokenizer from the split


# --- training pairs (plain Python) -------------------------------------------------------------------------


def _eb_chain(row: Mapping[str, Any]) -> tuple[list[str], list[list[str]], list[str], str]:
    """EB tree -> (rendered steps, premises per step (facts and non-earlier nodes), conclusions, hypothesis)."""
    from jobs.metaeval import entailment_bank as eb

    steps = eb.parse_proof(row["proof"])
    texts = eb.node_texts(row)
    rendered = eb.render(steps, texts)
    concluded: set[str] = set()
    premises: list[list[str]] = []
    for s in steps:
        # Earlier conclusions are added by chain_requests (as when scoring); parents that are earlier
        # conclusions would otherwise appear twice.
        premises.append([texts[p] for p in s.parents if p not in concluded])
        concluded.add(s.child)
    return rendered, premises, [texts[s.child] for s in steps], texts[eb.HYPOTHESIS]


def _generic_chain(row: Mapping[str, Any]) -> tuple[list[str], list[list[str]], list[str], str | None]:
    """{"steps": [...], "answer": ...}: every step is a conclusion whose premises are the earlier steps."""
    steps = [str(s) for s in row["steps"]]
    return steps, [[] for _ in steps], steps, row.get("answer")


def chain_pairs(row: Mapping[str, Any], kind: str, empty_premises: str = "empty_join") -> list[tuple[str, str]]:
    """(source, target) training pairs of one gold chain for a model kind."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if "proof" in row:
        texts, premises, conclusions, answer = _eb_chain(row)
    elif isinstance(row.get("steps"), list):
        texts, premises, conclusions, answer = _generic_chain(row)
    else:
        raise ValueError("a gold chain row needs an EntailmentBank 'proof' or a 'steps' list")
    family = "seq2seq"
    # The scoring job's own strings (pvi.empty_premises included): g learns exactly the inputs it will score.
    reqs = P.chain_requests(texts, premises, conclusions, answer, family, "all", empty_premises)
    if kind == "g":
        return [(r.source, r.target) for r in reqs if r.kind == P.G]
    if kind == "g_null":
        return [(r.source, r.target) for r in reqs if r.kind == P.NULL]
    # L(0..n): the first step's "previous" source then every step's own.
    ig = [r for r in reqs if r.kind == P.IG_CUR or (r.kind == P.IG_PREV and r.step_idx == 0)]
    return [(r.source, r.target) for r in ig]


def load_rows(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Gold chains from JSONL (EB v2 trees or step lists) or an EB processed TSV (`.tsv`, task_1 train's form)."""
    if str(path).endswith(".tsv"):
        from jobs.metaeval import entailment_bank as eb

        rows = eb.load_tsv(resolve_path(path))
        return rows[:limit] if limit is not None else rows
    rows = []
    with resolve_path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if limit is not None and len(rows) >= limit:
                break
    return rows


def build_pairs(
    rows: Iterable[Mapping[str, Any]], kind: str, limit: int | None = None, empty_premises: str = "empty_join"
) -> list[tuple[str, str]]:
    pairs = [p for row in rows for p in chain_pairs(row, kind, empty_premises)]
    return pairs[:limit] if limit is not None else pairs


def corpus(rows: Iterable[Mapping[str, Any]], empty_premises: str = "empty_join") -> list[str]:
    """Every distinct source and target string the three kinds train on, in first-seen order: the scratch
    tokenizer's corpus. The same for every kind, so g, g' and the info-gain model share one tokenizer."""
    seen: dict[str, None] = {}
    for row in rows:
        for kind in KINDS:
            for source, target in chain_pairs(row, kind, empty_premises):
                seen.setdefault(source, None)
                seen.setdefault(target, None)
    return list(seen)


def build_scratch_base(texts: Sequence[str], cfg: TrainPviSettings, out: Path) -> Path:
    """A random T5 of `cfg.scratch`'s size with a byte-level BPE tokenizer trained on `texts` (the training split:
    never dev or test), written to `out`; identical for the same texts and seed."""
    from jobs.infra.tiny_models import build_t5

    s = cfg.scratch
    return build_t5(out, d_model=s.d_model, layers=s.layers, heads=s.heads, vocab=s.vocab, seed=cfg.seed,
                    d_ff=s.d_ff, corpus=texts, tie=True)


def is_eb_test(path: str | Path, settings: Settings) -> bool:
    """True for EntailmentBank test trees: the perturbation job's inputs, or any file named *test* in an
    entailment_bank folder (EB v2 jsonl, the processed TSVs, the test excerpts under tests/data)."""
    resolved = resolve_path(path).resolve()
    perturbed = {resolve_path(p).resolve() for p in (settings.perturb.eb_task1_test, settings.perturb.eb_task2_test)
                 if p}
    in_eb = any("entailment_bank" in part for part in resolved.parts)
    return resolved in perturbed or (in_eb and "test" in resolved.name.lower())


def check_split(settings: Settings) -> None:
    """Refuse to train or early-stop on EB test trees, before anything is read: the EB-challenge is built from
    them, so a checkpoint chosen on them is chosen on the evaluation data (issue #17)."""
    cfg = settings.train_pvi
    for key, path in (("train_path", cfg.train_path), ("dev_path", cfg.dev_path)):
        if is_eb_test(path, settings):
            raise ValueError(
                f"train_pvi.{key}={path} is EntailmentBank test data, which the EB-challenge is built from: train "
                "on task_1 train and early-stop on task_1 dev (the defaults, "
                f"{TrainPviSettings().train_path} and {TrainPviSettings().dev_path})"
            )


# --- training (torch) --------------------------------------------------------------------------------------


def _collate(tokenizer: Any, pairs: Sequence[tuple[str, str]], cfg: TrainPviSettings, device: str):

    enc = tokenizer([s for s, _ in pairs], max_length=cfg.max_source_length, truncation=True,
                    padding=True, return_tensors="pt")
    # Targets keep EOS here so the model learns to stop; scoring leaves EOS out of meanlogp.
    lab = tokenizer([t for _, t in pairs], max_length=cfg.max_target_length, truncation=True,
                    padding=True, return_tensors="pt")
    labels = lab["input_ids"].masked_fill(lab["attention_mask"] == 0, -100)
    return {"input_ids": enc["input_ids"].to(device), "attention_mask": enc["attention_mask"].to(device),
            "labels": labels.to(device)}


def evaluate(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], cfg: TrainPviSettings, device: str):
    """(dev loss, dev ROUGE-L F1 of greedy generations against the targets)."""
    import torch
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    model.eval()
    losses, rouges = [], []
    with torch.inference_mode():
        for i in range(0, len(pairs), cfg.batch_size):
            chunk = pairs[i : i + cfg.batch_size]
            batch = _collate(tokenizer, chunk, cfg, device)
            losses.append(float(model(**batch).loss) * len(chunk))
            gen = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 max_new_tokens=cfg.eval_max_new_tokens, num_beams=1, do_sample=False)
            for text, (_, ref) in zip(tokenizer.batch_decode(gen, skip_special_tokens=True), chunk, strict=True):
                rouges.append(scorer.score(ref.strip(), text.strip())["rougeL"].fmeasure)
    n = max(len(pairs), 1)
    return sum(losses) / n, (sum(rouges) / len(rouges) if rouges else 0.0)


def train(
    train_pairs: Sequence[tuple[str, str]],
    dev_pairs: Sequence[tuple[str, str]],
    cfg: TrainPviSettings,
    out_dir: Path,
    device: str = "cpu",
    log_every: float = 30.0,
    evaluate_fn: Callable[..., tuple[float, float]] | None = None,
) -> list[dict[str, float]]:
    """Fine-tune `cfg.base_model`; the best dev epoch (`cfg.select_on`) is saved to `out_dir`. Returns per-epoch
    metrics, `kept` = 1.0 on the epoch whose weights are in `out_dir` (the first epoch with the best dev score, gains
    below `min_delta` not counting). Progress (optimizer steps done, rate, ETA) is logged at least every
    `log_every` seconds. `evaluate_fn` (default `evaluate`, same arguments) scores the dev pairs after each epoch."""
    evaluate_fn = evaluate_fn or evaluate
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from udfs.runtime import resolve_model_path

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    base = resolve_model_path(cfg.base_model)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSeq2SeqLM.from_pretrained(base, use_safetensors=True).to(device)
    no_decay = ("bias", "layer_norm", "LayerNorm", "layernorm")
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
         "weight_decay": cfg.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    optim = torch.optim.AdamW(groups, lr=cfg.lr)
    order = list(train_pairs)
    history: list[dict[str, float]] = []
    best, stale, steps = -math.inf, 0, 0
    per_epoch = math.ceil(len(order) / cfg.batch_size)
    planned = min(cfg.epochs * per_epoch, cfg.max_steps or cfg.epochs * per_epoch)
    # Driver-only work: the progress counts optimizer steps (each a batch of pairs), with rate and ETA.
    with Progress("train_pvi", planned, "steps", every=log_every, spark=None, logger=log) as progress:
        for epoch in range(1, cfg.epochs + 1):
            model.train()
            random.shuffle(order)
            total, seen, started = 0.0, 0, time.time()
            for i in range(0, len(order), cfg.batch_size):
                if cfg.max_steps is not None and steps >= cfg.max_steps:
                    break
                chunk = order[i : i + cfg.batch_size]
                loss = model(**_collate(tokenizer, chunk, cfg, device)).loss
                optim.zero_grad()
                loss.backward()
                optim.step()
                steps += 1
                progress.commit(1)
                total += float(loss.detach()) * len(chunk)
                seen += len(chunk)
            dev_loss, rouge_l = evaluate_fn(model, tokenizer, dev_pairs, cfg, device)
            history.append({"epoch": epoch, "train_loss": total / max(seen, 1), "dev_loss": dev_loss,
                            "dev_rouge_l": rouge_l, "optimizer_steps": steps, "epoch_seconds": time.time() - started,
                            "kept": 0.0})
            score = rouge_l if cfg.select_on == "rouge_l" else -dev_loss
            if score > best + cfg.min_delta:
                best, stale = score, 0
                for h in history:
                    h["kept"] = float(h is history[-1])
                out_dir.mkdir(parents=True, exist_ok=True)
                model.save_pretrained(out_dir, safe_serialization=True)
                tokenizer.save_pretrained(out_dir)
            else:
                stale += 1
            log.info(f"[train_pvi] epoch {epoch}: {history[-1]}")  # after the choice: `kept` is this epoch's
            if stale >= cfg.patience:
                log.info(f"[train_pvi] early stop: dev {cfg.select_on} did not improve for {stale} epochs")
                break
            if cfg.max_steps is not None and steps >= cfg.max_steps:
                break
    return history


def output_dir(settings: Settings) -> Path:
    return resolve_path(settings.train_pvi.output_dir) / settings.train_pvi.kind


def run(settings: Settings, job=None) -> tuple[Path, list[dict[str, float]]]:
    """Build pairs, train, save; per-epoch metrics and the model folder are logged by `main` / the caller."""
    from udfs.runtime import task_device

    cfg = settings.train_pvi
    check_split(settings)
    if settings.runtime.torch_threads:
        import torch

        # As the scoring UDFs do: beside other work on few cores, more threads than free cores spin and stall.
        torch.set_num_threads(settings.runtime.torch_threads)
    empty = settings.pvi.empty_premises
    train_rows = load_rows(cfg.train_path)
    train_pairs = build_pairs(train_rows, cfg.kind, cfg.max_train_rows, empty)
    dev_pairs = build_pairs(load_rows(cfg.dev_path), cfg.kind, cfg.max_dev_rows, empty)
    if not train_pairs or not dev_pairs:
        raise ValueError(f"no training ({len(train_pairs)}) or dev ({len(dev_pairs)}) pairs for kind {cfg.kind!r}")
    out = output_dir(settings)
    if cfg.base_model == SCRATCH:
        # Built beside the kinds' folders; every kind rebuilds the same base (same split, same seed).
        base = build_scratch_base(corpus(train_rows, empty), cfg, out.parent / f"{SCRATCH}-base")
        log.info(f"[train_pvi] scratch base: T5 {cfg.scratch.model_dump()} with a BPE tokenizer trained on "
                 f"{cfg.train_path} -> {base}")
        cfg = cfg.model_copy(update={"base_model": str(base)})
    history = train(train_pairs, dev_pairs, cfg, out, task_device(settings.runtime.device), settings.log.progress_seconds)
    # PVI_RECORD beside the weights marks a trained checkpoint of this kind (models.require_trained_pvi).
    best_epoch = next(int(h["epoch"]) for h in history if h["kept"])
    (out / PVI_RECORD).write_text(json.dumps({"kind": cfg.kind, "best_epoch": best_epoch, "history": history,
                                              "empty_premises": empty,
                                              "base_model_dir": cfg.base_model,
                                              "settings": settings.train_pvi.model_dump(mode="json")}, indent=1))
    if job is not None:
        job.log_metrics({"train_pairs": len(train_pairs), "dev_pairs": len(dev_pairs), "epochs_run": len(history),
                         "best_epoch": best_epoch,
                         "best_dev_rouge_l": max(h["dev_rouge_l"] for h in history),
                         "final_train_loss": history[-1]["train_loss"]})
        job.set_tags({"pvi_kind": cfg.kind, "model_dir": str(out)})
        job.log_text("train_pvi/epochs.json", json.dumps(history, indent=1))
        job.log_text("train_pvi/sample_pairs.json", json.dumps(train_pairs[:20], indent=1))
    role = next(r for r, k in P.TRAINED_KIND.items() if k == cfg.kind)
    log.info(f"[train_pvi] model saved to {out}; score with --set models.{role}.path={out}")
    return out, history


def _plan(spark: Any, settings: Settings, args: Any) -> list[str]:
    cfg = settings.train_pvi
    return [f"  would train a {cfg.kind} model from {cfg.base_model} on {cfg.train_path} (dev {cfg.dev_path}) into "
            f"{output_dir(settings)}"]


def _body(job: Job) -> str | None:
    """Train; per-epoch metrics (step = epoch) and the best model as an MLflow model; returns its runs:/ URI."""
    settings, tracked = job.settings, job.tracked
    out, history = run(settings, tracked)
    for h in history:
        tracked.log_metrics({k: v for k, v in h.items() if k != "epoch"}, step=int(h["epoch"]))
    # The MLflow model (registrable, mlflow.pyfunc.load_model) and, as before, the plain folder as the run
    # artifact `model`, which the scoring job loads by path after a download.
    tracked.log_model(out, f"pvi_{settings.train_pvi.kind}", settings.train_pvi.registered_model)
    tracked.log_folder("model", out)
    if tracked.run_id is None:
        return None
    uri = f"runs:/{tracked.run_id}/model"
    log.info("[train_pvi] MLflow model %s%s", uri, f" registered as {settings.train_pvi.registered_model}"
             if settings.train_pvi.registered_model else "")
    return uri


STAGE = Stage("train_pvi", __doc__, _body, section="train_pvi", uses_spark=False, plan=_plan,
              # Before the MLflow run: a refused split leaves nothing behind.
              check=lambda settings, args: check_split(settings))


def main(argv: list[str] | None = None) -> str | None:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
