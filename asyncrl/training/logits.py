"""The forward that predicts a batch's response tokens, and their log-probs and entropies from it.

`response_logits(model, batch, dtype, pack, chunked_at)` runs the model on a batch (its rows
padded, or packed into one padding-free sequence, `asyncrl.training.packing`) with the output head
on the response positions only (`logits_to_keep`), under autocast to `dtype` (off for float32:
the bf16-parameter path computes in its parameters' dtype, `asyncrl.training.precision`);
`chunked_at` swaps the head for the chunked log-prob/entropy head
(`asyncrl.training.vocab_chunks.fused_head`). `ResponseLogits` turns what came back into
per-token log-probs and entropies (float32 math) in the padded (B, T) layout.

Shared by the actor, the reference worker and the tests; it holds no state and does no
optimisation (`asyncrl.training.actor` does).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from asyncrl.algorithms.logprobs import entropy_from_logits, logprobs_from_logits
from asyncrl.training import packing
from asyncrl.training.batch import TrainBatch
from asyncrl.training.precision import autocast
from asyncrl.training.vocab_chunks import fused_head


@dataclass(frozen=True)
class ResponseLogits:
    """The logits that predict a batch's response tokens, their labels, and the way back from
    per-token results on them to the (B, T) response layout. From the chunked head
    (`chunked_at` set, `asyncrl.training.vocab_chunks`) `logits` holds each token's [log-prob,
    entropy] at temperature `chunked_at` instead: no (tokens x vocabulary) tensor exists."""

    logits: torch.Tensor  # (B, T, V) padded; (1, R, V) packed, R = real response tokens; chunked: (..., 2)
    labels: torch.Tensor  # (B, T) or (1, R)
    packed: packing.Packed | None = None
    chunked_at: float | None = None

    def to_rows(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token `values` (the logits' leading shape) in the (B, T) layout; packed: zeros at
        padding. # (B, T)"""
        return values if self.packed is None else packing.unpack(values[0], self.packed)

    def log_probs(self, temperature: float) -> torch.Tensor:
        """Log-probs of the labels (float32 math) in the (B, T) layout. # (B, T)"""
        if self.chunked_at is None:
            return self.to_rows(logprobs_from_logits(self.logits, self.labels, temperature))
        assert temperature == self.chunked_at, f"computed at temperature {self.chunked_at}, asked {temperature}"
        return self.to_rows(self.logits[..., 0])

    def entropies(self, temperature: float, grad: bool = True) -> torch.Tensor:
        """Entropy of softmax(logits / temperature) per token (float32 math), in the (B, T)
        layout; `grad=False`: detached, no backward through it. # (B, T)"""
        if self.chunked_at is None:
            return self.to_rows(entropy_from_logits(self.logits if grad else self.logits.detach(), temperature))
        assert temperature == self.chunked_at, f"computed at temperature {self.chunked_at}, asked {temperature}"
        return self.to_rows(self.logits[..., 1] if grad else self.logits[..., 1].detach())


def response_logits(model: nn.Module, batch: TrainBatch, dtype: torch.dtype = torch.float32,
                    pack: bool = False, chunked_at: float | None = None) -> ResponseLogits:
    """Logits that predict each response token, computed in `dtype`; the head runs on those
    positions only (`logits_to_keep`). `pack`: the rows' real tokens as one sequence
    (`asyncrl.training.packing`), else the padded rows. `chunked_at`: the head computes log-probs
    and entropies at that temperature over chunks of the vocabulary instead (`fused_head`)."""
    T = batch.responses.shape[1]
    with autocast(batch.input_ids.device, dtype):
        if pack:
            p = packing.pack(batch)
            with _head(model, p.labels[None], chunked_at):
                out = model(**p.forward_kwargs(), logits_to_keep=p.predicts, use_cache=False)
            return ResponseLogits(out.logits, p.labels[None], p, chunked_at)
        # the last T + 1 columns are P-1 .. P+T-1; the first T of them predict the response
        with _head(model, nn.functional.pad(batch.responses, (0, 1)), chunked_at):
            out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        position_ids=batch.position_ids, logits_to_keep=T + 1, use_cache=False)
    return ResponseLogits(out.logits[:, :T], batch.responses, None, chunked_at)


def _head(model: nn.Module, labels: torch.Tensor, chunked_at: float | None) -> AbstractContextManager[None]:
    return nullcontext() if chunked_at is None else fused_head(model, labels, chunked_at)


def response_log_probs(model: nn.Module, batch: TrainBatch, temperature: float,
                       dtype: torch.dtype = torch.float32, pack: bool = False, chunked: bool = False) -> torch.Tensor:
    """Log-probs of the response tokens (float32 math whatever `dtype`); `chunked`: from the
    hidden states over chunks of the vocabulary (`asyncrl.training.vocab_chunks`). # (B, T)"""
    return response_logits(model, batch, dtype, pack, temperature if chunked else None).log_probs(temperature)
