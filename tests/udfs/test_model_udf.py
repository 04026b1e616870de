"""The one model-UDF contract (udfs.model_udf) and the bounded per-worker model cache (udfs.runtime), with fakes."""

from __future__ import annotations

import math
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

from udfs import generate as G
from udfs import loglik, model_udf, nli, runtime, sampling
from udfs import options as O

LONG = "x" * 5000  # an error message longer than the cut


def _poisoned(results):
    """A fake model call over texts: raises on any 'POISON' input, else one result per text; counts calls."""
    calls: list[int] = []

    def call(texts):
        calls.append(len(texts))
        if any("POISON" in t for t in texts):
            raise ValueError(f"poisoned {LONG}")
        return [results(t) for t in texts]

    return call, calls


def test_narrowed_isolates_the_failing_row_by_halving():
    texts = [f"row {i}" for i in range(16)]
    texts[5] = "POISON"
    call, calls = _poisoned(len)
    got, errors = model_udf.narrowed(lambda idx: call([texts[i] for i in idx]), 16, "quarantine", "x", texts.__getitem__)
    assert got == [None if i == 5 else len(texts[i]) for i in range(16)]
    assert [e is not None for e in errors] == [i == 5 for i in range(16)]
    assert errors[5] == f"ValueError: poisoned {LONG}"[: model_udf.ERROR_CHARS]
    assert len(errors[5]) == model_udf.ERROR_CHARS == 2000
    # 1 + 2 per level down to the poisoned row: 1 + 2 * log2(16) = 9 calls, where row by row took 17.
    assert len(calls) == 1 + 2 * math.ceil(math.log2(16))


def test_narrowed_fail_raises_naming_the_input():
    call, _ = _poisoned(len)
    with pytest.raises(RuntimeError, match=r"^scoring failed \('POISON'\): ValueError: poisoned x") as err:
        model_udf.narrowed(lambda idx: call(["POISON"]), 1, "fail", "scoring", lambda i: "POISON")
    assert isinstance(err.value.__cause__, ValueError)
    with pytest.raises(RuntimeError, match=r"^scoring failed \('2 rows'\)"):
        model_udf.narrowed(lambda idx: call(["a", "POISON"]), 2, "fail", "scoring", lambda i: "?")
    with pytest.raises(ValueError, match="on_error must be one of"):
        model_udf.narrowed(lambda idx: [], 0, "fail_fast", "scoring", str)


def test_narrowed_a_wrong_result_count_is_a_failure():
    got, errors = model_udf.narrowed(lambda idx: [1] * (len(idx) + 1), 2, "quarantine", "x", str)
    assert got == [None, None] and errors == ["ValueError: 2 results for 1 rows"] * 2
    assert model_udf.narrowed(lambda idx: [], 0, "quarantine", "x", str) == ([], [])


def _nli(premises, hypotheses):
    call, _ = _poisoned(lambda t: [0.2, 0.3, 0.5])
    return np.array(call(premises))


def _loglik(sources, targets):
    call, _ = _poisoned(lambda t: loglik.TargetScore(-1.0, 1, -1.0))
    return call(sources)


def _options(prompts, options, prefixes):
    call, _ = _poisoned(lambda t: None)
    call(prompts)
    return [[O.OptionScore(-1.0, 1, 1) for _ in opts] for opts in options]


def _generate(prompts):
    call, _ = _poisoned(lambda t: G.Generation(t.upper(), 1, False))
    return call(prompts)


def _draw(prompts):
    call, _ = _poisoned(lambda t: sampling.Drawn([G.Generation("a 1", 2, False)], G.Generation("b 2", 2, False)))
    return call(prompts)


