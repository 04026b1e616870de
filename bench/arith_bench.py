"""The arithmetic check (udfs/arith.py) measured on the labelled sets, without Spark or a model (issue 45).

    python bench/arith_bench.py measure [--data /work/shared/data] [--show-false-flags N]
    python bench/arith_bench.py speed [--repeat 3]

measure: ProcessBench GSM8K and MATH (steps as given; a step is flagged when one of its equations does not hold):
  checkable steps, chains flagged among the error-free ones, how many of the chains' first flags fall on the
  labelled first error, and ProcessBench's official F1 (its run_eval.py: the predicted earliest error is the first
  flagged step, else -1; F1 = harmonic mean of the accuracy on erroneous and on all-correct chains) of the check
  alone; the same for `ungrounded_numbers` alone and for the two together. ROSCOE GSM-8K (the 200 annotated
  chains read by jobs.metaeval.human_labels' adapter, steps as annotated): chain-level Somers' D
  (scipy.stats.somersd(label, score)) of arith_valid_min and -arith_errors_total against MathError (any step
  with "yes") and QUAL, and step-level precision / recall of arith_errors > 0 against each step's MathError
  answer. Prints Markdown.
speed: steps/s of udfs.arith.check_step over every ProcessBench and ROSCOE step (one process, one core), best of
  --repeat passes; compare with the NLI stage's steps/s in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # bench/ungrounded.py, also when this file is loaded by its path

from ungrounded import ungrounded_counts  # noqa: E402

from udfs import arith  # noqa: E402

NO_ERROR = -1


def load_processbench(data: Path, subset: str) -> list[dict]:
    return json.loads((data / "processbench" / f"{subset}.json").read_text(encoding="utf-8"))


def load_roscoe(data: Path) -> tuple[list[dict], list[dict]]:
    from jobs.infra.config_layers import load_settings
    from jobs.metaeval.human_labels import load_with_step_labels

    settings = load_settings(overrides=[f"paths.data={data}"], environ={})
    return load_with_step_labels(settings.human_labels)


def first_flag(flags: Sequence[bool]) -> int:
    return next((i for i, f in enumerate(flags) if f), NO_ERROR)


def official_f1(predicted: Sequence[int], labels: Sequence[int]) -> tuple[float, float, float]:
    """ProcessBench's run_eval.py: (acc_error, acc_correct, F1), in percent."""
    err = [p == y for p, y in zip(predicted, labels, strict=True) if y != NO_ERROR]
    ok = [p == y for p, y in zip(predicted, labels, strict=True) if y == NO_ERROR]
    acc_error = 100 * sum(err) / len(err) if err else 0.0
    acc_correct = 100 * sum(ok) / len(ok) if ok else 0.0
    f1 = 2 * acc_error * acc_correct / (acc_error + acc_correct) if acc_error + acc_correct else 0.0
    return acc_error, acc_correct, f1


def processbench_rows(items: list[dict], flagger: Callable[[dict], list[bool]]) -> dict:
    labels, predicted = [], []
    for item in items:
        labels.append(int(item["label"]))
        predicted.append(first_flag(flagger(item)))
    clean = [p for p, y in zip(predicted, labels, strict=True) if y == NO_ERROR]
    flagged = [(p, y) for p, y in zip(predicted, labels, strict=True) if p != NO_ERROR]
    on_label = sum(1 for p, y in flagged if p == y)
    after = sum(1 for p, y in flagged if y != NO_ERROR and p > y)
    acc_error, acc_correct, f1 = official_f1(predicted, labels)
    return {
        "chains": len(items), "erroneous": sum(1 for y in labels if y != NO_ERROR), "clean": len(clean),
        "clean_flagged": sum(1 for p in clean if p != NO_ERROR), "flagged": len(flagged), "on_label": on_label,
        "after_label": after, "acc_error": acc_error, "acc_correct": acc_correct, "f1": f1,
    }


def arith_flags(item: dict, cache: dict) -> list[bool]:
    checks = cache.setdefault(item["id"], [arith.check_step(s) for s in item["steps"]])
    return [c.errors > 0 for c in checks]


def ungrounded_flags(item: dict) -> list[bool]:
    return [n > 0 for n in ungrounded_counts(item["problem"], item["steps"])]


