"""The benchmark harness runs end to end in its CPU dry mode (tiny models, 6 chains; on a 2-worker standalone
cluster by hand, `make test-manual`): what CI can check of it."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from jobs.infra.config_paths import PROJECT_ROOT


def _dry_run(tmp_path, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    out = subprocess.run(
        [sys.executable, "bench/run.py", "--dry-run", *extra, "--results", str(tmp_path / "RESULTS.md")],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=1200, env=env,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert not (tmp_path / "RESULTS.md").exists()  # a dry run records nothing
    return out.stdout


@pytest.mark.slow
def test_bench_run_dry_mode_reports_both_ratios(tmp_path):
    text = _dry_run(tmp_path)
    for row in ("(a) pipeline", "(b) official shape", "(c) raw batched forwards"):
        assert re.search(rf"\| {re.escape(row)}[^|]*\| [0-9.]+ \|", text), text[-3000:]
    official_over_pipeline = float(re.search(r"\(b\)/\(a\) = ([0-9.]+)x", text).group(1))
    pipeline_over_raw = float(re.search(r"\(a\)/\(c\) = ([0-9.]+)", text).group(1))
    assert math.isfinite(official_over_pipeline) and official_over_pipeline > 0
    # Spark cannot beat the same forwards without Spark by much; far above 1 is expected for 6 chains.
    assert pipeline_over_raw > 0.5


# Manual: a standalone cluster of its own beside the dry run (about a minute of CI's slow set); the pipeline on a
# standalone cluster is test_cluster.py's, this checks only the benchmark's table for it.
@pytest.mark.manual
def test_bench_run_dry_mode_on_a_two_worker_cluster(tmp_path):
    text = _dry_run(tmp_path, "--cluster", "2")
    # The same scoring on a two-worker standalone cluster (in-process driver, executors import the checkout).
    assert re.search(r"\| 2 \| [0-9.]+ \| [0-9.]+ \| 1\.00x \|", text), text[-3000:]


# -- bench/device_gpu_path.py (issue 48): the GPU-path script in its CPU tiny mode, and its model shapes ---------
def _gpu_path():
    sys.path.insert(0, str(PROJECT_ROOT / "bench"))
    import device_gpu_path

    return device_gpu_path


# The registry's exact counts (conf/model_registry.yaml) and the published sizes of the paper's checkpoints.
PAPER_PARAMETERS = {"nli": 435_064_835, "pvi_g": 737_668_096, "pvi_null": 737_668_096, "info_gain": 1_557_611_200,
                    "info_gain_small": 268_098_176, "generator": 630_167_424}  # fmt: skip
SHAPE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "query_pre_attn_scalar", "sliding_window", "max_position_embeddings",
              "tie_word_embeddings", "layer_types", "rope_parameters")  # fmt: skip


@pytest.mark.parametrize(("role", "folder"), [("info_gain_small", "gemma3-270m"),
                                              ("generator", "qwen2.5-coder-0.5b-instruct")])
def test_gpu_path_registry_shapes_equal_the_fetched_configs(role, folder):
    """The device cannot take the registry's weights (over 64 MiB): it builds their shapes, which must be theirs.
    Compared with the fields recorded from the fetched configs (tests/data, so a bare clone checks them) and, where
    the model is fetched here, with its config.json itself."""
    recorded = json.loads((PROJECT_ROOT / "tests/data/registry_model_shapes.json").read_text())[folder]
    built = _gpu_path().model_configs("paper", {"pad": 0, "eos": 1, "endoftext": 3})[role].to_dict()
    assert len(recorded) >= 11
    assert {k: built.get(k) for k in recorded} == recorded
    fetched = PROJECT_ROOT / "models" / folder / "config.json"
    if fetched.is_file():
        real = json.loads(fetched.read_text())
        assert {k: real.get(k) for k in SHAPE_KEYS if k in recorded or k in real} == recorded


@pytest.mark.slow
def test_gpu_path_paper_shapes_have_the_paper_models_sizes():
    """The paper-sized configs, instantiated on the meta device (no memory, no weights): their parameter counts."""
    import torch
    import transformers as tf

    gp = _gpu_path()
    auto = {"nli": tf.AutoModelForSequenceClassification, "seq2seq": tf.AutoModelForSeq2SeqLM,
            "causal": tf.AutoModelForCausalLM}  # fmt: skip
    counts = {}
    for role, config in gp.model_configs("paper", {"pad": 0, "eos": 1, "endoftext": 3}).items():
        with torch.device("meta"):
            model = auto[gp.FAMILY[role]].from_config(config)
        counts[role] = gp.parameter_counts(model)
    assert {role: c["parameters"] for role, c in counts.items()} == PAPER_PARAMETERS
    # The FLOPs estimate's body: everything but the embeddings and the output layer (Gemma's 168M-entry
    # embedding is tied; Qwen's separate 136M-entry head is left out too).
    assert counts["info_gain_small"]["body"] == 268_098_176 - 262_144 * 640
    assert counts["generator"]["body"] == 630_167_424 - 2 * 151_936 * 896
    assert counts["pvi_g"]["encoder_body"] + counts["pvi_g"]["decoder_body"] == counts["pvi_g"]["body"]


def test_gpu_path_nli_pairs_are_the_workload_rule():
    """The device script's copy of the NLI pair rule (bench/workload.py's needs pydantic, absent there)."""
    sys.path.insert(0, str(PROJECT_ROOT / "bench"))
    import workload

    gp = _gpu_path()
    chains = gp.load_chains()
    assert len(chains) == 48 and {c.dataset for c in chains} == {"entailment_bank", "gsm8k"}
    for c in chains:
        same = workload.Chain(c.chain_id, c.context, c.premises, c.conclusions, c.answer)
        assert gp.nli_pairs(c) == workload.nli_pairs(same)
    requests = gp.lm_requests(chains, "info_gain")
    assert len(requests) == 2 * sum(len(c.conclusions) for c in chains)  # L(i-1) and L(i) per step, officially


@pytest.mark.slow
def test_gpu_path_tiny_mode_runs_every_path_and_checks(tmp_path):
    """The script the device runs, at its tiny size on CPU: every part comes back with the three paths timed,
    the device the UDF factories chose, CPU-against-CPU equality and the targets computed from the timings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    out = subprocess.run(
        [sys.executable, "bench/device_gpu_path.py", "--size", "tiny", "--out", str(tmp_path / "out"),
         "--work", str(tmp_path / "models")],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    r = json.loads((tmp_path / "out" / "results.json").read_text())
    gp = _gpu_path()
    assert r["size"] == "tiny" and r["device"] == "cpu" and r["udf_device"] == "cpu"
    assert r["bf16_peak_flops"] is None  # no peak for a CPU: no utilisation figure
    assert set(r["models"]) == set(gp.FAMILY) and all(m["parameters"] > 0 for m in r["models"].values())
    scoring = ("nli", "pvi_g", "pvi_null", "info_gain", "info_gain_small", "options seq2seq", "options causal")
    assert set(r["roles"]) == {*scoring, "generate causal", "generate seq2seq"}
    for key in scoring:
        for dtype in ("fp32", "bf16"):
            part = r["roles"][key][dtype]
            assert part["udf_device"] == "cpu"  # no GPU here: the factories chose the CPU
            assert all(part[p] > 0 for p in ("a_s", "b_s", "c_s")) and part["flops"] > 0
            # The UDF path, the official shape and the raw forwards agree in fp32 on one device: batching,
            # padding, prefix and prompt sharing change no score.
            if dtype == "fp32":
                assert part["check_vs_cpu_fp32"]["max_rel"] <= gp.FP32_REL_TOL, key
                assert part["b_vs_a"]["max_rel"] <= gp.FP32_REL_TOL and part["b_vs_a"]["n"] > 0, key
                assert part["b_vs_c"]["max_rel"] <= gp.FP32_REL_TOL and part["b_vs_c"]["n"] > 0, key
            else:
                assert part["check_vs_cpu_fp32"]["max_abs"] > 0  # bf16 is reported, and it does deviate
    assert r["fp32_equal_to_cpu"] is True
    for dtype in ("fp32", "bf16"):
        s = r["chain_scoring"][f"{dtype} paper"]
        assert s["b_over_a"] == pytest.approx(s["a_s_per_chain"] / s["b_s_per_chain"])
        assert s["b_over_c"] == pytest.approx(s["c_s_per_chain"] / s["b_s_per_chain"])
        assert s["met_b_over_a"] == (s["b_over_a"] >= 20) and s["met_b_over_c"] == (s["b_over_c"] >= 0.8)
        assert "utilisation" not in s
    size = gp.SIZES["tiny"]
    for key in ("generate causal", "generate seq2seq"):
        gen = r["roles"][key]["bf16"]
        for batch in size.gen_batches:
            row = gen[f"batch_{batch}"]
            assert row["b_tokens"] == row["c_tokens"] == size.gen_prompts * size.new_tokens
            assert row["b_tokens_per_s"] > 0 and row["c_tokens_per_s"] > 0
    assert r["sweep_bf16_b_s"] and all(t > 0 for t in r["sweep_bf16_b_s"].values())
    # On a GPU the card's peak is known: the same timings give the utilisation, per chain and per part.
    r["bf16_peak_flops"] = 1e12
    gp.summarise(SimpleNamespace(results=r))
    s = r["chain_scoring"]["bf16 paper"]
    assert s["utilisation"]["b"] == pytest.approx(s["flops_per_chain"] / s["b_s_per_chain"] / 1e12)
    nli = r["roles"]["nli"]["bf16"]
    assert r["utilisation_bf16"]["nli"]["c"] == pytest.approx(nli["flops"] / nli["c_s"] / 1e12)
    gen = r["roles"]["generate causal"]["bf16"][f"batch_{size.gen_batches[-1]}"]
    assert r["utilisation_bf16"][f"generate causal batch_{size.gen_batches[-1]}"]["b"] == pytest.approx(
        gen["flops"] / gen["b_s"] / 1e12)


def test_long_chains_workload_is_what_it_says():
    """bench/long_chains.py's chains: n paragraph steps whose equations all hold (the arithmetic check has
    nothing to flag, so its cost is measured on checkable text), seeded, and a reasoning-model text of n blank-line
    paragraphs inside the tags."""
    import pandas as pd
    from conftest import load_script

    from jobs.receval import arith_scores
    from udfs import rcu

    bench = load_script(PROJECT_ROOT / "bench" / "long_chains.py")
    [one] = bench.case_chains("12")
    assert len(one["conclusions"]) == len(one["premises"]) == 12 and one["answer"] == one["conclusions"][-1].split()[-2]
    assert bench.case_chains("12") == [one] and len(bench.case_chains("3x5")) == 3
    texts = pd.Series([bench.step_text(p, c) for p, c in zip(one["premises"], one["conclusions"], strict=True)])
    checked = arith_scores.check_texts(texts)
    assert (checked["valid"] == 1.0).all() and (checked["errors"] == 0).all()
    text = bench.reasoning_text(30)
    chain, answer = text.removeprefix("<think>\n").split("\n</think>\n")
    assert len(rcu.paragraphs(chain)) == 30 and answer.startswith("The answer is ")
