"""The one contract of the model-backed pandas UDFs (NLI, log-likelihood, option scoring, generation, sampling).

Every such UDF is an iterator pandas UDF built by `model_udf`: its model factory runs once per task, at the first
Arrow batch (the weights themselves are cached per worker by udfs.runtime), and each batch becomes one output
frame. Its rows are scored through `narrowed`, which holds the one error policy:

- the switch is `on_error` (runtime.on_row_error): "fail" raises at the first failure, naming what failed;
  "quarantine" gives each input that cannot be scored an error text and scores the others;
- a failing call is split in halves until the failing inputs stand alone, so one poisoned row costs O(log n)
  extra calls and never its batch (a CUDA out-of-memory shrinks the call the same way);
- an error text is "<ExceptionType>: <message>", cut at ERROR_CHARS characters.

No Spark reads or writes here; pyspark is imported only when a UDF is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Tuple, TypeVar  # noqa: UP035 (pandas_udf type hints need typing.Tuple)

import pandas as pd

ON_ERROR = ("fail", "quarantine")
ERROR_CHARS = 2000  # the error text kept per failed row (quarantine.detail)

T = TypeVar("T")


def error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:ERROR_CHARS]


def narrowed(
    call: Callable[[list[int]], Sequence[T]],
    n: int,
    on_error: str,
    what: str,
    describe: Callable[[int], str],
    unit: str = "rows",
) -> tuple[list[T | None], list[str | None]]:
    """(results, errors) for inputs 0..n-1: `call(indices)` returns one result per index, in order.

    All inputs go in one call; a call that raises (or returns a result count other than its inputs') is split
    in halves until the failing inputs stand alone (on_error="quarantine"), which get an error and no result.
    With on_error="fail" the first failure raises RuntimeError("<what> failed (<input or count>): <error>"),
    `describe(i)` naming input i when it failed alone.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, not {on_error!r}")
    results: list[T | None] = [None] * n
    errors: list[str | None] = [None] * n

    def run(idx: list[int]) -> None:
        try:
            out = list(call(idx))
            if len(out) != len(idx):
                raise ValueError(f"{len(out)} results for {len(idx)} {unit}")
        except Exception as err:
            if on_error == "fail":
                which = describe(idx[0])[:200] if len(idx) == 1 else f"{len(idx)} {unit}"
                raise RuntimeError(f"{what} failed ({which!r}): {error_text(err)}") from err
            if len(idx) == 1:
                errors[idx[0]] = error_text(err)
                return
            half = len(idx) // 2
            run(idx[:half])
            run(idx[half:])
            return
        for i, result in zip(idx, out, strict=True):
            results[i] = result

    if n:
        run(list(range(n)))
    return results, errors


def model_udf(
    name: str,
    return_type: Any,
    factory: Callable[[], Any],
    frame: Callable[..., pd.DataFrame],
    arity: int,
    nulls_as_empty: bool = True,
):
    """Iterator pandas UDF `name` over `arity` text columns: `frame(model, *columns as lists)` -> one frame a batch.

    `factory()` runs once per task, at its first batch (a model that cannot load is a job failure, not a row
    error; a task without rows loads nothing). A null reads as "" (`nulls_as_empty`, what the LM UDFs always
    did); NLI keeps its nulls (`False`), so a null premise stays a row error as before.
    """
    from pyspark.sql.functions import pandas_udf

    def frames(batches: Iterator[Any]) -> Iterator[pd.DataFrame]:
        model = None
        for batch in batches:
            columns = batch if isinstance(batch, tuple) else (batch,)
            if model is None:
                model = factory()
            yield frame(model, *[(c.fillna("") if nulls_as_empty else c).tolist() for c in columns])

    def named(fn: Callable) -> Callable:
        fn.__name__ = fn.__qualname__ = name  # the UDF's name in plans and unaliased column names
        return fn

    # pandas_udf tells an iterator UDF by its type hints, one signature per arity.
    if arity == 1:

        def one(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
            return frames(batches)

        return pandas_udf(named(one), return_type)
    if arity == 2:

        def two(batches: Iterator[Tuple[pd.Series, pd.Series]]) -> Iterator[pd.DataFrame]:  # noqa: UP006
            return frames(batches)

        return pandas_udf(named(two), return_type)
    if arity == 3:

        def three(batches: Iterator[Tuple[pd.Series, pd.Series, pd.Series]]) -> Iterator[pd.DataFrame]:  # noqa: UP006
            return frames(batches)

        return pandas_udf(named(three), return_type)
    raise ValueError(f"model_udf takes 1 to 3 columns, not {arity}")
