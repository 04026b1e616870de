"""Encoded (source, target) token ids -> padded tensors -> one forward pass -> per-token target log-probs: the
plain (unshared) scoring pass of udfs.loglik and the pieces other scorers reuse (prompt-shared option scoring,
udfs.options; the packed passes of udfs.prefix_sharing). Plain torch; tokenising the texts is udfs.loglik's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

Family = Literal["causal", "seq2seq"]
IGNORE = -100  # label value torch's cross-entropy and HF models ignore


@dataclass(frozen=True)
class Encoded:
    source_ids: list[int]
    target_ids: list[int]
    truncated: bool

    @property
    def length(self) -> int:
        return len(self.source_ids) + len(self.target_ids)


# --- batching ----------------------------------------------------------------------------------------------


def causal_batch(
    items: Sequence[Encoded], pad: int, padding_side: str = "right", device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """input_ids/attention_mask/position_ids plus `labels`/`label_mask` aligned with the shifted logits.

    labels[b, t] is the token at position t+1 when it belongs to the target, so
    `token_logprobs(logits[:, :-1], labels, label_mask)` gives the target log-probs.
    """
    width = max(e.length for e in items)
    ids = torch.full((len(items), width), pad, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    labels = torch.zeros((len(items), width - 1), dtype=torch.long)
    label_mask = torch.zeros((len(items), width - 1), dtype=torch.bool)
    for b, e in enumerate(items):
        seq = e.source_ids + e.target_ids
        start = width - len(seq) if padding_side == "left" else 0
        ids[b, start : start + len(seq)] = torch.tensor(seq)
        mask[b, start : start + len(seq)] = 1
        first = start + len(e.source_ids)  # position of the first target token
        if e.target_ids:
            labels[b, first - 1 : first - 1 + len(e.target_ids)] = torch.tensor(e.target_ids)
            label_mask[b, first - 1 : first - 1 + len(e.target_ids)] = True
    # Positions count real tokens only, so a left-padded row sees the same positions as unpadded.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "position_ids": positions.to(device),
        "labels": labels.to(device),
        "label_mask": label_mask.to(device),
    }


def seq2seq_batch(
    items: Sequence[Encoded], pad: int, padding_side: str = "right", device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Encoder inputs padded on `padding_side`; decoder labels always right-padded with -100."""
    width = max(len(e.source_ids) for e in items)
    t_width = max(1, max(len(e.target_ids) for e in items))
    ids = torch.full((len(items), width), pad, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    labels = torch.full((len(items), t_width), IGNORE, dtype=torch.long)
    for b, e in enumerate(items):
        n = len(e.source_ids)
        start = width - n if padding_side == "left" else 0
        ids[b, start : start + n] = torch.tensor(e.source_ids)
        mask[b, start : start + n] = 1
        if e.target_ids:
            labels[b, : len(e.target_ids)] = torch.tensor(e.target_ids)
    label_mask = labels != IGNORE
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "labels": labels.to(device),
        "label_mask": label_mask.to(device),
    }


# --- maths -------------------------------------------------------------------------------------------------


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p(labels[b, t]) under logits[b, t] (natural log, float32), 0 where `mask` is false.

    Labels under a false mask may hold anything (e.g. -100): they are replaced before the gather.
    """
    logits = logits.float()
    safe = torch.where(mask.bool(), labels, torch.zeros_like(labels))
    picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    logp = picked - torch.logsumexp(logits, dim=-1)
    return logp * mask.to(logp.dtype)


def decoder_start_id(model: Any) -> int:
    """The token an encoder-decoder's decoder starts from (T5: the pad token)."""
    start, pad = model.config.decoder_start_token_id, model.config.pad_token_id
    return int(start if start is not None else pad if pad is not None else 0)


def _decoder_inputs(model: Any, labels: torch.Tensor) -> torch.Tensor:
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    shifted = labels.new_full(labels.shape, pad)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_id(model)
    return shifted.masked_fill(shifted == IGNORE, pad)


@torch.inference_mode()
def batch_logprobs(model: Any, family: Family, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One forward pass -> (batch, target width) log-probs of the target tokens, 0 on padding."""
    if family == "seq2seq":
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=_decoder_inputs(model, batch["labels"]),
            use_cache=False,
        )
        return token_logprobs(out.logits, batch["labels"], batch["label_mask"])
    label_mask = batch["label_mask"]
    if not bool(label_mask.any()):
        return torch.zeros(label_mask.shape, dtype=torch.float32, device=label_mask.device)
    # Only positions that score a target token need the LM head (a vocabulary-wide matmul): keep the columns
    # from the first one any row needs.
    first = int(label_mask.any(0).nonzero()[0])
    keep = label_mask.shape[1] - first
    kwargs: dict[str, Any] = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "position_ids": batch["position_ids"],
        "use_cache": False,
    }
    # The last position scores nothing.
    logits = causal_forward(model, kwargs, keep + 1).logits[:, :-1]
    return token_logprobs(logits, batch["labels"][:, first:], label_mask[:, first:])


def causal_forward(model: Any, kwargs: dict[str, Any], keep: int | torch.Tensor) -> Any:
    """A causal LM forward whose output keeps the logits of the last `keep` positions only (or, a tensor, of
    those positions)."""
    try:
        return model(**kwargs, logits_to_keep=keep)
    except TypeError:  # architectures without logits_to_keep: the full logits, cut here
        out = model(**kwargs)
        out.logits = out.logits[:, -keep:] if isinstance(keep, int) else out.logits[:, keep]
        return out


# --- model work (counted by every scoring pass) -------------------------------------------------------------


@dataclass
class Stats:
    """Model work done by `score`: forward passes and token positions run (padding not counted)."""

    forwards: int = 0
    positions: int = 0

    def add(self, mask: torch.Tensor) -> None:
        self.forwards += 1
        self.positions += int(mask.sum())
