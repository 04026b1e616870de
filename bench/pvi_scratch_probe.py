"""Step time of train_pvi's scratch T5 at three sizes (bench/RESULTS.md "Small PVI models").

12 optimizer steps (batch 16, AdamW 5e-4) on shuffled EntailmentBank task_1 train g pairs per size, one torch
thread; prints parameters, the median step time and the losses (they start at ~ln(vocab) with the tied output
layer). Needs the entailment_bank dataset (`make data`).

    OMP_NUM_THREADS=1 python bench/pvi_scratch_probe.py
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from jobs.infra.config_layers import load_settings
from jobs.training import train_pvi as T

SIZES = ((256, 2, 8000, 1024), (128, 2, 4000, 512), (192, 3, 6000, 768))  # d_model, layers, vocab, d_ff


def main() -> None:
    torch.set_num_threads(1)  # beside other work, more threads than free cores spin and stall
    settings = load_settings(overrides=["models.profile=small"])
    rows = T.load_rows(settings.train_pvi.train_path)
    texts = T.corpus(rows)
    pairs = T.build_pairs(rows, "g")
    random.Random(0).shuffle(pairs)
    for d_model, layers, vocab, d_ff in SIZES:
        scratch = settings.train_pvi.scratch.model_copy(
            update={"d_model": d_model, "layers": layers, "vocab": vocab, "d_ff": d_ff, "heads": 4})
        cfg = settings.train_pvi.model_copy(update={"scratch": scratch})
        base = T.build_scratch_base(texts, cfg, Path(tempfile.mkdtemp()) / "base")
        tok = AutoTokenizer.from_pretrained(base)
        model = AutoModelForSeq2SeqLM.from_pretrained(base).train()
        optim = torch.optim.AdamW(model.parameters(), lr=5e-4)
        seconds, losses = [], []
        for i in range(12):
            batch = T._collate(tok, pairs[i * 16 : (i + 1) * 16], cfg, "cpu")
            started = time.time()
            loss = model(**batch).loss
            optim.zero_grad()
            loss.backward()
            optim.step()
            seconds.append(time.time() - started)
            losses.append(round(float(loss), 2))
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"d_model {d_model}, {layers}+{layers} layers, vocab {vocab}: {params:.1f}M parameters, "
              f"median step {statistics.median(seconds):.3f} s, losses {losses}", flush=True)


if __name__ == "__main__":
    main()
