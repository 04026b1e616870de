"""Model loading shared by the model-backed UDFs: device, dtype, safe loading and the per-worker cache.

The cache keeps the `runtime.model_cache_size` models used last (least recently used evicted first, as
pyspark's ml/model_cache.py): a Python worker that serves many stages keeps a bounded set of weights, not every
model it ever loaded. Evicting drops the cache's reference, collects garbage and, on a GPU, returns the freed
blocks to the driver (torch.cuda.empty_cache); a caller that still holds the model keeps it until it lets go.

The default is 5, not pyspark's 3: a reused worker takes the tasks of every stage of a night in turn, and a
night's batch cycles through up to five models (SRL steps, NLI, pvi_g, pvi_null, info_gain). An LRU smaller
than such a cycle misses on every use, so with 3 each task would load its model again.

No Spark reads or writes here; `task_device` only asks Spark's TaskContext which GPU the task got.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from udfs.home import checkout, command, home
from udfs.model_paths import MODELS, REGISTRY_PREFIX, REGISTRY_RECORD, registry_path

DEFAULT_CACHE_SIZE = 5  # runtime.model_cache_size (see above)
_CACHE: OrderedDict[tuple[Any, ...], Any] = OrderedDict()  # least recently used first
_cache_size = DEFAULT_CACHE_SIZE
_LOCK = threading.RLock()
# Relative model folders resolve against udfs.home.home(): $RECEVAL_HOME (the session passes the driver's to the
# executors, jobs.infra.session), else the checkout, else the working directory.


class ModelUnavailable(RuntimeError):
    """A configured model is neither a local folder nor in the local Hugging Face cache."""


def registry_folder(name: str) -> Path:
    """models/<name> for `registry:<name>` (udfs.model_paths), or a ModelUnavailable naming the command that
    fetches it."""
    folder = registry_path(name)
    if not (folder / REGISTRY_RECORD).is_file():
        raise ModelUnavailable(
            f"registered model {name!r} is not fetched here ({folder} has no {REGISTRY_RECORD}): run "
            f"`{command(f'jobs.infra.models fetch {name}', f'models fetch {name}')}` "
            f"({command('jobs.infra.models list', 'models list')} shows the registry)"
        )
    return folder


def resolve_model_path(path: str) -> str:
    """`pip:<module>` -> the weights a pip package ships; `registry:<name>` -> models/<name>, fetched by
    jobs.infra.models; a relative folder -> absolute; else an HF id."""
    if path.startswith("pip:"):
        module = importlib.import_module(path[4:])
        return str(module.get_model_path())
    if path.startswith(REGISTRY_PREFIX):
        return str(registry_folder(path[len(REGISTRY_PREFIX):]))
    p = Path(path).expanduser()
    if not p.is_absolute() and (home() / p).exists():
        return str(home() / p)
    return str(p) if p.exists() else path


def check_available(path: str, role: str) -> str:
    """Resolve a model on the driver before any table is touched; a clear error names how to provide it."""
    resolved = resolve_model_path(path)
    if Path(resolved).is_dir():
        if not (Path(resolved) / "config.json").exists() and not any(Path(resolved).glob("meta.json")):
            raise ModelUnavailable(f"model for {role!r} at {resolved} has no config.json")
        return resolved
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(resolved, "config.json")
    except Exception:  # not a valid repo id either
        cached = None
    if isinstance(cached, str):
        return resolved
    p = Path(path).expanduser()
    if not p.is_absolute() and p.parts[0] == MODELS and p.name.startswith("tiny-"):
        # The offline profile's random models: built locally, never downloaded.
        how = command("jobs.infra.tiny_models --out models", "setup")
        raise ModelUnavailable(
            f"models.{role}.path: the tiny offline model {path!r} is not built here (looked for {home() / p}); "
            f"build it with `{how}`{' (or make setup)' if checkout() is not None else ''}, or set "
            f"models.{role}.path / models.profile"
        )
    tried = f" (looked for the folder {home() / p})" if not p.is_absolute() else ""
    raise ModelUnavailable(
        f"model {path!r} for {role!r}{tried} is not available on this machine: it is neither a local folder nor in "
        f"the Hugging Face cache ({os.environ.get('HF_HOME', '~/.cache/huggingface')}), and this machine cannot "
        f"download it. Provide it with --set models.{role}.path=/path/to/model (a folder saved with "
        "save_pretrained), pre-fill the HF cache on a machine with a network, or use --set models.profile=offline."
    )


DEVICES = ("auto", "cpu", "cuda")  # runtime.device


def task_gpus() -> list[str]:
    """The GPU addresses Spark assigned to this task (`TaskContext.resources()["gpu"]`, set by
    spark.task.resource.gpu.amount); empty outside a Spark task, without pyspark, or for a task given none."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except Exception:  # no pyspark (the device bench runs the UDF functions without it)
        return []
    if ctx is None:
        return []
    gpus = ctx.resources().get("gpu")
    return list(gpus.addresses) if gpus is not None and gpus.addresses else []


