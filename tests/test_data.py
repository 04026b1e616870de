"""jobs.infra.data: fetch by name from an HTTP server started here on 127.0.0.1, or from a local mirror."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from jobs.infra import data
from jobs.infra.config import Settings
from jobs.infra.config_paths import DATA_TOKEN
from jobs.infra.data import (
    CatalogueError,
    ChecksumMismatch,
    FetchError,
    HttpError,
    UnknownDataset,
    fetch,
    is_present,
    load_catalogue,
)

ONE = b"first file\n"
TWO = bytes(range(256)) * 20  # 5,120 bytes: room to cut a transfer in the middle
CUT = 1000
LITERALS = b"A = [1, 2]  # a comment\nB = {'k': '\xc3\xa9'}\n"  # what a `derive: python_literals` url holds
DERIVED = json.dumps({"A": [1, 2], "B": {"k": "\u00e9"}}, indent=1, ensure_ascii=False).encode()
# What a `derive: first_rows` url holds (\n line ends, a quoted field with a comma and a newline, a needlessly
# quoted one, a blank line), and its header + first 2 records as csv.writer writes them (\r\n, minimal quotes).
PAIRS = (b'premise,hypothesis,label\n"A cat sat,\nthen slept.",A cat rests.,entailment\n\n'
         b'"Caf\xc3\xa9 ""open""","The caf\xc3\xa9",neutral\nA dog runs.,A dog sleeps.,contradiction\n')  # fmt: skip
FIRST_2 = (b'premise,hypothesis,label\r\n"A cat sat,\nthen slept.",A cat rests.,entailment\r\n'
           b'"Caf\xc3\xa9 ""open""",The caf\xc3\xa9,neutral\r\n')  # fmt: skip


