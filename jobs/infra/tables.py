"""Delta table access shared by the jobs: create, idempotent upsert, versions, quarantine."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from delta import exceptions as delta_errors
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from jobs.infra.config import Settings
from schemas import quarantine as Q

log = logging.getLogger(__spec__.name)

# Delta's commit conflicts (optimistic concurrency: another writer committed what this transaction read).
CONFLICTS = (
    delta_errors.DeltaConcurrentModificationException, delta_errors.ConcurrentWriteException,
    delta_errors.MetadataChangedException, delta_errors.ProtocolChangedException,
    delta_errors.ConcurrentAppendException, delta_errors.ConcurrentDeleteReadException,
    delta_errors.ConcurrentDeleteDeleteException, delta_errors.ConcurrentTransactionException,
)
# Attempts of an insert-only MERGE that lost its commit to a concurrent writer, and the first wait (doubled each
# time, with jitter so two losers do not collide again): 1 + 2 + 4 + 8 s ~ 15 s, longer than any one MERGE of a
# night here. A lake claimed by one run sees no conflict; these cover a writer that holds no claim (--force, a
# notebook), and give up with a clear word rather than spin.
COMMIT_ATTEMPTS = 5
FIRST_BACKOFF_S = 1.0


def now() -> Column:
    """This moment as a timestamp literal, for the `*_at` columns. Not `F.current_timestamp()`: a Delta MERGE
    whose source holds that expression never finds the source in the cache, so every persisted frame written
    with it was computed again by its MERGE: the scores stage ran its NLI and PVI models twice per batch
    (tests/jobs/test_score.py counts them)."""
    return F.lit(datetime.now(UTC)).cast("timestamp")


class CommitConflict(RuntimeError):
    """An idempotent write lost every attempt to concurrent writers of its table."""


def committed(path: str, write: Callable[[], int], attempts: int = COMMIT_ATTEMPTS,
              backoff_s: float = FIRST_BACKOFF_S) -> int:
    """`write()` (an idempotent commit: built and run again on each attempt, so it reads the table's newest
    version), retried with backoff when Delta reports a concurrent modification; CommitConflict at the end."""
    for attempt in range(1, attempts + 1):
        try:
            return write()
        except CONFLICTS as err:
            kind = type(err).__name__
            if attempt == attempts:
                raise CommitConflict(
                    f"{path}: {attempts} commits in a row lost to concurrent writers ({kind}); another run is "
                    "writing this lake (docs/OPERATIONS.md, Overlapping runs). Every write here is idempotent: "
                    "run again once it has ended") from err
            wait = backoff_s * 2 ** (attempt - 1) * (1 + random.random() / 2)
            log.warning("[tables] %s: a concurrent writer committed first (%s); attempt %d of %d in %.1f s",
                        path, kind, attempt + 1, attempts, wait)
            time.sleep(wait)
    raise AssertionError("unreachable")


class Held:
    """The owner of the frames a block of work persists: `with Held() as hold: df = hold(df)` persists `df`,
    and every frame held is released when the block ends, also when it raises. Without an owner, a job's
    cache outlives it: many batches (or jobs) in one session then starve execution memory of the next."""

    def __init__(self) -> None:
        self.frames: list[DataFrame] = []

    def __call__(self, df: DataFrame) -> DataFrame:
        kept = df.persist()
        self.frames.append(kept)
        return kept

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc: object) -> None:
        for df in self.frames:
            df.unpersist()
        self.frames.clear()


def release_table_state(spark: SparkSession) -> None:
    """Drop Delta's cached table states: every table a job reads keeps its state (file list, stats) as a
    persisted RDD ("Delta Table State #n") in storage memory until the session ends. At the end of a job
    nothing may stay held; the next read rebuilds the state from the table's log."""
    spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


def exists(spark: SparkSession, path: str) -> bool:
    return DeltaTable.isDeltaTable(spark, path)


def version(spark: SparkSession, path: str) -> int | None:
    """Latest Delta version of a table, or None when it does not exist yet.

    Read from the names of the commit files in `_delta_log/` (what Delta itself lists to find the latest
    version; log cleanup never removes the newest commit): no Spark job, where `history(1)` costs one. A
    nightly run asks for versions of a dozen tables around every stage, so this is seconds per run.
    """
    jvm = spark.sparkContext._jvm
    log_dir = jvm.org.apache.hadoop.fs.Path(f"{path.rstrip('/')}/_delta_log")
    fs = log_dir.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(log_dir):
        return None
    names = (status.getPath().getName() for status in fs.listStatus(log_dir))
    versions = [int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit()]
    return max(versions) if versions else None


