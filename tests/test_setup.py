"""`make setup` checks Java first (scripts/check_java.sh): a missing or too old Java fails before pip runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jobs.infra.config_paths import PROJECT_ROOT

CHECK = PROJECT_ROOT / "scripts" / "check_java.sh"


def _fake_java(folder: Path, version: str) -> Path:
    """A `java` that reports `version` on stderr, as the real one does."""
    folder.mkdir(parents=True, exist_ok=True)
    java = folder / "java"
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2019-01-15' >&2\n")
    java.chmod(0o755)
    return java


def _check(path: Path, java_home: Path | None = None) -> subprocess.CompletedProcess[str]:
    # PATH holds only the fake: the script must need nothing but shell built-ins and java itself.
    env = {"PATH": str(path)} | ({"JAVA_HOME": str(java_home)} if java_home else {})
    return subprocess.run(["/bin/sh", str(CHECK)], env=env, capture_output=True, text=True, timeout=10)


def test_check_java_rejects_java_11(tmp_path: Path) -> None:
    _fake_java(tmp_path / "bin", "11.0.2")
    out = _check(tmp_path / "bin")
    assert out.returncode != 0
    assert "Java 17+ is needed by Spark: found 11 " in out.stderr
    assert "openjdk-17-jre-headless" in out.stderr


def test_check_java_reads_legacy_version_scheme(tmp_path: Path) -> None:
    # Java 8 calls itself 1.8.0_x: its major version is 8, not 1.
    _fake_java(tmp_path / "bin", "1.8.0_392")
    out = _check(tmp_path / "bin")
    assert out.returncode != 0
    assert "found 8 " in out.stderr


@pytest.mark.parametrize("version", ["17.0.15", "21"])
def test_check_java_accepts_java_17_and_later(tmp_path: Path, version: str) -> None:
    java = _fake_java(tmp_path / "bin", version)
    out = _check(tmp_path / "bin")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"Java {version} ({java}): ok"


def test_check_java_missing(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = _check(tmp_path / "empty")
    assert out.returncode != 0
    assert "Java is missing" in out.stderr
    assert "openjdk-17-jre-headless" in out.stderr


def test_check_java_prefers_java_home(tmp_path: Path) -> None:
    # An old java on PATH does not matter when JAVA_HOME names a new one (Spark's launcher uses JAVA_HOME).
    _fake_java(tmp_path / "bin", "11.0.2")
    java = _fake_java(tmp_path / "jdk-17" / "bin", "17.0.15")
    out = _check(tmp_path / "bin", java_home=tmp_path / "jdk-17")
    assert out.returncode == 0, out.stderr
    assert str(java) in out.stdout


def test_check_java_old_java_home_fails_despite_new_path(tmp_path: Path) -> None:
    _fake_java(tmp_path / "bin", "17.0.15")
    _fake_java(tmp_path / "jdk-11" / "bin", "11.0.2")
    out = _check(tmp_path / "bin", java_home=tmp_path / "jdk-11")
    assert out.returncode != 0
    assert f'found 11 ("11.0.2" from `{tmp_path / "jdk-11" / "bin" / "java"} -version`)' in out.stderr


def test_check_java_home_without_java(tmp_path: Path) -> None:
    (tmp_path / "jdk").mkdir()
    out = _check(tmp_path / "empty", java_home=tmp_path / "jdk")
    assert out.returncode != 0
    assert f"JAVA_HOME is {tmp_path / 'jdk'} but it has no bin/java" in out.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_setup_stops_at_old_java_before_pip(tmp_path: Path) -> None:
    # A fresh venv folder: had the check passed, make would create it and run pip there.
    _fake_java(tmp_path / "bin", "11.0.2")
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "MAKEFLAGS", "MFLAGS")}
    env["PATH"] = f"{tmp_path / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    venv = tmp_path / "venv"
    out = subprocess.run(
        ["make", "-C", str(PROJECT_ROOT), "--no-print-directory", "setup", f"VENV={venv}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0
    assert "found 11 " in out.stderr
    assert "setup: Python packages" not in out.stdout
    assert not venv.exists()


def test_ivy_settings_ask_maven_central_only() -> None:
    # Spark's default chain also asks ~/.m2, ~/.ivy2/local and spark-packages: dozens of failed lookups.
    import xml.etree.ElementTree as ET

    from jobs.infra.jars import IVY_SETTINGS, MAVEN_CENTRAL

    root = ET.fromstring(IVY_SETTINGS)
    resolvers = list(root.find("resolvers"))
    assert [(r.tag, r.get("root"), r.get("m2compatible")) for r in resolvers] == [
        ("ibiblio", MAVEN_CENTRAL, "true")
    ]
    assert root.find("settings").get("defaultResolver") == resolvers[0].get("name")
    assert MAVEN_CENTRAL == "https://repo1.maven.org/maven2/"


def test_failed_resolve_shows_ivy_problems_not_the_traceback() -> None:
    from jobs.infra.jars import _excerpt

    log = "\n".join(
        [
            ":: resolving dependencies ::",
            ":: problems summary ::",
            ":::: WARNINGS",
            "\tHost repo1.maven.org not found. url=https://repo1.maven.org/maven2/x.pom",
            "",
            "\t\t:: io.delta#delta-spark_4.2_2.13;4.4.0: not found",
            ":: USE VERBOSE OR DEBUG MESSAGE LEVEL FOR MORE DETAILS",
            "Traceback (most recent call last):",
        ]
    )
    shown = _excerpt(log).splitlines()
    assert shown[0] == ":: problems summary ::"
    assert shown[-1].endswith("4.4.0: not found")
    assert len(shown) == 4
    assert _excerpt("a\nb\n") == "a\nb"
