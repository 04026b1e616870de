"""Public datasets by name: conf/datasets.yaml -> verified files under `paths.data`.

    python -m jobs.infra.data list
    python -m jobs.infra.data fetch NAME... | --all [--from DIR] [--data DIR] [--config FILE] [--set k=v]

Files come from their pinned upstream URLs, or with `--from DIR` from a local copy laid out like the
catalogue paths (CI, air-gapped sites). A dataset is staged under `<data>/.staging/<name>/`, every sha256
checked, and only then moved into place, so a failed fetch never leaves it half-written.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import hashlib
import http.client
import io
import itertools
import json
import logging
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from rich.filesize import decimal as human_size

from jobs.infra.args import add_settings_arguments
from jobs.infra.config import ConfigError
from jobs.infra.config_layers import load_settings
from jobs.infra.config_paths import CONF_DIR, resolve_path

CATALOGUE = CONF_DIR / "datasets.yaml"
STAGING = ".staging"
TIMEOUT_S = 30.0  # per socket operation: connect, or a read that stalls
PROGRESS_EVERY_S = 2.0
RETRY_PAUSE_S = 1.0  # times the attempt number
CHUNK = 1 << 16
LOG = logging.getLogger(__spec__.name)


class FetchError(Exception):
    """A file could not be obtained (HTTP status, network, missing mirror file); the message names it."""


class HttpError(FetchError):
    """The server answered with an error status."""

    def __init__(self, url: str, status: int, reason: str) -> None:
        super().__init__(f"GET {url}: HTTP {status} {reason}")
        self.url, self.status = url, status


class ChecksumMismatch(FetchError):
    """A file's bytes differ from the catalogue's; nothing of its dataset is put in place."""

    def __init__(self, path: str, expected: str, actual: str) -> None:
        super().__init__(f"{path}: sha256 mismatch: expected {expected} (catalogue), got {actual}")
        self.path, self.expected, self.actual = path, expected, actual


class UnknownDataset(ValueError):
    """A name not in the catalogue; the message lists the known ones."""


class CatalogueError(ValueError):
    """The catalogue file is malformed; the message names the dataset and key."""


def _inside_data_folder(path: str) -> str:
    # The catalogue decides where files are written: it must not reach outside the data folder.
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts or pure.parts[0] == STAGING:
        raise ValueError(f"{path!r} must be a relative path inside the data folder")
    return path


@dataclass(frozen=True)
class DataFile:
    __pydantic_config__ = ConfigDict(extra="forbid")

    path: Annotated[str, AfterValidator(_inside_data_folder)]
    url: Annotated[str, StringConstraints(pattern=r"^https?://")]
    bytes: Annotated[int, Field(ge=0)]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    # python_literals: `url` holds Python literals; the file is their JSON (bytes and sha256 are the JSON's).
    # first_rows: `url` is a CSV file; the file is its header and first `rows` records, as csv.writer writes them.
    derive: Literal["python_literals", "first_rows"] | None = None
    rows: Annotated[int, Field(gt=0)] | None = None  # with `derive: first_rows` only, which needs it
    # The dataset is usable without this file (its jobs and tests read it only where it is): a mirror may lack
    # it, and `fetch --from` then places the others and says which it left out. A download gets it like any file.
    optional: bool = False

    @model_validator(mode="after")
    def _rows_with_first_rows(self) -> DataFile:
        if (self.derive == "first_rows") != (self.rows is not None):
            raise ValueError("`rows` goes with `derive: first_rows`, and `derive: first_rows` needs `rows`")
        return self


@dataclass(frozen=True)
class Dataset:
    __pydantic_config__ = ConfigDict(extra="forbid")

    name: str
    description: str
    source: str
    licence: str
    files: tuple[DataFile, ...]

    @property
    def size(self) -> int:
        return sum(f.bytes for f in self.files)


_DATASET = TypeAdapter(Dataset)


def yaml_entries(
    path: str | os.PathLike[str], section: str, adapter: TypeAdapter, kind: str, error: type[ValueError]
) -> Iterator[tuple[str, Any]]:
    """(name, validated entry) of a `section: {name: {...}}` YAML file, in file order; `error` names the file,
    the entry (`kind` NAME) and every field that fails. The dataset catalogue and the model registry share it."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    entries = raw.get(section) if isinstance(raw, dict) else None
    if not isinstance(entries, dict):
        raise error(f"{path}: expected a mapping `{section}: {{name: {{...}}}}`")
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            raise error(f"{path}: {kind} {name!r} must be a mapping")
        try:
            yield name, adapter.validate_python({"name": name, **entry})
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise error(f"{path}: {kind} {name!r}: {problems}") from None


