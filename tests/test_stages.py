"""Every declared stage (jobs.infra.stage.declared) through the one command line: --help, --print-config and
--dry-run work the same way for each, and a dry-run touches nothing; the pipeline's plan is its parts'."""

from __future__ import annotations

import pytest
from conftest import SAMPLE_LAKE, job_args

from jobs.infra import tables
from jobs.infra.stage import Stage, declared

STAGES = declared()
# The flags a stage needs besides the common ones (its positional or required arguments).
REQUIRED = {"experiments": ["api_k"], "paper_tables": ["--run", "r1"]}
COMMON = ("--config", "--set", "--print-config", "--dry-run")


def test_every_room_declares_its_stages_once():
    # The stages a newcomer finds in the README's table, each declared by one module (declared() refuses two
    # stages of one name).
    assert set(STAGES) == {
        "ingest", "steps", "nli_scores", "pvi_scores", "scores", "aggregate", "curate", "export", "pipeline",
        "perturb", "human_labels", "processbench", "baselines", "meta_eval", "localise", "eb_challenge", "experiments",
        "cot_eval", "paper_tables", "train_nli", "train_pvi", "sample_chains", "select_chains", "maintain",
    }
    assert [s.name for s in STAGES.values() if s.body is None] == ["scores"]  # a pipeline part only


@pytest.mark.parametrize("name", sorted(STAGES))
def test_help_lists_the_common_flags_and_the_stages_own(name, capsys):
    with pytest.raises(SystemExit) as stop:
        STAGES[name].main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert all(flag in out for flag in COMMON), out
    if STAGES[name].section:
        assert f"the `{STAGES[name].section}` section" in out
    assert {"experiments": "{api_k,", "paper_tables": "--run RUN", "maintain": "{optimize,restore}",
            "eb_challenge": "--stages"}.get(name, "usage:") in out


@pytest.mark.parametrize("name", sorted(STAGES))
def test_print_config_shows_the_layers_and_exits(name, capsys):
    with pytest.raises(SystemExit) as stop:
        STAGES[name].main([*REQUIRED.get(name, []), "--set", "log.level=DEBUG", "--print-config"])
    assert stop.value.code == 0
    lines = {line.split(":")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["log.level"].endswith("# --set log.level=DEBUG")
    if STAGES[name].section:  # its own section is there, with the layer of each value
        assert any(key.startswith(f"{STAGES[name].section}.") and "# " in line for key, line in lines.items())


@pytest.mark.parametrize("name", sorted(set(STAGES) - {"train_nli", "train_pvi"}))
def test_dry_run_names_every_declared_table_and_changes_nothing(name, spark, settings, tmp_path, capsys):
    argv = [*REQUIRED.get(name, []), *job_args(settings, f"ingest.input={SAMPLE_LAKE}/*.jsonl"), "--dry-run"]
    store = tmp_path / "mlruns.db"
    existed = store.exists()
    with pytest.raises(SystemExit) as stop:
        STAGES[name].main(argv)
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"[dry-run] {name}, config hash {settings.scoring_hash()}: nothing is written")
    stage = STAGES[name]
    for part in stage.parts or (stage,):
        if name == "eb_challenge" and part.name == "pipeline":
            continue  # eb_challenge runs the pipeline's scoring stages, each listed as the pipeline lists them
        for table in part.inputs(settings):
            assert f"reads  {table}: " in out, (part.name, table)
        for table in part.outputs(settings):
            assert f"writes {table}: " in out, (part.name, table)
    # On this new lake: a stage that writes creates its tables; maintain only rewrites tables that exist.
    absent = "absent (left alone)" if name == "maintain" else "absent (would be created)"
    assert all(absent in line for line in out.splitlines() if line.lstrip().startswith("writes ")), out
    assert store.exists() == existed  # no MLflow run
    assert not tables.exists(spark, settings.table("chain_scores"))


def test_training_dry_runs_say_what_they_would_train(settings, capsys):
    for name, said in (("train_pvi", "would train a g model"),):
        with pytest.raises(SystemExit) as stop:
            STAGES[name].main([*job_args(settings), "--dry-run"])
        assert stop.value.code == 0
        assert said in capsys.readouterr().out


