"""A saved Hugging Face model folder as an MLflow pyfunc model: registrable, loadable with mlflow.pyfunc.

MLflow's transformers flavor builds a `pipeline`, and transformers 5 has no text2text-generation pipeline
for the seq2seq PVI models; the pyfunc wraps the folder as it is (`artifacts/model`) and generates with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import mlflow.pyfunc
from mlflow.models import Model

from jobs.infra.config import RuntimeSettings

# model_config keys an NLI model's predict reads: its calls sized as the logging job's settings size scoring.
BATCH_SIZE, MAX_LENGTH = "batch_size", "max_length"


def nli_config(batch_size: int, max_length: int) -> dict[str, int]:
    """The model_config entries of an NLI model (pass the nli section's NliSettings.call_sizes)."""
    return {BATCH_SIZE: batch_size, MAX_LENGTH: max_length}


def _nli_call_sizes(model_config: Mapping[str, Any] | None) -> tuple[int, int]:
    # A model logged before the sizes were recorded ran with runtime's defaults: it still does.
    config, defaults = model_config or {}, RuntimeSettings.model_fields
    return (int(config.get(BATCH_SIZE, defaults["batch_size"].default)),
            int(config.get(MAX_LENGTH, defaults["max_length"].default)))


class GenerativeLM(mlflow.pyfunc.PythonModel):
    """predict(list of source texts or a frame's first column) -> generated texts (greedy, model_config's
    max_new_tokens)."""

    def load_context(self, context: Any) -> None:
        import json
        from pathlib import Path

        from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

        folder = Path(context.artifacts["model"])
        seq2seq = json.loads((folder / "config.json").read_text()).get("is_encoder_decoder", False)
        loader = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = loader.from_pretrained(folder, use_safetensors=True).eval()
        self.seq2seq = seq2seq

    def predict(self, context, model_input, params=None):  # untyped: MLflow reads hints as a schema
        import torch

        texts = list(model_input.iloc[:, 0]) if hasattr(model_input, "iloc") else list(model_input)
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True)
        max_new = int((context.model_config or {}).get("max_new_tokens", 64))
        with torch.no_grad():
            out = self.model.generate(**batch, max_new_tokens=max_new, do_sample=False)
        if not self.seq2seq:
            out = out[:, batch["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(out, skip_special_tokens=True)


class NliClassifier(mlflow.pyfunc.PythonModel):
    """predict(a frame with `premise` and `hypothesis` columns) -> a frame of entailment / neutral / contradiction
    probabilities, read from the model's label2id by name as the scoring job reads them (udfs.nli), in batches
    and cut to lengths the model_config gives (nli_config)."""

    def load_context(self, context: Any) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        folder = context.artifacts["model"]
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder, use_safetensors=True).eval()

    def predict(self, context, model_input, params=None):  # untyped: MLflow reads hints as a schema
        import pandas as pd

        from udfs.nli import CONTRADICTION, ENTAIL, NEUTRAL, predict_pairs

        batch_size, max_length = _nli_call_sizes(context.model_config)
        out = predict_pairs(self.model, self.tokenizer, list(model_input["premise"]), list(model_input["hypothesis"]),
                            batch_size=batch_size, max_length=max_length)
        return pd.DataFrame(out.probs, columns=[ENTAIL, NEUTRAL, CONTRADICTION])


def _python_model(folder: str) -> mlflow.pyfunc.PythonModel:
    """The pyfunc wrapper for a saved folder: a sequence classifier (NLI) or a generative LM."""
    import json
    from pathlib import Path

    architectures = json.loads((Path(folder) / "config.json").read_text()).get("architectures") or []
    return NliClassifier() if any(a.endswith("ForSequenceClassification") for a in architectures) else GenerativeLM()


def log_folder(uri: str, run_id: str, folder: str, name: str, registered_name: str | None,
               config: Mapping[str, Any] | None = None) -> None:
    """Log `folder` as the pyfunc model `name` of the run (and register it under `registered_name`); `config`:
    model_config entries its predict reads (an NLI model's nli_config)."""
    # Model.log is what mlflow.pyfunc.log_model calls, and it takes the run: no fluent active run is started
    # (that would end our run as FINISHED when it closes). _use_tracking_uri resets MLFLOW_TRACKING_URI on
    # exit (deleting it when no global URI was set): the caller's environment is put back as it was.
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        _log(uri, run_id, folder, name, registered_name, dict(config or {}))
    finally:
        if saved is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved


def _log(uri: str, run_id: str, folder: str, name: str, registered_name: str | None,
         config: dict[str, Any]) -> None:
    import torch
    import transformers
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    with _use_tracking_uri(uri):
        Model.log(
            artifact_path=None, flavor=mlflow.pyfunc, name=name, python_model=_python_model(folder),
            artifacts={"model": folder}, run_id=run_id, model_config={"max_new_tokens": 64, **config},
            registered_model_name=registered_name,
            # Given, so MLflow does not load the model in a subprocess to infer them.
            pip_requirements=[f"transformers=={transformers.__version__}",
                              f"torch=={torch.__version__.split('+')[0]}"],
        )
