"""Ingest throughput: `ingest.preset=lm_eval` on lm-eval samples lines vs the plain mapping on flat rows.

The same N chains both ways (the flat rows hold what the preset reads out of the samples lines: id, task,
question, prompt, chain, answer, gold, the preset's metadata), one process, one Spark session (local[2]):
a warm-up ingest each way, then rounds alternating the order. Reports JSON parsing alone and the validator
alone (plain Python, `ingest_rows.validate_series` over all rows; CPU seconds) and `ingest.run` end to end (read, validate, write `chains`), and
appends a section to bench/RESULTS.md.

    PYTHONPATH=$PWD .venv/bin/python bench/ingest_preset_bench.py            # 10,000 rows, 2 rounds
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RUN = "2026-12-03T13-25-50.880841"
TASK = "gsm_bench"


def rows(n: int) -> tuple[list[str], list[str]]:
    """(lm-eval samples lines, flat rows) holding the same chains."""
    samples, flat = [], []
    for i in range(n):
        question = f"Tom has {i} apples and buys 5 more. How many apples does he have?"
        prompt = f"Q: {question}\nA: Let's think step by step."
        chain = f"Tom starts with {i} apples. He buys 5 more, so {i} + 5 = {i + 5}. The answer is {i + 5}."
        samples.append(json.dumps({
            "doc_id": i, "doc": {"question": question, "answer": f"{i} + 5 = {i + 5}\n#### {i + 5}"},
            "target": str(i + 5),
            "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": {"until": ["Q:"], "do_sample": False}}},
            "resps": [[chain]], "filtered_resps": [str(i + 5)], "filter": "get-answer", "metrics": ["exact_match"],
            "doc_hash": "0" * 64, "prompt_hash": "1" * 64, "target_hash": "2" * 64, "exact_match": 1.0,
        }))
        flat.append(json.dumps({
            "chain_id": f"{TASK}/{RUN}/{i}/get-answer", "dataset": TASK, "question_id": f"{TASK}/{i}",
            "context": question, "question": prompt, "chain": chain, "answer": str(i + 5), "gold_answer": str(i + 5),
            "metadata": {"model": "bench-model", "task": TASK, "doc_id": str(i), "filter": "get-answer",
                         "producer": "lm_eval"},
        }))
    return samples, flat


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print, do not append to bench/RESULTS.md")
    args = parser.parse_args()

    import pandas as pd

    from jobs.infra.config_layers import load_settings
    from jobs.infra.session import build_session
    from jobs.receval import ingest, ingest_readers, ingest_rows

    work = Path(tempfile.mkdtemp(prefix="ingest_bench_"))
    samples, flat = rows(args.rows)
    folder = work / "lmeval"
    folder.mkdir()
    (folder / f"samples_{TASK}_{RUN}.jsonl").write_text("\n".join(samples) + "\n")
    (folder / f"results_{RUN}.json").write_text(json.dumps({"model_name": "bench-model"}))
    (work / "flat").mkdir()
    (work / "flat" / "rows.jsonl").write_text("\n".join(flat) + "\n")

    def settings(kind: str, lake: Path):
        base = [f"paths.lake={lake}", f"paths.checkpoints={lake}/_checkpoints", "mlflow.enabled=false",
                "spark.master=local[2]", "spark.shuffle_partitions=2"]
        if kind == "preset":
            return load_settings(overrides=[*base, "ingest.preset=lm_eval",
                                            f"ingest.input={folder}/samples_{TASK}_{RUN}.jsonl"], environ={})
        return load_settings(overrides=[*base, f"ingest.input={work / 'flat'}"], environ={})

    # the validator alone: the same chains out both ways (the preset's ids and metadata included)
    cfg_preset, cfg_plain = settings("preset", work / "x").ingest, settings("plain", work / "x").ingest
    ctx = json.dumps({"_file": ingest_readers.lm_eval_file(str(folder / f"samples_{TASK}_{RUN}.jsonl"))})
    a = ingest_rows.validate_series(pd.Series(samples[:200]), cfg_preset, ctx=pd.Series([ctx] * 200))
    b = ingest_rows.validate_series(pd.Series(flat[:200]), cfg_plain)
    assert [v[0]["record"] for v in a] == [v[0]["record"] for v in b], "the two inputs do not give the same chains"
    # CPU seconds of this process (the machine is shared: wall time of a 1 s loop is mostly other jobs' noise)
    validator: dict[str, list[float]] = {"preset": [], "plain": []}
    parse: dict[str, list[float]] = {"preset": [], "plain": []}
    for r in range(args.rounds * 2 + 1):
        for kind in (("preset", "plain") if r % 2 else ("plain", "preset")):
            start = time.process_time()
            if kind == "preset":
                ingest_rows.validate_series(pd.Series(samples), cfg_preset, ctx=pd.Series([ctx] * len(samples)))
            else:
                ingest_rows.validate_series(pd.Series(flat), cfg_plain)
            took = time.process_time() - start
            start = time.process_time()
            for text in samples if kind == "preset" else flat:
                json.loads(text)
            if r:
                validator[kind].append(took)
                parse[kind].append(time.process_time() - start)

    spark = build_session(settings("plain", work / "x").spark, extra={"spark.driver.memory": "2g"})
    end_to_end: dict[str, list[float]] = {"preset": [], "plain": []}
    for r in range(args.rounds + 1):
        for kind in (("preset", "plain") if r % 2 else ("plain", "preset")):
            s = settings(kind, work / f"lake_{kind}_{r}")
            start = time.perf_counter()
            counts = ingest.run(spark, s)
            took = time.perf_counter() - start
            assert counts["inserted"] == args.rows and counts["reconciled"], counts
            if r:
                end_to_end[kind].append(took)
    spark.stop()

    def line(name: str, times: dict[str, list[float]]) -> str:
        p, q = statistics.median(times["plain"]), statistics.median(times["preset"])
        return (f"| {name} | {args.rows / p:,.0f} | {args.rows / q:,.0f} | {q / p:.3f} | "
                f"{', '.join(f'{t:.2f}' for t in times['plain'])} / {', '.join(f'{t:.2f}' for t in times['preset'])} |")

    load = os.getloadavg()[0]
    text = "\n".join([
        "", "## Ingest throughput: lm_eval preset vs the plain mapping (bench/ingest_preset_bench.py)", "",
        f"- date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {os.cpu_count()} cores shared "
        f"with other jobs; load average at the end: {load:.1f}",
        f"- {args.rows:,} rows each way, the same chains (ids, metadata) out; one process, Spark local[2]; a warm-up "
        f"each way, then {args.rounds} rounds alternating the order ({args.rounds * 2} for the CPU-time parts); "
        f"medians. The lm-eval lines are {sum(map(len, samples)) / sum(map(len, flat)):.1f}x the flat rows' "
        "characters (doc, arguments, hashes): the parse row is what the input format alone costs",
        "", "| part | plain rows/s | preset rows/s | preset / plain time | seconds plain / preset |",
        "|---|---:|---:|---:|---|",
        line("json.loads of the rows alone (CPU s)", parse),
        line("validator alone (validate_series, CPU s)", validator),
        line("ingest.run (read, validate, write chains; wall s)", end_to_end),
        "",
    ])
    print(text)
    if not args.no_write:
        with (ROOT / "bench" / "RESULTS.md").open("a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