def test_a_part_only_stage_refuses_to_run_alone(settings):
    with pytest.raises(SystemExit, match="runs only as a part"):
        STAGES["scores"].main(job_args(settings))


def test_the_pipeline_plans_and_records_what_its_parts_declare(settings):
    from jobs.receval import curate, pipeline

    assert [p.name for p in pipeline.PARTS] == ["ingest", "steps", "scores", "aggregate", "curate"]
    # The night's ingest is the ingest stage, keeping the fingerprints of the files it read besides.
    ingest = STAGES["ingest"]
    assert (pipeline.INGEST.doc, pipeline.INGEST.body) == (ingest.doc, ingest.body)
    assert pipeline.INGEST.inputs(settings) == (*ingest.inputs(settings), "input_files")
    assert pipeline.INGEST.outputs(settings) == (*ingest.outputs(settings), "input_files")
    assert [s.declared for s in pipeline.CHAIN_STAGES] == [STAGES["steps"], STAGES["scores"], STAGES["aggregate"]]
    # curate reads chains (its label agreement), and step_scores only with step thresholds.
    assert curate.STAGE.inputs(settings) == ("chain_scores", "chains")
    thresholds = settings.model_copy(update={"curation": settings.curation.model_copy(
        update={"step_thresholds": {"intra_entail": 0.5}})})
    assert curate.STAGE.inputs(thresholds) == ("chain_scores", "step_scores", "chains")


def test_an_expected_failure_ends_the_command_line_with_one_line(settings, capsys):
    # What ingest's QuarantineLimitError does, for any stage: logged where raised, the run FAILED, no traceback.
    from jobs.infra.stage import StageFailed
    from jobs.receval.ingest import QuarantineLimitError

    assert issubclass(QuarantineLimitError, StageFailed) and issubclass(StageFailed, RuntimeError)

    def body(job):
        raise QuarantineLimitError("ingest quarantined 8 of 8 rows read")

    with pytest.raises(SystemExit) as stop:
        Stage("failing", "doc", body, uses_spark=False).main(job_args(settings))
    assert stop.value.code == "error: ingest quarantined 8 of 8 rows read"  # printed to stderr, exit status 1


def test_declared_refuses_two_stages_of_one_name(tmp_path, monkeypatch):
    pkg = tmp_path / "twostages"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for module in ("a", "b"):
        (pkg / f"{module}.py").write_text("from jobs.infra.stage import Stage\nSTAGE = Stage('same', 'doc')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="two stages named 'same'"):
        declared("twostages")
    assert isinstance(Stage("x", "y"), Stage)


def test_the_architecture_docs_example_stage_runs_as_written(spark, settings, tmp_path, monkeypatch, capsys):
    # docs/ARCHITECTURE.md's "Adding a stage" example, copied verbatim into a package of its own.
    import re

    from conftest import PROJECT_ROOT

    from schemas import steps as ST

    doc = (PROJECT_ROOT / "docs" / "ARCHITECTURE.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    assert len(code.splitlines()) <= 30
    (tmp_path / "newroom").mkdir()
    (tmp_path / "newroom" / "__init__.py").write_text("")
    (tmp_path / "newroom" / "step_counts.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    stage = declared("newroom")["step_counts"]
    h = settings.scoring_hash()
    rows = [("a", h, 0, 2, "s", [], "c", "sentence", "position", "d"),
            ("a", h, 1, 2, "t", [], "d", "sentence", "position", "d"),
            ("b", h, 0, 1, "u", [], "e", "sentence", "position", "d"), ("b", "old", 0, 1, "u", [], "e", "", "", "d")]
    spark.createDataFrame(rows, ST.SCHEMA).write.format("delta").save(settings.table("steps"))
    with pytest.raises(SystemExit):
        stage.main([*job_args(settings), "--dry-run"])
    assert "reads  steps: version 0, 4 rows, 3 under config hash" in capsys.readouterr().out
    assert stage.main(job_args(settings)) == {"chains": 2}
    got = {r["chain_id"]: r["steps"] for r in tables.read(spark, settings.table("step_counts")).collect()}
    assert got == {"a": 2, "b": 1}