def ensure(
    spark: SparkSession,
    path: str,
    schema: StructType,
    partition_by: Sequence[str] = (),
    properties: dict[str, str] | None = None,
) -> DeltaTable:
    """Create an empty table with the contract schema when missing; `properties` are set on it (also on an
    existing table that lacks them, e.g. the change data feed on a table made before it was configured)."""
    if not exists(spark, path):
        created = _create(spark, path, schema, partition_by, properties)
        if created is not None:
            return created  # made with the contract's columns and properties: nothing to check
    return _conform_existing(spark, path, schema, properties)


def _create(
    spark: SparkSession, path: str, schema: StructType, partition_by: Sequence[str], properties: dict[str, str] | None
) -> DeltaTable | None:
    """Create the table; None when another writer created it meanwhile (then it is conformed like any existing
    one). Two runs that both found it missing both create: the loser finds a Delta log that is new (version 0
    committed), or still being committed (its folder not empty yet no table: DELTA_CREATE_TABLE_WITH_NON_EMPTY_
    LOCATION), or a protocol change under it. It waits for the winner's commit, up to COMMIT_ATTEMPTS times."""
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return _build(spark, path, schema, partition_by, properties)
        except Exception as err:
            if exists(spark, path):
                log.info("[tables] %s: created by a concurrent writer (%s); using it", path, type(err).__name__)
                return None
            if attempt == COMMIT_ATTEMPTS:
                raise
            time.sleep(FIRST_BACKOFF_S * attempt / 2)
    raise AssertionError("unreachable")


def _build(
    spark: SparkSession, path: str, schema: StructType, partition_by: Sequence[str], properties: dict[str, str] | None
) -> DeltaTable:
    # A metadata-only commit (Delta's table builder): no Spark job and no empty data file, where writing an
    # empty frame ran both (0.34 -> 0.18 s a table on 2 cores, bench/table_create.py; a new lake gets 14).
    # Columns nullable, as the DataFrame write made them: the builder would turn a contract's non-null field
    # into a NOT NULL constraint that tables made before never had (a behaviour change, not a speed-up).
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(as_nullable(schema))
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    return builder.execute()


def _conform_existing(
    spark: SparkSession, path: str, schema: StructType, properties: dict[str, str] | None
) -> DeltaTable:
    table = DeltaTable.forPath(spark, path)
    # A nullable column added to a contract (at its end) reaches tables made before it, so MERGE can insert it.
    columns = set(table.toDF().columns)
    added = [f for f in schema.fields if f.name not in columns and f.nullable]
    if added:
        ddl = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in added)
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({ddl})")
        table = DeltaTable.forPath(spark, path)  # a handle made before the change refuses to MERGE
    if properties:
        have = table_properties(spark, path)
        missing = {k: v for k, v in properties.items() if have.get(k) != v}
        if missing:
            pairs = ", ".join(f"{k} = '{v}'" for k, v in missing.items())
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({pairs})")
    return table


def as_nullable(dtype: DataType) -> DataType:
    """`dtype` with every field, element and value nullable, at every depth (what Spark's DataFrame writer does
    to a frame's schema before it writes)."""
    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, as_nullable(f.dataType), True, f.metadata) for f in dtype.fields])
    if isinstance(dtype, ArrayType):
        return ArrayType(as_nullable(dtype.elementType), True)
    if isinstance(dtype, MapType):
        return MapType(as_nullable(dtype.keyType), as_nullable(dtype.valueType), True)
    return dtype


def table_properties(spark: SparkSession, path: str) -> dict[str, str]:
    """A table's properties, from its snapshot's metadata: no Spark job, where `detail()` costs two."""
    return {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}


def read(spark: SparkSession, path: str, schema: StructType | None = None) -> DataFrame:
    if schema is not None and not exists(spark, path):
        return spark.createDataFrame([], schema)
    return spark.read.format("delta").load(path)


def conform(df: DataFrame, schema: StructType) -> DataFrame:
    """Select the contract's columns in order with its types, so writes never drift from the schema."""
    return df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])


def merge_condition(keys: Sequence[str], null_safe: Sequence[str] = ()) -> str:
    """The match condition of every MERGE here: target `t` and source `s` equal on each key.

    A key in `null_safe` matches with `<=>` (null equals null): a plain `=` never matches a null, so a MERGE
    on a nullable key would insert the row again on every rerun.
    """
    return " AND ".join(f"t.`{k}` {'<=>' if k in null_safe else '='} s.`{k}`" for k in keys)