FRAMES = {
    "nli": lambda texts, on_error: nli.score_frame(_nli, texts, ["h"] * len(texts), on_error),
    "loglik": lambda texts, on_error: __import__("pandas").DataFrame(
        loglik.score_frame(_loglik, texts, ["t"] * len(texts), on_error)
    ),
    "options": lambda texts, on_error: O.score_rows(_options, texts, [""] * len(texts), ["o"] * len(texts), on_error),
    "generate": lambda texts, on_error: G.generate_frame(_generate, texts, on_error),
    "sampling": lambda texts, on_error: sampling.draw_frame(_draw, texts, ["answer is"], on_error),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_every_model_udf_has_the_one_error_policy(name):
    texts = ["a", "b", "POISON", "c", "d"]
    frame = FRAMES[name](texts, "quarantine")
    assert len(frame) == 5
    assert frame["error"].tolist() == [None, None, f"ValueError: poisoned {LONG}"[:2000], None, None]
    with pytest.raises(RuntimeError, match=r"failed \('5 (rows|pairs|examples|prompts)'\): ValueError: poisoned"):
        FRAMES[name](texts, "fail")


@pytest.fixture
def lru(monkeypatch):
    """The runtime module with an empty cache; its full garbage collections counted, not run (each takes
    0.5-1.5 s in a process holding torch and Spark: the fakes below have no cycles, refcounting frees them)."""
    runtime.clear_cache()
    collections: list[int] = []
    monkeypatch.setattr(runtime, "gc", SimpleNamespace(collect=lambda: collections.append(1)))
    runtime.collections = collections
    yield runtime
    runtime.clear_cache()
    runtime.set_cache_size(runtime.DEFAULT_CACHE_SIZE)
    del runtime.collections


class _Model:
    """Stands for loaded weights: the test holds only weak references."""


def test_model_cache_evicts_the_least_recently_used_and_frees_it(lru, monkeypatch):
    import torch

    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    lru.set_cache_size(2)
    refs = {k: weakref.ref(lru.cached((k,), _Model)) for k in ("a", "b")}
    assert lru.cached(("a",), lambda: pytest.fail("a hit must not load")) is refs["a"]()  # a is now newest
    refs["c"] = weakref.ref(lru.cached(("c",), _Model))  # full: b, the least recently used, goes
    assert lru.cached_keys() == [("a",), ("c",)]
    assert refs["b"]() is None  # freed, not only forgotten
    assert refs["a"]() is not None and refs["c"]() is not None
    assert emptied == [1] and lru.collections == [1]  # collected and the GPU's blocks released, once
    lru.set_cache_size(1)  # shrinking evicts at once
    assert lru.cached_keys() == [("c",)] and refs["a"]() is None
    assert emptied == [1, 1] and lru.collections == [1, 1]


def test_model_cache_default_size_and_load_model_uses_it(lru, monkeypatch):
    runtime = lru
    loads: list[str] = []

    def fake_load(path, family, device, dtype, revision, trust_remote_code):
        loads.append(path)
        return _Model(), f"tok-{path}"

    monkeypatch.setattr(runtime, "_load", fake_load)
    assert runtime.DEFAULT_CACHE_SIZE == 5
    for path in ("n1", "n2", "n3", "n4", "n5") * 2:  # a night's cycle of five models: each loads once
        runtime.load_model(path, "nli")
    assert loads == ["n1", "n2", "n3", "n4", "n5"]
    loads.clear()
    runtime.set_cache_size(3)
    for path in ("m1", "m2", "m3", "m1", "m4", "m1", "m2"):
        runtime.load_model(path, "nli")
    # m1 kept by its use, m2 evicted by m4 and loaded again.
    assert loads == ["m1", "m2", "m3", "m4", "m2"]
    assert [k[0] for k in runtime.cached_keys()] == ["m4", "m1", "m2"]
    with pytest.raises(ValueError, match="at least 1"):
        runtime.set_cache_size(0)


def test_model_cache_size_is_configured():
    from jobs.infra.config_layers import load_settings

    assert load_settings().runtime.model_cache_size == runtime.DEFAULT_CACHE_SIZE
    assert load_settings(overrides=["runtime.model_cache_size=5"]).runtime.model_cache_size == 5