def load_catalogue(path: str | os.PathLike[str] = CATALOGUE) -> dict[str, Dataset]:
    """Dataset name -> Dataset, in file order; every file path appears once across the catalogue."""
    catalogue: dict[str, Dataset] = {}
    owner: dict[str, str] = {}
    for name, dataset in yaml_entries(path, "datasets", _DATASET, "dataset", CatalogueError):
        for f in dataset.files:
            if f.path in owner:
                raise CatalogueError(f"{path}: {f.path} is listed by both {owner[f.path]!r} and {name!r}")
            owner[f.path] = name
        catalogue[name] = dataset
    return catalogue


def _in_place(file: DataFile, root: Path) -> bool:
    return (root / file.path).is_file() and (root / file.path).stat().st_size == file.bytes


def is_present(dataset: Dataset, data_dir: str | os.PathLike[str], optional: bool = False) -> bool:
    """Every file the dataset needs (with `optional`, every file) exists with the catalogue's size (no hashing:
    cheap enough for test markers and `list`)."""
    root = Path(data_dir)
    return all(_in_place(f, root) for f in dataset.files if optional or not f.optional)


def sha256_of(path: Path) -> str:
    # hashlib.file_digest would do this, but it needs Python 3.11 and the project supports 3.10.
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _verified(path: Path, file: DataFile) -> bool:
    return path.is_file() and path.stat().st_size == file.bytes and sha256_of(path) == file.sha256


def _part(path: Path) -> Path:
    return path.with_name(path.name + ".part")


def _download(url: str, dest: Path, expected: int | None, log: logging.Logger) -> None:
    """One GET of `url` into `dest`'s .part file, resuming what an earlier attempt left there."""
    part = _part(dest)
    have = part.stat().st_size if part.exists() else 0
    if expected is not None and have > expected:
        log.info("%s: partial file is larger than expected (%d > %d bytes); starting again", part, have, expected)
        part.unlink()
        have = 0
    if expected is None or have < expected:
        headers = {"User-Agent": "receval-data/1", "Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S) as resp:
                if have and resp.status != 206:
                    log.info("%s: server ignored the range request; downloading from the start", url)
                    have = 0
                length = resp.headers.get("Content-Length")
                total = have + int(length) if length is not None else expected
                _copy_stream(resp, part, have, total, log)
        except urllib.error.HTTPError as err:
            if err.code == 416 and have:  # the part no longer fits the file: start again next attempt
                part.unlink()
            raise HttpError(url, err.code, err.reason) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
            reason = getattr(err, "reason", err)
            raise FetchError(f"GET {url}: {reason}") from None
    os.replace(part, dest)


def _copy_stream(
    resp: http.client.HTTPResponse, part: Path, have: int, total: int | None, log: logging.Logger
) -> None:
    start = last = time.monotonic()
    done = have
    part.parent.mkdir(parents=True, exist_ok=True)
    with part.open("ab" if have else "wb") as out:
        while chunk := resp.read(CHUNK):
            out.write(chunk)
            done += len(chunk)
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S:
                last = now
                rate = (done - have) / (now - start)
                of = f" / {human_size(total)}" if total else ""
                log.info("%s: %s%s, %s/s", part.name[: -len(".part")], human_size(done), of, human_size(int(rate)))
    # http.client returns a short body without complaint when the server closes early.
    if total is not None and done < total:
        raise ConnectionError(f"connection closed after {done} of {total} bytes (kept in {part} to resume)")


def _python_literals_json(source: bytes) -> bytes:
    """Top-level `NAME = <literal>` assignments of a Python file as JSON; parsed, never executed."""
    values = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    }
    return json.dumps(values, indent=1, ensure_ascii=False).encode()