def choose_device(preference: str, cuda_devices: int, gpus: Sequence[str]) -> str:
    """The device rule, without torch or Spark: `preference` (runtime.device), the CUDA devices this worker
    sees and the GPU addresses Spark gave the task.

    - cpu, or no CUDA device visible: the CPU (cuda then fails: a task that must not fall back says so);
    - a task given a GPU: that GPU (Spark's addresses are the discovery script's indices, nvidia-smi's, which are
      torch's as long as the executor does not remap CUDA_VISIBLE_DEVICES);
    - CUDA visible but no GPU given (local mode, or outside Spark): the first visible GPU.
    """
    if preference not in DEVICES:
        raise ValueError(f"runtime.device must be one of {DEVICES}, not {preference!r}")
    if preference == "cpu":
        return "cpu"
    if cuda_devices < 1:
        if preference == "cuda":
            raise RuntimeError("runtime.device=cuda but no CUDA device is visible to this worker")
        return "cpu"
    if gpus:
        index = int(gpus[0])
        if not 0 <= index < cuda_devices:
            raise RuntimeError(
                f"Spark gave this task GPU {gpus[0]!r} but this worker sees {cuda_devices} CUDA device(s): the "
                "discovery script's addresses must be CUDA indices (check CUDA_VISIBLE_DEVICES on the executors)"
            )
        return f"cuda:{index}"
    return "cuda:0"


def task_device(preference: str = "auto") -> str:
    """The GPU Spark assigned to this task, else (local mode) the first visible GPU, else CPU (`choose_device`)."""
    import torch

    visible = torch.cuda.device_count() if preference != "cpu" and torch.cuda.is_available() else 0
    return choose_device(preference, visible, task_gpus() if visible else [])


def torch_dtype(preference: str, device: str):
    import torch

    if preference == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    # int8 loads fp32 weights; quantize_int8 then swaps the Linear layers.
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.float32}[preference]


def quantize_int8(model: Any, device: str) -> Any:
    """Dynamic int8 quantisation of every torch.nn.Linear (weights int8 per tensor, activations quantised on the
    fly): the opt-in `dtype: int8` for CPU generation and scoring. Measured, not assumed: on Qwen2.5-0.5B it
    doubled greedy tokens/s at batch 64 and changed greedy texts (bench/RESULTS.md), so it is never a default.
    Embeddings and the LM head tied to them stay fp32."""
    import torch

    if not device.startswith("cpu"):
        raise ValueError(f"dtype int8 (dynamic quantisation) runs on CPU only; this task got {device}")
    return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def set_threads(threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)


def quiet() -> None:
    """Progress bars of transformers/tokenizers off inside executors."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _free(evicted: list[Any]) -> None:
    """Let evicted models go: the last references dropped, garbage collected, cached GPU blocks released."""
    evicted.clear()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _evict_to(size: int) -> None:
    """Drop least recently used models until at most `size` stay (caller holds _LOCK)."""
    evicted = []
    while len(_CACHE) > size:
        evicted.append(_CACHE.popitem(last=False)[1])
    if evicted:
        _free(evicted)


def set_cache_size(size: int) -> None:
    """How many models this worker keeps (runtime.model_cache_size); shrinking evicts at once."""
    global _cache_size
    if size < 1:
        raise ValueError(f"model cache size must be at least 1, not {size}")
    with _LOCK:
        _cache_size = size
        _evict_to(size)


def cached_keys() -> list[tuple[Any, ...]]:
    """The cached models' keys, least recently used first."""
    with _LOCK:
        return list(_CACHE)


