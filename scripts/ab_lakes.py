"""Before/after equality of a refactoring: run the same jobs from two checkouts, then compare every table.

    git archive <before> | tar -x -C /tmp/before && ln -s "$PWD"/{.venv,.jars,.ivy,models} /tmp/before/
    .venv/bin/python -m jobs.infra.data fetch bbh mgsm p3_heldout entailment_bank roscoe_gsm8k --data /tmp/ab/data
    (cd /tmp/before && PYTHONPATH=$PWD "$OLDPWD"/.venv/bin/python "$OLDPWD"/scripts/ab_lakes.py run pipeline /tmp/ab/A)
    PYTHONPATH=$PWD .venv/bin/python scripts/ab_lakes.py run pipeline /tmp/ab/B      # the same for cot, eb
    PYTHONPATH=$PWD .venv/bin/python scripts/ab_lakes.py compare /tmp/ab/A/lake /tmp/ab/B/lake

`run` (from the checkout's root, which must be the working folder): `pipeline` is the nightly pipeline over the
sample lake plus the hostile-input corpus (tests/cluster.py's arguments); `cot` the CoT evaluation with the tiny
T5, one example a task of every dataset and the custom JSONL (test_cot_eval's); `eb` the EB challenge over 63
perturbed chains (test_eb_challenge's, perturb.max_rows=9). Offline models, local[2]; datasets from --data.

`compare`: both lakes hold the same Delta tables, each equal row for row with rtol=0, atol=0, once the columns
that say when or by which run a row was written (run ids, timestamps, input files' mtimes) are dropped and the
two runs' folders (in `source` and paths) are written as one name. Exits non-zero at the first difference.
Docs: docs/TESTING.md ("before/after equality").
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT / "tests"))

UNSTABLE = {"modified_ns"}  # besides tests/cluster.py's VOLATILE and every timestamp column


def _common(out: Path, data: Path) -> list[str]:
    from conftest import sqlite_store

    return [f"paths.lake={out}/lake", f"paths.checkpoints={out}/lake/_checkpoints",
            f"mlflow.tracking_uri={sqlite_store(out / 'mlruns.db')}", f"mlflow.artifact_location={out}/mlartifacts",
            "spark.master=local[2]", "spark.shuffle_partitions=2", f"paths.data={data}", "models.profile=offline",
            "pipeline.progress=plain"]  # fmt: skip


def run(kind: str, out: Path, data: Path) -> None:
    def argv(pairs: list[str]) -> list[str]:
        return [arg for pair in pairs for arg in ("--set", pair)]

    if kind == "pipeline":
        from cluster import job_args
        from conftest import copy_sample

        from jobs.receval import pipeline

        source = out / "input"
        copy_sample(source)
        shutil.copytree(ROOT / "tests/data/bad_input/files", source / "bad_input")
        print(pipeline.main(job_args(out / "lake", source, "spark.master=local[2]")).rows_after)
    elif kind == "cot":
        from jobs.cot import evaluate

        print(evaluate.main(argv([
            *_common(out, data), "models.cot.path=models/tiny-t5", "models.cot.family=seq2seq",
            "cot.max_examples_per_task=1", "cot.max_new_tokens=12", "cot.generation_max_new_tokens=12",
            "cot.direct_max_new_tokens=6", "cot.sample=false", "cot.bootstrap_resamples=50",
            "cot.custom_path=tests/data/cot_custom.jsonl",
        ])))  # fmt: skip
    else:
        from jobs.metaeval import eb_challenge

        pairs = [*_common(out, data), "perturb.max_rows=9", "human_labels.max_rows=12",
                 "meta_eval.bootstrap_resamples=50", "perturb.paraphrase_max_new_tokens=8"]  # fmt: skip
        print(eb_challenge.main([*argv(pairs), "--out", str(out / "out")])["perturb"])


def compare(a: Path, b: Path, folders: list[str]) -> None:
    from cluster import VOLATILE
    from pyspark.sql import functions as F
    from pyspark.testing import assertDataFrameEqual

    from jobs.infra.config_layers import load_settings
    from jobs.infra.session import build_session

    spark = build_session(load_settings(overrides=["spark.master=local[2]"]).spark)
    same = "(" + "|".join(re.escape(f.rstrip("/") + "/") for f in [str(a.parent), str(b.parent), *folders]) + ")"

    def names(lake: Path) -> list[str]:
        return sorted(str(p.parent.relative_to(lake)) for p in lake.rglob("_delta_log") if "_checkpoints" not in str(p))

    def load(lake: Path, name: str):
        df = spark.read.format("delta").load(str(lake / name))
        df = df.drop(*[c for c, t in df.dtypes if c in VOLATILE | UNSTABLE or t.startswith("timestamp")])
        return df.select([F.regexp_replace(c, same, "/X/").alias(c) if t == "string" else F.col(c)
                          for c, t in df.dtypes])  # fmt: skip

    if names(a) != names(b):
        raise SystemExit(f"different tables: {names(a)} vs {names(b)}")
    for name in names(a):
        want = load(a, name)
        assertDataFrameEqual(load(b, name), want, rtol=0.0, atol=0.0)
        print(f"{name}: equal, {want.count()} rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("kind", choices=["pipeline", "cot", "eb"])
    r.add_argument("out", type=Path)
    r.add_argument("--data", type=Path, default=Path("/tmp/ab/data"))
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--same", nargs="*", default=[], help="more folders to write as one name (the checkouts)")
    args = parser.parse_args()
    if args.cmd == "run":
        run(args.kind, args.out.resolve(), args.data.resolve())
    else:
        compare(args.a.resolve(), args.b.resolve(), args.same)


if __name__ == "__main__":
    main()