def _first_rows_csv(source: bytes, rows: int) -> bytes:
    """The header record and the first `rows` records of a UTF-8 CSV file, written as Python's csv.writer writes
    them (excel dialect: quotes only where a field needs them, \r\n after each record). The csv module reads the
    records, so a quoted field that holds a newline or a comma stays whole; blank lines are not records. Raises
    ValueError when the source has fewer records."""
    reader = csv.reader(io.StringIO(source.decode("utf-8"), newline=""), strict=True)
    records = list(itertools.islice((record for record in reader if record), rows + 1))
    if len(records) <= rows:
        found = max(len(records) - 1, 0)
        raise ValueError(f"{rows:,} records wanted after the header (rows), the source has {found:,}")
    out = io.StringIO(newline="")
    csv.writer(out).writerows(records)
    return out.getvalue().encode("utf-8")


def _derived(file: DataFile, source: bytes) -> bytes:
    if file.derive == "first_rows":
        assert file.rows is not None  # the catalogue's validation
        return _first_rows_csv(source, file.rows)
    return _python_literals_json(source)


def _stage(file: DataFile, staged: Path, mirror: Path | None, attempts: int, log: logging.Logger) -> None:
    """Put `file` at `staged` with its catalogue sha256, from the mirror or its URL."""
    if _verified(staged, file):  # left by an earlier fetch of this dataset that failed later on
        return
    staged.parent.mkdir(parents=True, exist_ok=True)
    if mirror is not None:
        source = mirror / file.path
        if not source.is_file():
            raise FetchError(f"{file.path}: not in the mirror {mirror}")
        shutil.copyfile(source, staged)
    else:
        # A derived file downloads its source first; the source has no catalogue size of its own.
        target = staged.with_name(staged.name + ".source") if file.derive else staged
        for attempt in range(1, attempts + 1):
            try:
                _download(file.url, target, None if file.derive else file.bytes, log)
                break
            except FetchError as err:
                # A status is the server's answer; a dropped or stalled connection, or a stale part (416,
                # already removed), is worth another attempt.
                if attempt == attempts or (isinstance(err, HttpError) and err.status != 416):
                    raise
                log.warning("%s; attempt %d of %d, resuming in %.0f s", err, attempt + 1, attempts,
                            RETRY_PAUSE_S * attempt)  # fmt: skip
                time.sleep(RETRY_PAUSE_S * attempt)
        if file.derive:
            try:
                staged.write_bytes(_derived(file, target.read_bytes()))
            except (SyntaxError, ValueError, csv.Error) as err:
                raise FetchError(f"{file.url}: cannot derive {file.path}: {err}") from None
            finally:
                target.unlink()
    actual = sha256_of(staged)
    if actual != file.sha256:
        staged.unlink()  # a retry must start from fresh bytes, not resume these
        raise ChecksumMismatch(file.path, file.sha256, actual)


