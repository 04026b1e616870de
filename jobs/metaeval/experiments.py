"""The ReCEval paper's remaining EB-challenge experiments, one command each (issue #17 item 5).

- `api_k`: the share of chains for which API_k holds (every window of k consecutive information-gain values sums
  to > 0), gold chains against the perturbed chains of each type (paper: REP, PAR, RED), k in
  `aggregate.api_k`, each share with its n and a Wilson 95% interval. Reads a lake the EB-challenge was scored
  in (`jobs.metaeval.eb_challenge`, same config), scores nothing. Gold: the clean chains of every challenge
  type, one per tree (a tree left clean under several types is the same chain, scored the same).
- `history`, `boundary`: ablations. The EB-challenge is perturbed once, then scored and meta-evaluated under each
  variant (a named set of overrides, `ABLATIONS`: how many earlier conclusions join a step's premises or are
  checked for contradiction; one step per proof step or the whole chain as one step); every variant's scores
  live in the same lake under their own config hash, so a rerun does only what is missing. Output: Somers' D
  [95% CI] per variant x type for each metric in `meta_eval.metrics`.

Each writes `<out>/<experiment>.md` and `.json` and logs both to MLflow.

    python -m jobs.metaeval.experiments api_k --set paths.lake=/tmp/me/lake --set models.profile=small --out DIR
    python -m jobs.metaeval.experiments history --set models.profile=small --set perturb.max_rows=60 --out DIR
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from scipy import stats

from jobs.infra import tables
from jobs.infra.config import Settings
from jobs.infra.config_layers import load_settings
from jobs.infra.stage import Job, Stage
from jobs.infra.tracking import JobRun
from jobs.metaeval import eb_challenge
from schemas import chain_scores as CS
from schemas import chains as C
from schemas import meta_eval as M

log = logging.getLogger(__spec__.name)

# name -> variant -> overrides. The first variant of each is the default configuration (the official logic).
ABLATIONS: dict[str, dict[str, list[str]]] = {
    # Paper: all preceding steps is best for inter-step correctness; the official intra premise adds them all.
    # The default picks the closest earlier conclusions (nli.*_history = relevant: the same as all on chains whose
    # steps have at most nli.inter_top_k candidates and nli.intra_top_k earlier conclusions).
    "history": {
        "relevant earlier conclusions (default)": [],
        "all earlier conclusions (official)": ["nli.intra_history=all", "nli.inter_history=all"],
        "intra: none": ["nli.intra_history=none", "pvi.intra_history=none"],
        "inter: last 1": ["nli.inter_history=1"],
    },
    # Paper: sentence-level steps beat RCU-level and whole-chain steps. EB proofs arrive one step per proof step
    # (boundary "given"); `whole` joins them into one step whose units are extracted. RCU-level steps are not
    # an option of the steps job.
    "boundary": {
        "one step per proof step (default)": [],
        "whole chain as one step": ["steps.boundary=whole"],
    },
}
EXPERIMENTS = ("api_k", *ABLATIONS)
GOLD = "gold"


# --- API_k shares (driver-side: one row per challenge chain) -------------------------------------------------


def challenge_type(dataset: str, prefix: str) -> str | None:
    """`eb_challenge_HALL` -> `HALL` (None for other datasets)."""
    head = f"{prefix}_"
    return dataset[len(head):] if dataset.startswith(head) else None


def api_k_frame(chain_scores: DataFrame, chains: DataFrame, config_hash: str, ks: Sequence[int],
                prefix: str) -> DataFrame:
    """(chain_id, dataset, clean, api_1..api_k) of the challenge chains scored under `config_hash`; `clean` is
    the chain's `{TYPE}` label (1 clean, 0 perturbed)."""
    labelled = chains.where(F.col(C.DATASET).startswith(f"{prefix}_")).select(
        C.CHAIN_ID, C.DATASET, C.LABELS)
    scored = chain_scores.where(F.col(CS.CONFIG_HASH) == config_hash).select(
        CS.CHAIN_ID, *[F.col(f"api_{k}") for k in ks])
    kind = F.substring_index(F.col(C.DATASET), "_", -1)
    return labelled.join(scored, C.CHAIN_ID).select(
        C.CHAIN_ID, C.DATASET, F.element_at(C.LABELS, kind).alias("clean"), *[f"api_{k}" for k in ks])