def cached(key: tuple[Any, ...], load: Any) -> Any:
    """`load()`'s value under `key`, kept in the bounded LRU cache; a hit makes it the most recently used.

    A miss evicts first (down to one below the size), so the new model never shares memory with one that
    is on its way out.
    """
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        _evict_to(_cache_size - 1)
        value = load()
        _CACHE[key] = value
        return value


def load_model(
    path: str,
    family: str,
    device: str = "cpu",
    dtype: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[Any, Any]:
    """(model, tokenizer), loaded once per Python worker and kept (bounded LRU); safetensors only."""
    # trust_remote_code is in the key: a model cached with remote code must not serve a caller without it.
    key = (path, family, device, dtype, revision, trust_remote_code)
    return cached(key, lambda: _load(path, family, device, dtype, revision, trust_remote_code))


def _load(
    path: str, family: str, device: str, dtype: str, revision: str | None, trust_remote_code: bool
) -> tuple[Any, Any]:
    quiet()
    import transformers as tf

    resolved = resolve_model_path(path)
    auto = {
        "causal": tf.AutoModelForCausalLM,
        "seq2seq": tf.AutoModelForSeq2SeqLM,
        "nli": tf.AutoModelForSequenceClassification,
        "srl": tf.AutoModelForTokenClassification,
        "embedding": tf.AutoModel,
    }[family]
    kwargs: dict[str, Any] = {"use_safetensors": True, "trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    model = auto.from_pretrained(resolved, dtype=torch_dtype(dtype, device), **kwargs)
    model.to(device).eval()
    if dtype == "int8":
        model = quantize_int8(model, device)
    tokenizer = tf.AutoTokenizer.from_pretrained(resolved, trust_remote_code=trust_remote_code)
    return model, tokenizer


def length_batches(
    lengths: Sequence[int], batch_size: int, sort: bool = True, max_tokens: int | None = None
) -> list[list[int]]:
    """Indices cut into batches of at most `batch_size`, and of at most `max_tokens` padded positions (rows x
    longest row) when given; sorted by length first (longest first, so an out-of-memory shows at once), which
    cuts padding. sort=False keeps input order (runtime.sort_by_length: the bench's baseline).

    The token budget matters on CPU: a batch of long rows materialises rows x heads x length^2 attention
    weights and gains nothing over a few rows, while short rows still fill a batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i]) if sort else list(range(len(lengths)))
    batches: list[list[int]] = []
    width = 0  # longest row of the last batch
    for i in order:
        wider = max(width, lengths[i])
        over = max_tokens is not None and batches and wider * (len(batches[-1]) + 1) > max_tokens
        if not batches or len(batches[-1]) == batch_size or over:
            batches.append([i])
            width = lengths[i]
        else:
            batches[-1].append(i)
            width = wider
    return batches


def task_cpus() -> int | None:
    """The cores Spark gave this task (spark.task.cpus); None outside a task."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return ctx.cpus() if ctx is not None else None
    except Exception:
        return None


def task_model(
    path: str,
    family: str,
    device: str = "auto",
    dtype: str = "auto",
    revision: str | None = None,
    threads: int | None = None,
    trust_remote_code: bool = False,
    cache_size: int | None = None,
) -> tuple[Any, Any, str]:
    """(model, tokenizer, device) for a UDF's worker side: quiet logs, the task's device, cached weights.

    torch gets `threads`, else the task's cores: more threads than that oversubscribe the executor.
    `cache_size` (runtime.model_cache_size, carried by the factory) sets how many models the worker keeps.
    """
    quiet()
    if cache_size is not None:
        set_cache_size(cache_size)
    set_threads(threads or task_cpus())
    chosen = task_device(device)
    model, tokenizer = load_model(path, family, chosen, dtype, revision, trust_remote_code)
    return model, tokenizer, chosen


def clear_cache() -> None:
    with _LOCK:
        _evict_to(0)
