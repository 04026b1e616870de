"""The device a model UDF runs on (udfs.runtime.task_device): a task given a GPU uses that GPU, one without uses
the CPU. Checked on CPU with a fake TaskContext resource map and a faked CUDA device count, down to the device
each UDF family's factory loads its model on (the loader is faked: no weights, no CUDA)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from udfs import generate as G
from udfs import loglik, nli, runtime
from udfs import options as O


def test_choose_device_rule():
    assert runtime.choose_device("auto", 2, ["1"]) == "cuda:1"  # the GPU Spark gave the task
    assert runtime.choose_device("cuda", 2, ["0"]) == "cuda:0"
    assert runtime.choose_device("auto", 1, []) == "cuda:0"  # local mode: no resource map, one visible GPU
    assert runtime.choose_device("auto", 0, []) == "cpu"  # no GPU anywhere
    assert runtime.choose_device("cpu", 2, ["1"]) == "cpu"  # runtime.device=cpu wins over an assigned GPU
    with pytest.raises(RuntimeError, match="runtime.device=cuda but no CUDA device"):
        runtime.choose_device("cuda", 0, [])
    with pytest.raises(RuntimeError, match="GPU '3' but this worker sees 2 CUDA device"):
        runtime.choose_device("auto", 2, ["3"])
    with pytest.raises(ValueError, match="runtime.device must be one of"):
        runtime.choose_device("gpu", 1, [])


class _Context:
    """Stands for pyspark's TaskContext: only the resource map."""

    def __init__(self, resources: dict) -> None:
        self._resources = resources

    def resources(self) -> dict:
        return self._resources

    def cpus(self) -> int:
        return 1


@pytest.fixture
def machine(monkeypatch):
    """set(cuda_devices, task_gpus or None for no task): fakes torch's CUDA count and Spark's TaskContext."""
    import pyspark
    import torch

    def set_(cuda_devices: int, gpus: list[str] | None) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_devices > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_devices)
        resources = {"gpu": SimpleNamespace(name="gpu", addresses=gpus)} if gpus else {}
        ctx = _Context(resources) if gpus is not None else None
        monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: ctx))

    return set_


def test_task_device_reads_the_task_resource_map(machine):
    machine(cuda_devices=2, gpus=["1"])
    assert runtime.task_gpus() == ["1"]
    assert runtime.task_device("auto") == "cuda:1"
    machine(cuda_devices=2, gpus=[])  # a task given no GPU on a machine that has some: the first one
    assert runtime.task_gpus() == []
    assert runtime.task_device("auto") == "cuda:0"
    machine(cuda_devices=0, gpus=[])  # a task without a GPU on a machine without one
    assert runtime.task_device("auto") == "cpu"
    machine(cuda_devices=0, gpus=None)  # outside a Spark task
    assert runtime.task_gpus() == []
    assert runtime.task_device("auto") == "cpu"


# Each model UDF family's worker-side factory, with the arguments the jobs pass (device, dtype = auto).
FACTORIES = {
    "nli": lambda: nli.model_predictor("m", None, "auto", "auto", 8, 64),
    "loglik": lambda: loglik.model_scorer_factory("m", "causal", "auto", "auto"),
    "options": lambda: O.model_options_factory("m", "seq2seq", "auto", "auto"),
    "generate": lambda: G.model_generator_factory("m", "causal", "auto", "auto"),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
@pytest.mark.parametrize(
    ("cuda_devices", "gpus", "device", "dtype"),
    [(2, ["1"], "cuda:1", "bfloat16"), (0, [], "cpu", "float32")],
    ids=["task-given-gpu-1", "task-without-gpu"],
)
def test_udf_factory_loads_on_the_task_device(machine, monkeypatch, name, cuda_devices, gpus, device, dtype):
    machine(cuda_devices, gpus)
    loads: list[tuple[str, str]] = []

    def fake_load(path, family, device, dtype, revision, trust_remote_code):
        # torch_dtype is what _load hands from_pretrained: runtime.dtype=auto means bf16 on a GPU, fp32 on CPU.
        loads.append((device, str(runtime.torch_dtype(dtype, device)).removeprefix("torch.")))
        config = SimpleNamespace(label2id={"entailment": 0, "neutral": 1, "contradiction": 2})
        return SimpleNamespace(config=config), SimpleNamespace()

    runtime.clear_cache()
    monkeypatch.setattr(runtime, "_load", fake_load)
    monkeypatch.setattr(runtime, "set_threads", lambda threads: None)  # the fake task's 1 core stays out of torch
    try:
        made = FACTORIES[name]()()
    finally:
        runtime.clear_cache()
    assert loads == [(device, dtype)]
    if name == "loglik":  # the scorer puts its batches on the same device
        assert made.device == device