def fetch(
    names: Iterable[str],
    data_dir: str | os.PathLike[str],
    *,
    mirror: str | os.PathLike[str] | None = None,
    catalogue: dict[str, Dataset] | None = None,
    log: logging.Logger = LOG,
    attempts: int = 3,
) -> list[Path]:
    """Fetch the named datasets into `data_dir` (those already present are kept); the paths of their files.

    `mirror`: a local folder laid out like the catalogue paths, copied instead of downloaded. Network
    failures are retried `attempts` times, each resuming the partial file with an HTTP Range request.
    """
    catalogue = load_catalogue() if catalogue is None else catalogue
    wanted = list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in catalogue]
    if unknown:
        raise UnknownDataset(f"unknown dataset {', '.join(map(repr, unknown))}; known: {', '.join(catalogue)}")
    root = Path(data_dir)
    origin = Path(mirror) if mirror is not None else None
    placed: list[Path] = []
    for name in wanted:
        dataset = catalogue[name]
        files = list(dataset.files)
        # Optional files the mirror lacks are left out (the dataset is usable without them); never a required one.
        lacking = [f for f in files if origin is not None and f.optional and not (origin / f.path).is_file()]
        files = [f for f in files if f not in lacking]
        placed += [root / f.path for f in dataset.files if f in files or _in_place(f, root)]
        absent = [f.path for f in lacking if not _in_place(f, root)]
        if absent:
            log.warning("%s: the mirror %s lacks the optional %s; the dataset is usable without them (a download "
                        "gets them)", name, origin, ", ".join(absent))
        if all(_in_place(f, root) for f in files):
            log.info("%s: already present in %s", name, root)
            continue
        start = time.monotonic()
        log.info("%s: fetching %d files (%s) from %s", name, len(files), human_size(sum(f.bytes for f in files)),
                 origin or "upstream")  # fmt: skip
        staging = root / STAGING / name
        for f in files:
            _stage(f, staging / f.path, origin, attempts, log)
        for f in files:
            (root / f.path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / f.path, root / f.path)
        shutil.rmtree(staging)
        with contextlib.suppress(OSError):  # other datasets may still be staged there
            (root / STAGING).rmdir()
        log.info("%s: %d files verified and in place in %s (%.1f s)", name, len(files), root,
                 time.monotonic() - start)  # fmt: skip
    return placed



def _short_source(source: str) -> str:
    """`owner/repo@<40 hex>, ...` -> `owner/repo@1234567, ...` for a table that fits a terminal."""
    return ", ".join(repo + ("@" + commit[:7] if commit else "")
                     for repo, _, commit in (s.strip().partition("@") for s in source.split(",")))  # fmt: skip


def show(catalogue: dict[str, Dataset], data_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"datasets in {data_dir}", title_justify="left")
    for column, fixed in (("name", True), ("source", False), ("licence", False), ("files", True),
                          ("size", True), ("status", True)):  # fmt: skip
        table.add_column(column, no_wrap=fixed, justify="right" if column in ("files", "size") else "left")
    for d in catalogue.values():
        absent = sum(1 for f in d.files if f.optional and not _in_place(f, data_dir))
        status = "missing" if not is_present(d, data_dir) else f"present, {absent} optional missing" if absent \
            else "present"
        table.add_row(d.name, _short_source(d.source), d.licence, str(len(d.files)), human_size(d.size), status)
    Console().print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.infra.data", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data", help="data folder (default: the config's paths.data)")
    add_settings_arguments(common)
    common.add_argument("--catalogue", default=str(CATALOGUE))
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", parents=[common], help="each dataset, its size and whether it is present")
    get = commands.add_parser("fetch", parents=[common], help="download (or copy) datasets and verify them")
    get.add_argument("names", nargs="*", metavar="NAME")
    get.add_argument("--all", action="store_true", help="every dataset in the catalogue")
    get.add_argument("--from", dest="mirror", metavar="DIR", help="copy from this local mirror instead")
    args = parser.parse_args(argv)
    if args.command == "fetch" and bool(args.names) == args.all:
        parser.error("fetch: name datasets or give --all, not both")

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    try:
        # Command-line folders are relative to where the command runs; the config's to the project root.
        data_dir = (Path(args.data).expanduser().resolve() if args.data
                    else resolve_path(load_settings(args.config, args.overrides).paths.data))  # fmt: skip
        catalogue = load_catalogue(args.catalogue)
        if args.command == "list":
            show(catalogue, data_dir)
        else:
            mirror = Path(args.mirror).expanduser().resolve() if args.mirror else None
            fetch(list(catalogue) if args.all else args.names, data_dir, mirror=mirror, catalogue=catalogue)
    except (FetchError, UnknownDataset, CatalogueError, ConfigError) as err:
        LOG.error("%s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