def share(hits: int, n: int, level: float = 0.95) -> dict[str, Any]:
    """{"share", "low", "high", "n", "hits"}: the share with its Wilson interval (scipy); n = 0 gives None."""
    if n == 0:
        return {"share": None, "low": None, "high": None, "n": 0, "hits": 0}
    ci = stats.binomtest(hits, n).proportion_ci(confidence_level=level, method="wilson")
    return {"share": hits / n, "low": float(ci.low), "high": float(ci.high), "n": n, "hits": hits}


def api_k_rows(rows: Sequence[Mapping[str, Any]], ks: Sequence[int], types: Sequence[str], prefix: str,
               level: float = 0.95) -> list[dict[str, Any]]:
    """Rows of `api_k_frame` -> one row per group (gold, then each type's perturbed chains) with a share per k.
    Gold is one clean chain per tree (`<dataset>:<tree id>` chain ids): the same tree left clean under several
    types is one gold chain. A chain whose API_k is null (no information gain) counts in no share of that k."""
    gold: dict[str, Mapping[str, Any]] = {}
    perturbed: dict[str, list[Mapping[str, Any]]] = {t: [] for t in types}
    for row in rows:
        kind = challenge_type(row[C.DATASET], prefix)
        if row["clean"] == 1:
            gold.setdefault(row[C.CHAIN_ID].split(":", 1)[-1], row)
        elif row["clean"] == 0 and kind in perturbed:
            perturbed[kind].append(row)
    groups = [(GOLD, list(gold.values())), *((t, perturbed[t]) for t in types)]
    out = []
    for name, members in groups:
        entry: dict[str, Any] = {"group": name}
        for k in ks:
            values = [m[f"api_{k}"] for m in members if m[f"api_{k}"] is not None]
            entry[f"api_{k}"] = share(sum(bool(v) for v in values), len(values), level)
        out.append(entry)
    return out


def api_k_markdown(rows: Sequence[Mapping[str, Any]], ks: Sequence[int]) -> str:
    head = "| chains | " + " | ".join(f"API_{k} [95% CI] (n)" for k in ks) + " |"
    lines = [head, "|---|" + "---|" * len(ks)]
    for row in rows:
        cells = []
        for k in ks:
            s = row[f"api_{k}"]
            cells.append("-" if s["share"] is None else
                         f"{s['share']:.2f} [{s['low']:.2f}, {s['high']:.2f}] ({s['n']})")
        label = "gold (clean, one per tree)" if row["group"] == GOLD else f"{row['group']} (perturbed)"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_api_k(spark: SparkSession, settings: Settings, types: Sequence[str]) -> tuple[list[dict], str]:
    ks = list(settings.aggregate.api_k)
    frame = api_k_frame(tables.read(spark, settings.table("chain_scores"), CS.SCHEMA),
                        tables.read(spark, settings.table("chains"), C.SCHEMA), settings.scoring_hash(), ks,
                        settings.perturb.dataset_prefix)
    rows = api_k_rows([r.asDict() for r in frame.collect()], ks, types, settings.perturb.dataset_prefix,
                      settings.meta_eval.ci_level)
    return rows, api_k_markdown(rows, ks)


# --- ablations --------------------------------------------------------------------------------------------


def variant_settings(base_overrides: Sequence[str], variant: Sequence[str], config: str | None = None) -> Settings:
    """The job's own settings with a variant's overrides on top (the variant wins)."""
    return load_settings(config, [*base_overrides, *variant])


