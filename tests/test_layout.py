"""Project layout: model/text code (udfs/) and table contracts (schemas/) know no job; jobs/ is split by concern."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from jobs.infra.config import PROJECT_ROOT

SUBPACKAGES = ["infra", "receval", "metaeval", "cot", "training", "selection"]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in a file, including ones inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def jobs_imports(folder: Path) -> list[str]:
    return [
        f"{path.relative_to(PROJECT_ROOT)}:{line} imports {module}"
        for path in sorted(folder.rglob("*.py"))
        for line, module in imported_modules(path)
        if module == "jobs" or module.startswith("jobs.")
    ]


@pytest.mark.parametrize("folder", ["udfs", "schemas"])
def test_no_module_under_udfs_or_schemas_imports_jobs(folder):
    assert jobs_imports(PROJECT_ROOT / folder) == []


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    from jobs.receval.ingest import validate\n    import jobs\n")
    assert [m for _, m in imported_modules(tmp_path / "m.py")] == ["jobs.receval.ingest", "jobs"]


def test_jobs_holds_only_documented_subpackages():
    top = sorted(p.name for p in (PROJECT_ROOT / "jobs").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists())
    assert top == sorted(["__init__.py", *SUBPACKAGES])
    for name in SUBPACKAGES:
        doc = importlib.import_module(f"jobs.{name}").__doc__
        assert doc and len(doc.split()) >= 10, f"jobs.{name} needs a docstring saying what it holds"


def test_a_job_run_with_python_m_logs_under_its_own_name():
    # `python -m jobs.receval.pipeline` runs the module as __main__: a logger named by __name__ would be
    # "__main__", outside the configured `jobs` logger, and every line it logs would be lost.
    # (tests/jobs/test_pipeline.py::test_main_killed_driver_then_rerun_equals_clean_run reads those lines.)
    from jobs.receval import pipeline

    assert pipeline.log.name == "jobs.receval.pipeline"
    offenders = [
        f"{path.relative_to(PROJECT_ROOT)}"
        for folder in ("jobs", "udfs")
        for path in sorted((PROJECT_ROOT / folder).rglob("*.py"))
        if "getLogger(__name__)" in path.read_text()
    ]
    assert offenders == [], "use logging.getLogger(__spec__.name): under python -m, __name__ is __main__"
