"""Project layout: model/text code (udfs/) and table contracts (schemas/) know no job; udfs/ holds only what Spark
tasks run; jobs/ is split by concern; the platform (jobs/infra) knows no room; no import cycle."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from jobs.infra.config_paths import PROJECT_ROOT

SUBPACKAGES = ["infra", "receval", "metaeval", "cot", "training", "selection"]
PACKAGES = ["jobs", "udfs", "schemas"]
PLATFORM_MAY_IMPORT = ("jobs.infra", "schemas", "udfs")
# The calls that hand a function to Spark's Python workers (pandas UDFs, the model-UDF contract, the grouped and
# per-partition maps): a module that makes one runs code inside Spark tasks.
TASK_CALLS = frozenset({"pandas_udf", "udf", "predict_batch_udf", "model_udf", "mapInPandas", "applyInPandas",
                        "mapInArrow", "applyInArrow", "mapPartitions", "foreachPartition"})
# Where the message looks for who imports a module of udfs/ that no task uses.
IMPORTERS = ("jobs", "udfs", "schemas", "bench", "scripts")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in a file, including ones inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def module_files(root: Path, packages: list[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the given packages under `root` (a package is its __init__)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def project_imports(path: Path, modules: Mapping[str, Path]) -> list[tuple[int, str]]:
    """(line, module) for every import of a project module in a file, inside functions too; `from a import b`
    names the module a.b when b is one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, sub if (sub := f"{node.module}.{alias.name}") in modules else node.module)
                      for alias in node.names]
    return [(line, module) for line, module in found if module in modules]


def import_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The modules of each import cycle: every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def import_graph(root: Path, packages: list[str], skip: Iterable[tuple[str, str]] = ()) -> dict[str, set[str]]:
    modules = module_files(root, packages)
    skipped = set(skip)
    return {
        name: {m for _, m in project_imports(path, modules) if m != name and (name, m) not in skipped}
        for name, path in modules.items()
    }


def _called_name(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def ships_work_to_tasks(path: Path) -> bool:
    """True when a file calls one of TASK_CALLS (or decorates a function with one): part of it runs in tasks."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and _called_name(node.func) in TASK_CALLS:
            return True
        if isinstance(node, ast.FunctionDef) and any(_called_name(d) in TASK_CALLS for d in node.decorator_list):
            return True
    return False


def driver_only_udfs(root: Path, packages: list[str] = PACKAGES, importers: Iterable[str] = IMPORTERS) -> list[str]:
    """Every module of udfs/ that no Spark task runs, each with the imports (file:line) that use it, all on the
    driver. A module runs in tasks when a module that ships work to tasks (ships_work_to_tasks: the UDF builders of
    udfs/, the jobs whose pandas UDFs and maps call udfs/) imports it, or a udfs/ module that runs in tasks does,
    counting imports inside functions. Granularity is the module: a job that ships work to tasks vouches for every
    udfs/ module it imports."""
    modules = module_files(root, packages)
    graph = import_graph(root, packages)

    def in_udfs(name: str) -> bool:
        return name.startswith("udfs.")

    todo = [m for name, path in modules.items() if ships_work_to_tasks(path) for m in [name, *graph[name]]
            if in_udfs(m)]
    in_tasks: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in in_tasks:
            in_tasks.add(name)
            todo += [m for m in graph[name] if in_udfs(m)]
    offenders = []
    for name, path in modules.items():
        if not in_udfs(name) or name in in_tasks:
            continue
        users = dict.fromkeys(  # `from m import a, b` is one import
            f"{user.relative_to(root)}:{line}"
            for folder in importers if (root / folder).is_dir()
            for user in sorted((root / folder).rglob("*.py"))
            for line, module in project_imports(user, modules) if module == name
        )
        offenders.append(f"{path.relative_to(root)} runs in no Spark task: "
                         + (f"imported on the driver only, by {', '.join(users)}" if users
                            else f"no module of {', '.join(importers)} imports it"))
    return offenders


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


def test_every_module_under_udfs_runs_in_spark_tasks():
    # udfs/ is the code Spark's Python workers run: model maths and text processing behind the pandas UDFs and the
    # mapInPandas / applyInPandas functions. A dataset adapter or a statistic computed on the driver belongs to
    # the room that uses it (jobs/metaeval/entailment_bank.py, jobs/metaeval/somers.py), a benchmark's helper to
    # bench/.
    offenders = driver_only_udfs(PROJECT_ROOT)
    assert offenders == [], "move driver-only code to the room that uses it:\n" + "\n".join(offenders)


def test_the_udfs_check_names_the_driver_import_and_the_unused_module(tmp_path):
    files = {
        "jobs/__init__.py": "",
        "jobs/room/__init__.py": "",
        # ships a function to tasks: what it imports from udfs/ runs there
        "jobs/room/job.py": "from udfs import shipped\n\ndef run(df):\n    return df.mapInPandas(shipped.f, 'x int')\n",
        "jobs/room/load.py": "import json\n\ndef rows():\n    from udfs.adapter import records\n",
        "udfs/__init__.py": "",
        "udfs/shipped.py": "def f(batches):\n    from udfs import helper\n    yield from batches\n",
        "udfs/helper.py": "",
        "udfs/builder.py": "from pyspark.sql import functions as F\n\n@F.udf('double')\ndef g(x):\n    return x\n",
        "udfs/bare.py": "from pyspark.sql.functions import udf\n\n@udf\ndef h(x):\n    return x\n",
        "udfs/adapter.py": "",
        "udfs/orphan.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert driver_only_udfs(tmp_path, ["jobs", "udfs"], ["jobs", "udfs"]) == [
        "udfs/adapter.py runs in no Spark task: imported on the driver only, by jobs/room/load.py:4",
        "udfs/orphan.py runs in no Spark task: no module of jobs, udfs imports it",
    ]


def test_the_platform_imports_no_room():
    # jobs/infra is the floor the rooms stand on: a room's change must never need a platform change.
    modules = module_files(PROJECT_ROOT, PACKAGES)
    offenders = [
        f"{path.relative_to(PROJECT_ROOT)}:{line} imports {module}"
        for name, path in modules.items() if name.split(".")[:2] == ["jobs", "infra"]
        for line, module in project_imports(path, modules)
        if not any(module == allowed or module.startswith(f"{allowed}.") for allowed in PLATFORM_MAY_IMPORT)
    ]
    assert offenders == [], f"jobs/infra may import only {', '.join(PLATFORM_MAY_IMPORT)}"


def test_no_import_cycle():
    cycles = import_cycles(import_graph(PROJECT_ROOT, PACKAGES))
    assert cycles == [], "modules that import each other (through the others listed): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_the_cycle_check_sees_a_cycle_through_a_function_import(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    (tmp_path / "pkg" / "d.py").write_text("import pkg.a\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert import_cycles(import_graph(tmp_path, ["pkg"], skip={("pkg.c", "pkg.a")})) == []


def test_every_room_section_is_a_settings_field_declared_by_its_room():
    from jobs.infra.config import SECTIONS, Settings

    fields = type(Settings()).model_fields
    rooms = [name for name in SUBPACKAGES if (PROJECT_ROOT / "jobs" / name / "settings.py").exists()]
    assert rooms == ["receval", "metaeval", "cot", "training", "selection"]
    for room in rooms:
        declared = importlib.import_module(f"jobs.{room}.settings").SECTIONS
        for name, section in declared.items():
            assert fields[name].annotation is section, name
            assert section.__module__ == f"jobs.{room}.settings", name
    assert all(fields[name].annotation is section for name, section in SECTIONS.items())


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
