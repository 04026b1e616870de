"""Project layout: model/text code (udfs/) and table contracts (schemas/) know no job; jobs/ is split by concern."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from jobs.infra.config import PROJECT_ROOT

SUBPACKAGES = ["infra", "receval", "metaeval", "cot"]


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