def measure(data: Path, show: int) -> str:
    lines = [f"## Arithmetic check (udfs/arith.py) on the labelled sets ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)", "",
             f"`python bench/arith_bench.py measure --data {data}`", ""]
    started = time.time()
    lines += ["### ProcessBench (steps as given)", "",
              "| subset | check | checkable steps | clean chains flagged | flags on the labelled step | "
              "after it | acc_error | acc_correct | F1 |", "|---|---|---|---|---|---|---|---|---|"]
    false_flags: list[str] = []
    for subset in ("gsm8k", "math"):
        items = load_processbench(data, subset)
        cache: dict = {}
        steps = [s for item in items for s in item["steps"]]
        checkable = sum(1 for item in items for c in (cache.setdefault(item["id"], [
            arith.check_step(s) for s in item["steps"]])) if c.checked)
        for name, flagger in (
            ("arith", lambda it, cache=cache: arith_flags(it, cache)),
            ("ungrounded_numbers", ungrounded_flags),
            ("arith, else ungrounded", lambda it, cache=cache: [a or u for a, u in zip(
                arith_flags(it, cache), ungrounded_flags(it), strict=True)]),
        ):
            r = processbench_rows(items, flagger)
            share = f"{checkable} / {len(steps)} ({100 * checkable / len(steps):.0f} %)" if name == "arith" else ""
            on = f"{r['on_label']} / {r['flagged']}" + (
                f" ({100 * r['on_label'] / r['flagged']:.0f} %)" if r["flagged"] else "")
            lines.append(
                f"| {subset} | {name} | {share} | {r['clean_flagged']} / {r['clean']} "
                f"({100 * r['clean_flagged'] / r['clean']:.1f} %) | {on} | {r['after_label']} | "
                f"{r['acc_error']:.1f} | {r['acc_correct']:.1f} | {r['f1']:.1f} |")
        for item in items:
            if int(item["label"]) == NO_ERROR:
                for c in cache[item["id"]]:
                    false_flags += [f"{subset} {item['id']}: {x.explain()}" for x in c.failed]
    lines += ["", f"({time.time() - started:.1f} s)", ""]
    if show:
        lines += ["False flags on error-free chains:", "", *[f"- `{f}`" for f in false_flags[:show]], ""]
    lines += roscoe_tables(data)
    return "\n".join(lines) + "\n"


def roscoe_tables(data: Path) -> list[str]:
    from scipy import stats

    started = time.time()
    records, step_rows = load_roscoe(data)
    checks = {r["chain_id"]: [arith.check_step(s) for s in r["steps"]] for r in records}
    ungrounded = {r["chain_id"]: ungrounded_counts(r["context"], r["steps"]) for r in records}
    scores = {
        "arith_valid_min (no equation: 1)": lambda cid: min((c.valid for c in checks[cid] if c.valid is not None),
                                                           default=1.0),
        "-arith_errors_total": lambda cid: -sum(c.errors for c in checks[cid]),
        "-ungrounded_numbers_total": lambda cid: -sum(ungrounded[cid]),
    }
    out = ["### ROSCOE GSM-8K (200 annotated chains, steps as annotated)", "",
           "Chain-level Somers' D (scipy.stats.somersd(label, score); label 1 = no error / higher rating):", "",
           "| score | MATH (MathError in any step) | QUAL |", "|---|---|---|"]
    for name, fn in scores.items():
        cells = []
        for label in ("MATH", "QUAL"):
            pairs = [(r["labels"][label], fn(r["chain_id"])) for r in records if r["labels"].get(label) is not None]
            y, s = zip(*pairs, strict=True)
            d = stats.somersd(y, s).statistic
            errors = sum(1 for v in y if v == min(y))
            cells.append(f"{d:.2f} (n={len(y)}, err={errors})" if label == "MATH" else f"{d:.2f} (n={len(y)})")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    math_steps = {(r["chain_id"], r["step_idx"]): r["value"] for r in step_rows if r["label"] == "MATH"}
    out += ["", "Step-level, against each step's MathError answer (`step_labels` label MATH; 0.0 = error):", "",
            "| flag | steps judged | MathError steps | flagged | precision | recall |", "|---|---|---|---|---|---|"]
    for name, flagged in (("arith_errors > 0", lambda cid, i: checks[cid][i].errors > 0),
                          ("ungrounded_numbers > 0", lambda cid, i: ungrounded[cid][i] > 0)):
        tp = fp = fn = 0
        for (cid, i), value in math_steps.items():
            f, e = flagged(cid, i), value == 0.0
            tp += f and e
            fp += f and not e
            fn += e and not f
        prec = f"{100 * tp / (tp + fp):.0f} % ({tp}/{tp + fp})" if tp + fp else "-"
        rec = f"{100 * tp / (tp + fn):.0f} % ({tp}/{tp + fn})" if tp + fn else "-"
        out.append(f"| {name} | {len(math_steps)} | {tp + fn} | {tp + fp} | {prec} | {rec} |")
    out += ["", f"({time.time() - started:.1f} s, the adapter included)", ""]
    return out


def speed(data: Path, repeat: int) -> str:
    texts = [s for subset in ("gsm8k", "math") for item in load_processbench(data, subset) for s in item["steps"]]
    records, _ = load_roscoe(data)
    texts += [s for r in records for s in r["steps"]]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for t in texts:
            arith.check_step(t)
        best = min(best, time.perf_counter() - t0)
    chars = sum(len(t) for t in texts)
    load = os.getloadavg()
    return "\n".join([
        f"## Arithmetic check steps/s ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node() or 'this machine'}, "
        f"{os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})", "",
        f"`python bench/arith_bench.py speed --repeat {repeat}`: udfs.arith.check_step over {len(texts)} steps "
        f"(ProcessBench GSM8K + MATH, ROSCOE GSM-8K; {chars / len(texts):.0f} characters per step), one core, best "
        f"of {repeat}:", "",
        "| steps | seconds | steps/s |", "|---|---|---|",
        f"| {len(texts)} | {best:.2f} | {len(texts) / best:,.0f} |", ""]) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["measure", "speed"])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("RECEVAL_DATA", "/work/shared/data")))
    parser.add_argument("--show-false-flags", type=int, default=0, metavar="N")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    text = measure(args.data, args.show_false_flags) if args.what == "measure" else speed(args.data, args.repeat)
    print(text)
    return text


if __name__ == "__main__":
    main()
