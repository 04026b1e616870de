"""Write bench/data/gpu_path_chains.jsonl, the scoring inputs of bench/device_gpu_path.py, from the bundled sample
lake: its 24 EB-challenge chains (8 EntailmentBank trees: gold, NEG, HALL) and 24 GSM-8K chains, split into steps
and RCUs by the steps job's own extraction (`jobs.receval.steps.explode_records`, default settings: sentence
boundaries, clause units, conjunction roles), so the device, which has no spaCy, scores what a night would.

    .venv/bin/python bench/make_gpu_path_data.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAKE = ROOT / "tests" / "data" / "sample_lake"
SOURCES = ("entailment_bank_sample.jsonl", "gsm8k_sample.jsonl")
OUT = ROOT / "bench" / "data" / "gpu_path_chains.jsonl"


def main() -> None:
    from jobs.infra.config_layers import load_settings
    from jobs.receval import steps
    from schemas import chains as C
    from schemas import steps as S

    opts = steps.Options.from_settings(load_settings(environ={}))
    records = []
    for name in SOURCES:
        for line in (LAKE / name).read_text().splitlines():
            row = json.loads(line)
            # The lake's "chain" text is ingest's chain_text; EB rows come with their steps given.
            records.append({**row, C.CHAIN_TEXT: row.get("chain")})
    rows = []
    for rec, out in zip(records, steps.explode_records(records, opts), strict=True):
        if out.get("error"):
            raise SystemExit(f"{rec[C.CHAIN_ID]}: {out['error']}: {out['detail']}")
        rows.append({
            "chain_id": rec[C.CHAIN_ID], "dataset": rec[C.DATASET], "context": out[S.CONTEXT_SENTENCES],
            "steps": [{"text": s[S.STEP_TEXT], "premises": list(s[S.PREMISE_RCUS]), "conclusion": s[S.CONCLUSION_RCU]}
                      for s in out["steps"]],
            "answer": out[S.ANSWER],
        })  # fmt: skip
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    n_steps = sum(len(r["steps"]) for r in rows)
    print(f"{OUT.relative_to(ROOT)}: {len(rows)} chains, {n_steps} steps, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
