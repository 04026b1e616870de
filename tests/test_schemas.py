"""Schemas are contracts: every written table matches its StructType; score directions are documented."""

from __future__ import annotations

from pyspark.testing import assertSchemaEqual

from jobs.infra import tables
from schemas import chain_scores, chains, cot, meta_eval, metrics, quarantine, step_scores, steps


def test_every_metric_has_definition_and_direction():
    for m in metrics.REGISTRY:
        # Higher is better, but for a per-step count (arith_errors), whose chain score is its total.
        assert m.definition and m.direction_text == ("lower is better" if m.is_count else "higher is better"), m
    assert chain_scores.metric_names() + chain_scores.count_names() == metrics.names("step_scores")
    assert chain_scores.count_names() == ["arith_errors"]


def test_step_scores_schema_holds_nli_and_pvi_columns():
    names = step_scores.SCHEMA.fieldNames()
    for field in [*step_scores.NLI_SCHEMA.fieldNames(), *step_scores.PVI_SCHEMA.fieldNames()]:
        assert field in names
    assert len(names) == len(set(names))


def test_step_scores_flags_truncated_pvi_inputs_in_a_nullable_last_column():
    # Last and nullable: tables.ensure appends it to step_scores tables made before it (issue #17), and after it
    # the arithmetic check's columns (issue 45), for the same reason.
    tail = [(f.name, f.dataType.simpleString(), f.nullable) for f in step_scores.SCHEMA.fields[-5:]]
    assert tail == [("pvi_truncated", "boolean", True), ("arith_valid", "double", True), ("arith_errors", "int", True),
                    ("arith_checked", "int", True), ("arith_failed", "string", True)]
    assert tail[0][0] == step_scores.PVI_TRUNCATED


def test_ensure_writes_tables_with_contract_schema(spark, settings):
    for name, schema in {
        "chains": chains.SCHEMA,
        "steps": steps.SCHEMA,
        "contexts": steps.CONTEXTS_SCHEMA,
        "step_scores": step_scores.SCHEMA,
        "chain_scores": chain_scores.SCHEMA,
        "quarantine": quarantine.SCHEMA,
        "meta_eval": meta_eval.SCHEMA,
        "cot_predictions": cot.PREDICTIONS_SCHEMA,
        "cot_metrics": cot.METRICS_SCHEMA,
    }.items():
        tables.ensure(spark, settings.table(name), schema)
        assertSchemaEqual(tables.read(spark, settings.table(name)).schema, schema)
        # Every column nullable at every depth, as the DataFrame write that made these tables before did: a
        # contract's non-null field is checked by validation, never a write-time constraint of the table.
        assert tables.read(spark, settings.table(name)).schema == tables.as_nullable(schema), name


def test_as_nullable_makes_every_field_element_and_value_nullable():
    from pyspark.sql.types import ArrayType, DoubleType, MapType, StringType, StructField, StructType

    inner = StructType([StructField("x", DoubleType(), False)])
    schema = StructType([
        StructField("id", StringType(), False, {"comment": "key"}),
        StructField("steps", ArrayType(inner, containsNull=False), False),
        StructField("probs", MapType(StringType(), DoubleType(), valueContainsNull=False), True),
    ])
    nullable_inner = StructType([StructField("x", DoubleType(), True)])
    assert tables.as_nullable(schema) == StructType([
        StructField("id", StringType(), True, {"comment": "key"}),
        StructField("steps", ArrayType(nullable_inner, containsNull=True), True),
        StructField("probs", MapType(StringType(), DoubleType(), valueContainsNull=True), True),
    ])


def test_ensure_makes_partitioned_table_with_properties_and_no_data_files(spark, tmp_path):
    import os

    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField("id", StringType(), False), StructField("day", StringType(), True)])
    path = str(tmp_path / "t")
    tables.ensure(spark, path, schema, partition_by=["day"], properties={"delta.enableChangeDataFeed": "true"})
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    assert (detail["partitionColumns"], detail["numFiles"]) == (["day"], 0)
    assert tables.table_properties(spark, path)["delta.enableChangeDataFeed"] == "true"
    assert sorted(os.listdir(path)) == ["_delta_log"]  # a metadata-only commit: no empty data file
    assert tables.version(spark, path) == 0
    # Existing: nothing new is committed.
    tables.ensure(spark, path, schema, partition_by=["day"], properties={"delta.enableChangeDataFeed": "true"})
    assert tables.version(spark, path) == 0


def _racing(n: int, work) -> list[BaseException]:
    """Run `work(i)` in `n` threads released together; the exceptions they raised."""
    import threading

    barrier, errors = threading.Barrier(n), []

    def run(i: int) -> None:
        barrier.wait()
        try:
            work(i)
        except BaseException as err:  # noqa: BLE001 - collected for the assertion
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_ensure_by_writers_racing_to_create_one_table_is_no_error(spark, tmp_path):
    """Issue 49: two nights on a new lake both found `chains` missing; the second failed creating it. Four
    writers create one table at once: every one gets the table, made once (version 0)."""
    path = str(tmp_path / "chains")
    assert _racing(4, lambda i: tables.ensure(spark, path, chains.SCHEMA)) == []
    assert tables.version(spark, path) == 0
    assertSchemaEqual(tables.read(spark, path).schema, tables.as_nullable(chains.SCHEMA))


def test_insert_only_merges_racing_on_one_table_insert_each_key_once(spark, tmp_path):
    """Concurrent insert-only MERGEs of overlapping keys: the ones that lose a commit to another retry
    (tables.committed) and insert only what is still missing."""
    CS = chain_scores
    path = str(tmp_path / "chain_scores")
    keys = [CS.CHAIN_ID, CS.CONFIG_HASH]
    tables.ensure(spark, path, CS.SCHEMA)
    frames = [spark.createDataFrame([{**{f.name: None for f in CS.SCHEMA.fields}, CS.CHAIN_ID: f"c{j}",
                                      CS.CONFIG_HASH: "h", CS.N_STEPS: 1} for j in range(i, 6)], CS.SCHEMA)
              for i in range(3)]  # 6, 5 and 4 of the same keys
    inserted: list[int] = []
    assert _racing(3, lambda i: inserted.append(tables.insert_new(spark, frames[i], path, CS.SCHEMA, keys))) == []
    rows = tables.read(spark, path)
    assert rows.count() == 6 and rows.select(*keys).distinct().count() == 6
    assert sum(inserted) == 6
