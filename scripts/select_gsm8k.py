"""Chain selection on GSM-8K in one command (the ReCEval paper's downstream selection): sample -> score -> select.

    .venv/bin/python scripts/select_gsm8k.py [--config FILE] [--set section.key=value ...]

1. `jobs.selection.sample_chains`: k samples + one greedy decode per question (sample.* settings) -> JSONL;
2. `jobs.receval.pipeline` on that JSONL (ingest.input set to it; stages ingest, steps, scores, aggregate);
3. `jobs.selection.select_chains` on the sample's dataset: ReCEval reranking vs greedy vs self-consistency.
The same --config/--set go to all three (paths.lake, models.*, sample.*, select.*); one Spark session serves them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from any folder, as `python scripts/...`


def main(argv: list[str] | None = None) -> list[dict]:
    from jobs.infra.stage import with_built_models
    from jobs.receval import pipeline
    from jobs.selection import sample_chains, select_chains

    argv = with_built_models(list(sys.argv[1:] if argv is None else argv))
    started = time.time()
    counts = sample_chains.main(argv)
    sampled = time.time()
    scored_argv = [*argv, "--set", f"ingest.input={counts['output']}",
                   "--set", "pipeline.stages=[ingest,steps,scores,aggregate]"]  # fmt: skip
    pipeline.main(scored_argv)
    scored = time.time()
    settings_argv = [*argv, "--set", f"select.datasets=[{_dataset(argv)}]"]
    rows = select_chains.main(settings_argv)
    done = time.time()
    print(f"run time: {done - started:.0f} s (sample {sampled - started:.0f} s, pipeline {scored - sampled:.0f} s, "
          f"select {done - scored:.0f} s)")  # fmt: skip
    return rows


def _dataset(argv: list[str]) -> str:
    from jobs.infra.stage import settings_of

    return settings_of(argv).sample.dataset


if __name__ == "__main__":
    main()