def ablation_markdown(results: Mapping[str, Sequence[Mapping[str, Any]]], metrics: Sequence[str],
                      types: Sequence[str], prefix: str) -> str:
    """One table per metric: variant x type, Somers' D [CI] (n) of the `{TYPE}` label."""
    parts = []
    for metric in metrics:
        parts.append(f"#### {metric}\n")
        parts.append("| variant | " + " | ".join(types) + " |")
        parts.append("|---|" + "---|" * len(types))
        for variant, rows in results.items():
            cells = []
            for t in types:
                hit = [r for r in rows if r[M.METRIC] == metric and r[M.DATASET] == f"{prefix}_{t}"
                       and r[M.LABEL] == t]
                r = hit[0] if hit else None
                cells.append("-" if r is None or r[M.SOMERS_D] is None else
                             f"{r[M.SOMERS_D]:.2f} [{r[M.CI_LOW]:.2f}, {r[M.CI_HIGH]:.2f}] ({r[M.N]})")
            parts.append(f"| {variant} | " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts) + "\n"


def run_ablation(spark: SparkSession, name: str, base_overrides: Sequence[str], config: str | None,
                 tracked: JobRun) -> tuple[dict[str, list[dict]], str]:
    """Perturb once, then score and meta-evaluate each variant of ABLATIONS[name]; (variant -> meta_eval rows,
    the tables). Every variant reads the same perturbed chains (same lake)."""
    variants = ABLATIONS[name]
    first = variant_settings(base_overrides, [], config)
    eb_challenge.run(spark, first, tracked, ["perturb"])
    results: dict[str, list[dict]] = {}
    for variant, overrides in variants.items():
        settings = variant_settings(base_overrides, overrides, config)
        log.info(f"[experiments] {name}: variant {variant!r} ({' '.join(overrides) or 'defaults'}), "
                 f"config hash {settings.scoring_hash()}")
        child = tracked.child(f"{name}: {variant}")
        report = eb_challenge.run(spark, settings, child, ["score", "meta_eval"])
        child.log_text("meta_eval/correlations.md", report.get("table", ""))
        meta = tables.read(spark, settings.table("meta_eval"), M.SCHEMA).where(
            F.col(M.CONFIG_HASH) == settings.scoring_hash())
        results[variant] = [r.asDict() for r in meta.collect()]
        child.end("FINISHED")
    table = ablation_markdown(results, first.meta_eval.metrics, first.perturb.types, first.perturb.dataset_prefix)
    return results, table


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", choices=EXPERIMENTS)
    parser.add_argument("--out", help="folder for <experiment>.md and <experiment>.json")


def _plan(spark: SparkSession | None, settings: Settings, args: argparse.Namespace) -> list[str]:
    return [f"experiments {args.experiment}: variants "
            f"{list(ABLATIONS.get(args.experiment, {'(reads the scored lake)': []}))}"]


def _body(job: Job) -> str:
    spark, settings, args, tracked = job.spark, job.settings, job.args, job.tracked
    if args.experiment == "api_k":
        rows, table = run_api_k(spark, settings, settings.perturb.types)
        payload: Any = rows
    else:
        payload, table = run_ablation(spark, args.experiment, args.overrides, args.config, tracked)
    tracked.log_text(f"experiments/{args.experiment}.md", table)
    tracked.log_text(f"experiments/{args.experiment}.json", json.dumps(payload, indent=1, default=str))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.experiment}.md").write_text(table)
        (out / f"{args.experiment}.json").write_text(json.dumps(payload, indent=1, default=str))
    print(table)
    return table


# A composition of the EB-challenge's stages (every variant scores and meta-evaluates the perturbed chains).
STAGE = Stage("experiments", __doc__, _body, arguments=_arguments, plan=_plan, parts=(eb_challenge.STAGE,),
              run_name=lambda args: f"experiments_{args.experiment}")


def main(argv: list[str] | None = None) -> str:
    return STAGE.main(argv)


if __name__ == "__main__":
    main()
