"""CoT evaluation metrics: predictions (pandas, one row per example and mode) -> `cot_metrics` rows.

Pure maths on the driver (one row per group, small): accuracy per template and per task, per dataset the macro
mean over tasks (a templated task counts with its median over templates, as T0 reports) and the micro mean over
rows, each with a bootstrap percentile interval (scipy.stats.bootstrap). No Spark: jobs/cot/storage.py turns the
rows into the table's frame and writes them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from schemas import cot as S
from schemas import metrics as MR


def _bootstrap(samples: list[np.ndarray], tasks: list[int], resamples: int, confidence: float, seed: int):
    """Percentile CI of mean over tasks of (median over the task's samples of the sample mean).

    One sample per task reduces to a mean of task means (macro); one sample to the plain mean. Samples are
    resampled independently (stratified by task/template), with scipy.stats.bootstrap.
    """
    from scipy.stats import bootstrap

    if not samples or any(len(s) < 2 for s in samples):
        return None, None
    groups = sorted(set(tasks))

    def stat(*arrays: np.ndarray, axis: int = -1) -> np.ndarray:
        means = [a.mean(axis=axis) for a in arrays]
        per_task = [np.median(np.stack([m for m, t in zip(means, tasks, strict=True) if t == g]), axis=0) for g in groups]
        return np.mean(np.stack(per_task), axis=0)

    if all(np.all(s == s[0]) for s in samples) and len({float(s[0]) for s in samples}) == 1:
        value = float(samples[0][0])  # no spread: every resample gives the same value
        return value, value
    res = bootstrap(
        tuple(samples), stat, n_resamples=resamples, confidence_level=confidence, method="percentile",
        vectorized=True, paired=False, batch=max(1, 20_000_000 // max(1, sum(len(s) for s in samples))),
        rng=np.random.default_rng(seed),
    )  # fmt: skip
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def compute_metrics(pred: pd.DataFrame, resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Predictions (dataset, task, template, mode, model, correct, numeric_correct, correct_per_*) -> metric rows.

    Per template and per task; per dataset the macro mean over tasks (a templated task counts with its
    median over templates, as T0 reports) and the micro mean over rows; bootstrap CIs beside each value.
    """
    columns = {m.name: m.source for m in MR.of_table(MR.COT_METRICS)}  # metric -> its predictions column
    out: list[dict[str, Any]] = []
    for (dataset, mode, model), part in pred.groupby([S.DATASET, S.MODE, S.MODEL], sort=True):
        for metric, column in columns.items():
            if column not in part:  # predictions from before the column existed
                continue
            rows = part[part[column].notna()]
            if rows.empty:
                continue

            def add(aggregate: str, group: str, samples: list[np.ndarray], tasks: list[int], value: float,
                    ids: tuple[str, str, str, str] = (dataset, mode, model, metric)) -> None:  # fmt: skip
                low, high = _bootstrap(samples, tasks, resamples, confidence, seed)
                dataset_, mode_, model_, metric_ = ids
                out.append({S.DATASET: dataset_, S.MODE: mode_, S.MODEL: model_, S.AGGREGATE: aggregate,
                            S.GROUP: group, S.METRIC_NAME: metric_, S.VALUE: value, S.CI_LOW: low,
                            S.CI_HIGH: high, S.N: int(sum(len(s) for s in samples))})  # fmt: skip

            samples: list[np.ndarray] = []
            owners: list[int] = []
            task_values: list[float] = []
            for t_index, (task, trows) in enumerate(rows.groupby(S.TASK, sort=True)):
                values = trows[column].astype(float).to_numpy()
                templated = trows[S.TEMPLATE].notna()
                add("task", task, [values], [0], float(values.mean()))
                if templated.any():
                    per_template = []
                    t_samples = []
                    for template, prows in trows[templated].groupby(S.TEMPLATE, sort=True):
                        v = prows[column].astype(float).to_numpy()
                        add("template", f"{task}/{template}", [v], [0], float(v.mean()))
                        per_template.append(float(v.mean()))
                        t_samples.append(v)
                    add("median_template", task, t_samples, [0] * len(t_samples), float(np.median(per_template)))
                    samples += t_samples
                    owners += [t_index] * len(t_samples)
                    task_values.append(float(np.median(per_template)))
                else:
                    samples.append(values)
                    owners.append(t_index)
                    task_values.append(float(values.mean()))
            add("macro", "*", samples, owners, float(np.mean(task_values)))
            all_values = rows[column].astype(float).to_numpy()
            add("micro", "*", [all_values], [0], float(all_values.mean()))
    return pd.DataFrame(out, columns=[f.name for f in S.METRICS_SCHEMA.fields if f.name not in (S.RUN_ID, S.COMPUTED_AT)])