class Upstream(ThreadingHTTPServer):
    """Serves `files` by URL path with Range support; `status`, `cut_once` and `ignore_range` inject faults."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.files: dict[str, bytes] = {}
        self.status: dict[str, int] = {}
        self.cut_once: dict[str, int] = {}  # close the connection after N body bytes, on the next request only
        self.ignore_range = False
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}"


class Handler(BaseHTTPRequestHandler):
    server: Upstream

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        up = self.server
        wanted = self.headers.get("Range")
        up.requests.append((self.path, wanted))
        if self.path in up.status:
            self.send_error(up.status[self.path])
            return
        body = up.files[self.path]
        start = int(re.fullmatch(r"bytes=(\d+)-", wanted).group(1)) if wanted and not up.ignore_range else 0
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        cut = up.cut_once.pop(self.path, None)
        self.wfile.write(body[start:cut])
        if cut is not None:
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # No proxy, and any connection other than to 127.0.0.1 fails the test instead of leaving the machine.
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")
    connect = socket.create_connection

    def loopback(address: tuple[str, int], *args: object, **kwargs: object) -> socket.socket:
        assert address[0] == "127.0.0.1", f"test tried to reach {address}"
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", loopback)
    monkeypatch.setattr(data, "RETRY_PAUSE_S", 0.0)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    server.files = {"/one.txt": ONE, "/two.bin": TWO, "/literals.py": LITERALS, "/pairs.csv": PAIRS}
    # A short poll keeps shutdown() (teardown) quick.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _entry(path: str, url: str, content: bytes, **extra: str | int) -> dict:
    return {"path": path, "url": url, "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest(), **extra}


@pytest.fixture
def catalogue_file(tmp_path: Path, upstream: Upstream) -> Path:
    def dataset(*files: dict) -> dict:
        return {"description": "test data", "source": "owner/repo@" + "0" * 40, "licence": "MIT", "files": list(files)}

    path = tmp_path / "datasets.yaml"
    path.write_text(yaml.safe_dump({"datasets": {
        "tiny": dataset(_entry("tiny/one.txt", upstream.url("one.txt"), ONE),
                        _entry("tiny/sub/two.bin", upstream.url("two.bin"), TWO)),
        "derived": dataset(_entry("derived/values.json", upstream.url("literals.py"), DERIVED,
                                  derive="python_literals")),
        "first": dataset(_entry("first/pairs.csv", upstream.url("pairs.csv"), FIRST_2, derive="first_rows", rows=2)),
    }}, sort_keys=False))  # fmt: skip
    return path


@pytest.fixture
def catalogue(catalogue_file: Path) -> dict[str, data.Dataset]:
    return load_catalogue(catalogue_file)


def _nothing_in_place(root: Path) -> bool:
    return not (root / "tiny").exists()


def test_fetch_places_verified_files_and_removes_staging(tmp_path: Path, upstream: Upstream, catalogue) -> None:
    root = tmp_path / "data"
    placed = fetch(["tiny"], root, catalogue=catalogue)
    assert placed == [root / "tiny/one.txt", root / "tiny/sub/two.bin"]
    assert (root / "tiny/one.txt").read_bytes() == ONE and (root / "tiny/sub/two.bin").read_bytes() == TWO
    assert is_present(catalogue["tiny"], root) and not is_present(catalogue["derived"], root)
    assert not (root / ".staging").exists()

    upstream.requests.clear()
    assert fetch(["tiny"], root, catalogue=catalogue) == placed
    assert upstream.requests == []  # present: nothing downloaded again


def test_fetch_derives_json_from_python_literals(tmp_path: Path, upstream: Upstream, catalogue) -> None:
    root = tmp_path / "data"
    fetch(["derived"], root, catalogue=catalogue)
    assert (root / "derived/values.json").read_bytes() == DERIVED
    assert sorted(p.name for p in root.rglob("*")) == ["derived", "values.json"]  # the source is gone


def test_fetch_derives_the_first_rows_of_a_csv(tmp_path: Path, upstream: Upstream, catalogue) -> None:
    root = tmp_path / "data"
    fetch(["first"], root, catalogue=catalogue)
    # The quoted newline and comma stay in their field; the third record is cut.
    assert (root / "first/pairs.csv").read_bytes() == FIRST_2
    assert sorted(p.name for p in root.rglob("*")) == ["first", "pairs.csv"]  # the source is gone


def test_fetch_first_rows_of_a_short_source_names_url_and_counts_and_places_nothing(
    tmp_path: Path, upstream: Upstream, catalogue
) -> None:
    upstream.files["/pairs.csv"] = PAIRS.split(b"\n\n")[0] + b"\n"  # the header and its first record only
    root = tmp_path / "data"
    with pytest.raises(FetchError) as err:
        fetch(["first"], root, catalogue=catalogue)
    message = str(err.value)
    assert upstream.url("pairs.csv") in message and "first/pairs.csv" in message
    assert "2 records wanted after the header (rows), the source has 1" in message
    assert [p for p in root.rglob("*") if p.is_file()] == [] and not is_present(catalogue["first"], root)


def test_fetch_checksum_mismatch_names_both_hashes_and_places_nothing(
    tmp_path: Path, upstream: Upstream, catalogue
) -> None:
    upstream.files["/two.bin"] = TWO[::-1]  # same size, other bytes
    with pytest.raises(ChecksumMismatch) as err:
        fetch(["tiny"], tmp_path, catalogue=catalogue)
    message = str(err.value)
    assert "tiny/sub/two.bin" in message
    assert hashlib.sha256(TWO).hexdigest() in message and hashlib.sha256(TWO[::-1]).hexdigest() in message
    assert _nothing_in_place(tmp_path) and not is_present(catalogue["tiny"], tmp_path)


def test_fetch_resumes_an_interrupted_download_with_a_range_request(
    tmp_path: Path, upstream: Upstream, catalogue
) -> None:
    upstream.cut_once["/two.bin"] = CUT
    with pytest.raises(FetchError, match=f"closed after {CUT} of {len(TWO)} bytes"):
        fetch(["tiny"], tmp_path, catalogue=catalogue, attempts=1)
    assert _nothing_in_place(tmp_path)
    assert (tmp_path / ".staging/tiny/tiny/sub/two.bin.part").stat().st_size == CUT

    upstream.requests.clear()
    fetch(["tiny"], tmp_path, catalogue=catalogue)
    assert upstream.requests == [("/two.bin", f"bytes={CUT}-")]  # one.txt was already staged and verified
    assert (tmp_path / "tiny/sub/two.bin").read_bytes() == TWO and not (tmp_path / ".staging").exists()


def test_fetch_retries_a_dropped_connection_within_one_call(tmp_path: Path, upstream: Upstream, catalogue) -> None:
    upstream.cut_once["/two.bin"] = CUT
    fetch(["tiny"], tmp_path, catalogue=catalogue)
    assert upstream.requests[-2:] == [("/two.bin", None), ("/two.bin", f"bytes={CUT}-")]
    assert (tmp_path / "tiny/sub/two.bin").read_bytes() == TWO


def test_fetch_restarts_when_the_server_ignores_range(tmp_path: Path, upstream: Upstream, catalogue) -> None:
    upstream.cut_once["/two.bin"] = CUT
    with pytest.raises(FetchError):
        fetch(["tiny"], tmp_path, catalogue=catalogue, attempts=1)
    upstream.ignore_range = True  # answers 200 with the whole file: the part must not be appended to
    fetch(["tiny"], tmp_path, catalogue=catalogue)
    assert upstream.requests[-1] == ("/two.bin", f"bytes={CUT}-")
    assert (tmp_path / "tiny/sub/two.bin").read_bytes() == TWO


def test_fetch_restarts_when_the_part_is_larger_than_the_file(tmp_path: Path, upstream: Upstream, catalogue) -> None:
    part = tmp_path / ".staging/tiny/tiny/sub/two.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * (len(TWO) + 1))
    fetch(["tiny"], tmp_path, catalogue=catalogue)
    assert ("/two.bin", None) in upstream.requests and (tmp_path / "tiny/sub/two.bin").read_bytes() == TWO


def test_fetch_server_error_names_url_and_status(tmp_path: Path, upstream: Upstream, catalogue) -> None:
    upstream.status["/two.bin"] = 500
    with pytest.raises(HttpError) as err:
        fetch(["tiny"], tmp_path, catalogue=catalogue)
    assert upstream.url("two.bin") in str(err.value) and "HTTP 500" in str(err.value)
    assert upstream.requests.count(("/two.bin", None)) == 1  # a status is an answer, not retried
    assert _nothing_in_place(tmp_path)


def test_fetch_from_mirror_copies_and_verifies(tmp_path: Path, upstream: Upstream, catalogue) -> None:
    mirror = tmp_path / "mirror"
    (mirror / "tiny/sub").mkdir(parents=True)
    (mirror / "tiny/one.txt").write_bytes(ONE)
    (mirror / "tiny/sub/two.bin").write_bytes(TWO)
    fetch(["tiny"], tmp_path / "a", mirror=mirror, catalogue=catalogue)
    assert (tmp_path / "a/tiny/sub/two.bin").read_bytes() == TWO and upstream.requests == []

    (mirror / "tiny/sub/two.bin").write_bytes(TWO[:-1] + b"!")
    with pytest.raises(ChecksumMismatch, match="tiny/sub/two.bin"):
        fetch(["tiny"], tmp_path / "b", mirror=mirror, catalogue=catalogue)
    assert _nothing_in_place(tmp_path / "b")


def test_fetch_from_a_mirror_without_an_optional_file_places_the_rest(
    tmp_path: Path, upstream: Upstream, caplog, capsys
) -> None:
    entries = [_entry("part/one.txt", upstream.url("one.txt"), ONE),
               {**_entry("part/two.bin", upstream.url("two.bin"), TWO), "optional": True}]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"datasets": {"part": {
        "description": "", "source": "", "licence": "", "files": entries}}}))  # fmt: skip
    catalogue = load_catalogue(tmp_path / "c.yaml")
    mirror, root = tmp_path / "mirror", tmp_path / "data"
    (mirror / "part").mkdir(parents=True)
    (mirror / "part/one.txt").write_bytes(ONE)
    assert fetch(["part"], root, mirror=mirror, catalogue=catalogue) == [root / "part/one.txt"]
    assert "the mirror" in caplog.text and "lacks the optional part/two.bin" in caplog.text
    assert is_present(catalogue["part"], root) and not is_present(catalogue["part"], root, optional=True)
    assert fetch(["part"], root, mirror=mirror, catalogue=catalogue) == [root / "part/one.txt"]
    assert upstream.requests == [] and not (root / ".staging").exists()
    args = ["--data", str(root), "--catalogue", str(tmp_path / "c.yaml")]
    assert data.main(["list", *args]) == 0
    assert "present, 1 optional missing" in capsys.readouterr().out
    # A download gets it like any other file.
    assert fetch(["part"], root, catalogue=catalogue) == [root / "part/one.txt", root / "part/two.bin"]
    assert (root / "part/two.bin").read_bytes() == TWO and is_present(catalogue["part"], root, optional=True)
    # A required file the mirror lacks still fails the dataset.
    (mirror / "part/one.txt").unlink()
    with pytest.raises(FetchError, match="part/one.txt: not in the mirror"):
        fetch(["part"], tmp_path / "other", mirror=mirror, catalogue=catalogue)


def test_fetch_unknown_name_lists_the_known_ones(tmp_path: Path, catalogue) -> None:
    with pytest.raises(UnknownDataset, match="'nope'.*known: tiny, derived"):
        fetch(["tiny", "nope"], tmp_path, catalogue=catalogue)
    assert not tmp_path.joinpath("tiny").exists()


def test_catalogue_rejects_paths_outside_the_data_folder(tmp_path: Path) -> None:
    bad = {"datasets": {"x": {"description": "", "source": "", "licence": "", "files": [
        {"path": "../escape.txt", "url": "https://example.invalid/f", "bytes": 1, "sha256": "0" * 64}]}}}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(CatalogueError, match="'x'.*files.0.path"):
        load_catalogue(tmp_path / "c.yaml")


@pytest.mark.parametrize(
    "extra", [{"derive": "first_rows"}, {"rows": 3}, {"derive": "python_literals", "rows": 3}]
)
def test_catalogue_wants_rows_with_first_rows_and_only_there(tmp_path: Path, extra: dict) -> None:
    bad = {"datasets": {"x": {"description": "", "source": "", "licence": "", "files": [
        {"path": "x.csv", "url": "https://example.invalid/f", "bytes": 1, "sha256": "0" * 64, **extra}]}}}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(CatalogueError, match=r"'x'.*files\.0.*`rows` goes with `derive: first_rows`"):
        load_catalogue(tmp_path / "c.yaml")


def test_cli_list_shows_present_and_missing(tmp_path: Path, catalogue_file: Path, capsys) -> None:
    args = ["--data", str(tmp_path), "--catalogue", str(catalogue_file)]
    assert data.main(["fetch", "tiny", *args]) == 0
    assert data.main(["list", *args]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line.startswith("│ ")}
    assert "present" in rows["tiny"] and "missing" in rows["derived"]
    assert data.main(["fetch", "nope", *args]) == 1


# ---- the real catalogue ----------------------------------------------------------------------------------
def _data_defaults(model: BaseModel) -> list[str]:
    """Every ${paths.data}/... default in the settings, relative to the data folder."""
    found = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            found += _data_defaults(value)
        elif isinstance(value, str) and value.startswith(DATA_TOKEN + "/"):
            found.append(value[len(DATA_TOKEN) + 1:])
    return found


def test_real_catalogue_is_consistent() -> None:
    catalogue = load_catalogue()
    assert set(catalogue) == {"entailment_bank", "roscoe_gsm8k", "processbench", "bbh", "mgsm", "p3_heldout", "sick",
                              "mnli_dev_matched", "snli_dev", "joci", "scitail", "cf_snli"}  # fmt: skip
    files = [f for d in catalogue.values() for f in d.files]
    paths = [f.path for f in files]
    assert len(paths) == len(set(paths))
    for f in files:
        assert re.fullmatch(r"https://raw\.githubusercontent\.com/[\w.-]+/[\w.-]+/[0-9a-f]{40}/\S+", f.url), f.url
        assert re.fullmatch(r"[0-9a-f]{64}", f.sha256) and f.bytes > 0
    for default in _data_defaults(Settings()):  # a file the jobs read, or a folder (cot.data_root) they read under
        assert default in paths or any(p.startswith(default + "/") for p in paths), default


def test_real_catalogue_matches_the_mirror() -> None:
    mirror = os.environ.get("RECEVAL_DATA_MIRROR")
    if not mirror or not Path(mirror).is_dir():
        pytest.skip("RECEVAL_DATA_MIRROR does not name a folder holding a copy of the datasets")
    for dataset in load_catalogue().values():
        for f in dataset.files:
            local = Path(mirror) / f.path
            if f.optional and not local.is_file():  # a mirror may lack it (ProcessBench's OlympiadBench, Omni-MATH)
                continue
            assert local.is_file(), f"{f.path} missing from {mirror}"
            assert local.stat().st_size == f.bytes, f.path
            assert hashlib.sha256(local.read_bytes()).hexdigest() == f.sha256, f.path
