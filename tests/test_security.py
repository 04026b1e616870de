"""Security basics: safetensors-only model loading, no remote code, no data evaluated as code, checked paths."""

from __future__ import annotations

import ast
import json
import pickle
import shutil
from pathlib import Path

import pytest

from jobs.infra.config import ConfigError
from jobs.infra.config_layers import load_settings
from jobs.infra.config_paths import PROJECT_ROOT
from udfs import runtime

CODE_DIRS = ("jobs", "udfs", "schemas")


class _WritesFileWhenUnpickled:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture
def nli_copy(tiny_models, tmp_path) -> Path:
    """The tiny NLI model's config and tokenizer without its weights."""
    folder = tmp_path / "model"
    folder.mkdir()
    for f in tiny_models["tiny-nli"].iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    runtime.clear_cache()
    yield folder
    runtime.clear_cache()


def test_load_model_refuses_pickle_weights(nli_copy, tmp_path):
    marker = tmp_path / "unpickled"
    with (nli_copy / "pytorch_model.bin").open("wb") as f:
        pickle.dump({"classifier.weight": _WritesFileWhenUnpickled(marker)}, f)
    with pytest.raises(Exception, match="(?i)safetensors|no file named|does not appear to have"):
        runtime.load_model(str(nli_copy), "nli")
    assert not marker.exists()  # the pickle was never opened


def test_load_model_runs_no_remote_code_by_default(nli_copy, tiny_models, tmp_path):
    marker = tmp_path / "remote_code_ran"
    shutil.copy(tiny_models["tiny-nli"] / "model.safetensors", nli_copy / "model.safetensors")
    (nli_copy / "evil_modeling.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
        "from transformers import PreTrainedModel as EvilModel\n"
    )
    config = json.loads((nli_copy / "config.json").read_text())
    config["auto_map"] = {"AutoModelForSequenceClassification": "evil_modeling.EvilModel"}
    (nli_copy / "config.json").write_text(json.dumps(config))

    model, _ = runtime.load_model(str(nli_copy), "nli")

    assert not marker.exists()
    assert type(model).__module__.startswith("transformers.models.")  # the library's own class


def test_settings_trust_remote_code_is_off_unless_configured():
    assert load_settings(environ={}).runtime.trust_remote_code is False
    assert load_settings(overrides=["runtime.trust_remote_code=true"], environ={}).runtime.trust_remote_code


# -- no untrusted text as code: a static scan of the project's code --------------------------------------
def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def _kw(call: ast.Call, name: str) -> str | None:
    return next((ast.unparse(k.value) for k in call.keywords if k.arg == name), None)


def unsafe_calls(source: str) -> list[str]:
    """Calls that evaluate text or objects as code, with the reason; [] for safe code."""
    tree = ast.parse(source)
    safe_loaders = {"yaml.SafeLoader", "yaml.CSafeLoader", "SafeLoader", "CSafeLoader"}
    # Loader classes the module derives from SafeLoader are as safe as it.
    safe_loaders |= {
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and any(ast.unparse(b) in safe_loaders for b in n.bases)
    }
    sandboxed = "SandboxedEnvironment" in source
    found = []
    for call, name in _calls(tree):
        line = f"line {call.lineno}: {name}"
        if name in {"eval", "exec", "compile", "__import__", "os.system", "os.popen"}:
            found.append(f"{line} evaluates text")
        elif name in {"pickle.load", "pickle.loads", "cloudpickle.loads", "dill.loads", "yaml.unsafe_load"}:
            found.append(f"{line} unpickles")
        elif name == "yaml.load" and _kw(call, "Loader") not in safe_loaders:
            found.append(f"{line} without a SafeLoader")
        elif name == "torch.load" and _kw(call, "weights_only") != "True":
            found.append(f"{line} without weights_only=True")
        elif _kw(call, "shell") == "True":
            found.append(f"{line} with shell=True")
        elif _kw(call, "trust_remote_code") == "True":
            found.append(f"{line} with trust_remote_code=True hard-coded")
        elif name.endswith(("jinja2.Template", "Environment")) and not name.endswith("SandboxedEnvironment"):
            found.append(f"{line}: Jinja outside a sandbox")
        elif name.endswith("from_string") and not sandboxed:
            found.append(f"{line}: a template compiled outside a SandboxedEnvironment")
    return found


def test_unsafe_calls_detects_each_pattern():
    bad = "\n".join(
        [
            "eval(row['text'])",
            "import pickle; pickle.loads(blob)",
            "yaml.load(text, Loader=yaml.Loader)",
            "torch.load(path)",
            "subprocess.run(cmd, shell=True)",
            "AutoModel.from_pretrained(p, trust_remote_code=True)",
            "jinja2.Environment().from_string(row['text'])",
        ]
    )
    flagged_lines = {f.split(":")[0] for f in unsafe_calls(bad)}
    assert flagged_lines == {f"line {i}" for i in range(1, 8)}  # every line, each for its own reason
    good = (
        "class L(yaml.SafeLoader):\n    pass\n"
        "yaml.load(t, Loader=L)\nyaml.safe_load(t)\ntorch.load(p, weights_only=True)\n"
        "from jinja2.sandbox import SandboxedEnvironment\nSandboxedEnvironment().from_string(template_file_text)\n"
        "model.eval()\nAutoModel.from_pretrained(p, trust_remote_code=cfg.trust_remote_code)\n"
    )
    assert unsafe_calls(good) == []


def test_project_code_evaluates_no_untrusted_text():
    problems = {
        str(path.relative_to(PROJECT_ROOT)): found
        for d in CODE_DIRS
        for path in sorted((PROJECT_ROOT / d).rglob("*.py"))
        if (found := unsafe_calls(path.read_text()))
    }
    assert problems == {}


def test_cot_templates_render_data_as_text():
    from jobs.cot import p3 as cot_p3
    env = cot_p3._environment(0)
    template = cot_p3.PromptTemplate("t", "Q: {{ question }} ||| {{ answer }}", None)
    hostile = "{{ 7*7 }} {% for x in range(3) %}x{% endfor %} {{ ''.__class__.__mro__ }}"
    prompt, target, _ = cot_p3.render(env, template, {"question": hostile, "answer": "yes"})
    assert prompt == f"Q: {hostile}"
    assert target == "yes"
    # Templates themselves come from files; even so the sandbox refuses to reach Python internals.
    escape = cot_p3.PromptTemplate("t", "{{ ''.__class__.__mro__[1].__subclasses__() }}", None)
    with pytest.raises(Exception, match="(?i)unsafe|not safely|access"):
        cot_p3.render(env, escape, {})


# -- paths from config --------------------------------------------------------------------------------
@pytest.mark.parametrize("lake", ["", "   ", "/", "~/", ".", "//"])
def test_load_settings_rejects_dangerous_lake_path(lake):
    with pytest.raises(ConfigError, match="paths.lake"):
        load_settings(overrides=[f"paths.lake={lake}"], environ={})


def test_load_settings_accepts_lake_folder(tmp_path):
    assert load_settings(overrides=[f"paths.lake={tmp_path}/lake"], environ={}).paths.lake == f"{tmp_path}/lake"


def test_ingest_read_raw_missing_input_names_the_setting(spark, make_settings, tmp_path):
    from jobs.receval import ingest_readers
    settings = make_settings(f"ingest.input={tmp_path}/nothing_here/*.jsonl")
    with pytest.raises(FileNotFoundError, match=r"ingest\.input.*nothing_here"):
        ingest_readers.read_raw(spark, settings.ingest)
    assert not Path(settings.table("chains")).exists()
