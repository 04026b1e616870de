"""The CoT evaluation's model UDFs: option scoring, the three generators and the prompt round trip, built once per
job from the settings (`build_udfs`); each generator's keyword arguments follow the official code's generate
calls by default (`generator_options`). jobs/cot/evaluate.py's modes call them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column

from jobs.cot.settings import CotSettings
from jobs.infra.config import Settings


@dataclass(frozen=True)
class CotUdfs:
    """The model UDFs, built once per job (a new UDF object would reload the model)."""

    options: Callable[..., Column]  # (prompt, prefix, option) -> struct(sum_logprob, n_tokens, n_bytes, ...)
    direct_generate: Callable[..., Column]  # prompt -> struct(text, n_tokens, truncated, error)
    rationale: Callable[..., Column]  # CoT classification: the rationale (options are scored after it)
    cot_generate: Callable[..., Column]  # CoT generation: rationale and answer
    # suffix -> UDF source -> struct(prompt, truncated) (the official source round trip); None: source + suffix.
    prompt: Callable[[str], Callable[..., Column]] | None = None


def generator_options(cfg: CotSettings) -> dict[str, dict[str, Any]]:
    """Keyword arguments of `udfs.generate.generate` for each of the job's three generators (official values by
    default: evaluation.py's generate calls)."""
    sampling = dict(do_sample=cfg.sample, top_p=cfg.top_p, temperature=cfg.temperature, seed=cfg.seed,
                    no_repeat_ngram_size=cfg.no_repeat_ngram_size, clean_up_spaces=True)  # fmt: skip
    return {
        "direct_generate": dict(**sampling, max_new_tokens=cfg.direct_max_new_tokens, min_new_tokens=0,
                                stop_strings=list(cfg.direct_stop)),  # fmt: skip
        "rationale": dict(**sampling, max_new_tokens=cfg.max_new_tokens, min_new_tokens=cfg.min_new_tokens,
                          stop_strings=list(cfg.indicators) if cfg.stop_at_indicator else []),  # fmt: skip
        "cot_generate": dict(**sampling, max_new_tokens=cfg.generation_max_new_tokens,
                             min_new_tokens=cfg.generation_min_new_tokens, stop_strings=[]),  # fmt: skip
    }


def build_udfs(settings: Settings) -> CotUdfs:
    from udfs.generate import generate_udf, model_generator_factory
    from udfs.options import model_options_factory, options_udf

    cfg, rt, ref = settings.cot, settings.runtime, settings.models.cot
    if ref.family not in ("causal", "seq2seq"):
        raise ValueError(f"models.cot.family must be causal or seq2seq, got {ref.family!r}")
    batch = cfg.batch_size or rt.batch_size
    length = cfg.max_length
    dtype = rt.dtype if cfg.dtype == "auto" else cfg.dtype
    common = dict(path=ref.path, family=ref.family, device=rt.device, dtype=dtype, revision=ref.revision,
                  trust_remote_code=rt.trust_remote_code, torch_threads=rt.torch_threads,
                  cache_size=rt.model_cache_size)  # fmt: skip
    gens = generator_options(cfg)

    def gen(name: str) -> Callable[..., Column]:
        # cot.max_length is the official input length (the prompt's tokens). A causal LM's new tokens share its
        # window with the prompt (udfs.generate), so its window is the input length plus the new tokens (the
        # model's own context still bounds it); with 512 for both the prompt would be cut to one token.
        window = length + gens[name]["max_new_tokens"] if ref.family == "causal" else length
        factory = model_generator_factory(**common, batch_size=batch, max_length=window,
                                          max_tokens=rt.generation_batch_tokens, **gens[name])
        return generate_udf(factory, rt.on_row_error)

    def prompt(suffix: str) -> Callable[..., Column]:
        from udfs.cot_prompt import prompt_udf

        return prompt_udf(ref.path, suffix, length, rt.trust_remote_code, cfg.chat_template, cfg.source_roundtrip)

    return CotUdfs(
        options=options_udf(
            model_options_factory(**common, batch_size=batch, max_length=length, share_prompt=cfg.share_prompt,
                                  max_tokens=rt.max_batch_tokens, eos=cfg.score_eos and ref.family == "seq2seq",
                                  move_space=cfg.causal_move_space and ref.family == "causal"),  # fmt: skip
            rt.on_row_error,
        ),
        direct_generate=gen("direct_generate"),
        rationale=gen("rationale"),
        cot_generate=gen("cot_generate"),
        prompt=prompt if cfg.source_roundtrip or cfg.chat_template else None,
    )
