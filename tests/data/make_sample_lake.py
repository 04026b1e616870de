"""Regenerate the bundled sample lake from the ROSCOE GSM-8K generations (MIT; see tests/data/README.md).

    python -m jobs.infra.data fetch roscoe_gsm8k && python tests/data/make_sample_lake.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "data"  # paths.data, where `python -m jobs.infra.data` lays the datasets out


def gsm8k_rows(n: int = 24) -> list[dict]:
    rows = []
    with (DATA / "roscoe" / "generated" / "gsm8k.json").open() as f:
        for line in f:
            item = json.loads(line)
            chain = item["gpt-3"].strip()
            gold = item["hypothesis"].rsplit("A:", 1)[-1].strip()
            pred = chain.rsplit("A:", 1)[-1].strip() if "A:" in chain else None
            # "A: 18" is an answer line, not a reasoning step: keep the steps, give the answer separately.
            steps_text = re.sub(r"\n?A:\s*[^\n]*$", "", chain).strip()
            rows.append(
                {
                    "chain_id": item["key"],
                    "dataset": "gsm8k",
                    "question_id": item["key"],
                    "context": item["premise"],
                    "chain": steps_text,
                    "answer": pred,
                    "gold_answer": gold,
                    "labels": {"verifier_correct": 1.0 if item["answer"] == "yes" else 0.0},
                    "metadata": {"model": "gpt-3", "source": "roscoe/generated/gsm8k.json"},
                }
            )
            if len(rows) == n:
                break
    return rows


BAD_ROWS = [
    {"chain_id": "bad-no-context", "chain": "She sold 72 clips."},
    {"chain_id": "bad-empty-chain", "context": "A question.", "chain": "   "},
    {"chain_id": "bad-steps-type", "context": "A question.", "steps": "not a list"},
]


def main() -> None:
    out = HERE / "sample_lake"
    out.mkdir(exist_ok=True)
    with (out / "gsm8k_sample.jsonl").open("w") as f:
        for row in gsm8k_rows():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with (out / "bad_rows.jsonl").open("w") as f:
        for row in BAD_ROWS:
            f.write(json.dumps(row) + "\n")
        f.write("{this is not json\n")


if __name__ == "__main__":
    main()