def insert_new(
    spark: SparkSession, df: DataFrame, path: str, schema: StructType, keys: Sequence[str]
) -> int:
    """Insert rows whose keys are not in the table yet (Delta MERGE): re-running adds nothing.

    Returns the number of rows inserted (from the commit's operation metrics).
    """
    table = ensure(spark, path, schema)
    condition = merge_condition(keys)
    source = conform(df, schema).alias("s")
    # Insert-only: a retry after a concurrent commit inserts only what is still missing.
    return committed(path, lambda: _inserted(table.alias("t").merge(source, condition).whenNotMatchedInsertAll()))


def _inserted(merge) -> int:
    """Run a MERGE and count its inserts, from the metrics frame MERGE returns (a local row: no Spark job,
    where reading them back from the table's history cost two per MERGE)."""
    return int(merge.execute().first()["num_inserted_rows"])


def upsert(
    spark: SparkSession, df: DataFrame, path: str, schema: StructType, keys: Sequence[str],
    null_safe: Sequence[str] = (),
) -> None:
    """Insert new keys and replace rows of existing keys (used where a rerun recomputes a row). Keys in
    `null_safe` match with `<=>` (merge_condition): a nullable key's null rows are replaced, not added again."""
    table = ensure(spark, path, schema)
    condition = merge_condition(keys, null_safe)
    (
        table.alias("t")
        .merge(conform(df, schema).alias("s"), condition)
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )


def quarantine_rows(
    df: DataFrame,
    stage: str,
    reason: Column | str,
    detail: Column | str | None = None,
    chain_id: Column | str | None = None,
    raw: Column | None = None,
    source: Column | str | None = None,
    run_id: str | None = None,
) -> DataFrame:
    """Shape failed rows as `quarantine` rows; `raw` defaults to the whole row as JSON."""

    def as_col(value: Column | str | None) -> Column:
        if value is None:
            return F.lit(None).cast("string")
        return value if isinstance(value, Column) else F.lit(value)

    raw_col = raw if raw is not None else F.to_json(F.struct(*[F.col(c) for c in df.columns]))
    return df.select(
        F.lit(stage).alias(Q.STAGE),
        as_col(reason).alias(Q.REASON),
        as_col(detail).alias(Q.DETAIL),
        as_col(chain_id).alias(Q.CHAIN_ID),
        raw_col.alias(Q.RAW),
        as_col(source).alias(Q.SOURCE),
        F.lit(run_id).cast("string").alias(Q.RUN_ID),
        now().alias(Q.QUARANTINED_AT),
    )


def append_quarantine(spark: SparkSession, settings: Settings, rows: DataFrame) -> int:
    """Append to `quarantine`; keyed on (stage, reason, chain_id, raw, source) so a rerun does not repeat a row.

    The source is part of the key: the same bad line in two input files is two quarantined rows, not one.
    """
    path = settings.table("quarantine")
    keys = (Q.STAGE, Q.REASON, Q.CHAIN_ID, Q.RAW, Q.SOURCE)
    rows = rows.dropDuplicates(list(keys))
    table = ensure(spark, path, Q.SCHEMA)
    cond = merge_condition(keys, null_safe=(Q.CHAIN_ID, Q.RAW, Q.SOURCE))
    source = conform(rows, Q.SCHEMA).alias("s")
    return committed(path, lambda: _inserted(table.alias("t").merge(source, cond).whenNotMatchedInsertAll()))


def merge_columns(
    spark: SparkSession,
    df: DataFrame,
    path: str,
    schema: StructType,
    keys: Sequence[str],
    columns: Sequence[str],
) -> int:
    """Upsert only `columns` for rows keyed by `keys`, leaving the table's other columns as they are.

    Lets stages that score the same rows (NLI columns, PVI columns of `step_scores`) write independently
    and idempotently: a rerun rewrites the same values. Returns the rows inserted (new keys).
    """
    table = ensure(spark, path, schema)
    source = df.select(*keys, *columns)
    condition = merge_condition(keys)
    assignments = {f"`{c}`": f"s.`{c}`" for c in columns}
    inserts = {f"`{c}`": f"s.`{c}`" for c in [*keys, *columns]}
    return _inserted(
        table.alias("t")
        .merge(source.alias("s"), condition)
        .whenMatchedUpdate(set=assignments)
        .whenNotMatchedInsert(values=inserts)
    )
