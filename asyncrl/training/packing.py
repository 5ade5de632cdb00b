"""Padding-free micro-batches (`model.use_remove_padding`): a micro-batch's rows as one sequence.

`pack(batch)` concatenates every row's real tokens (prompt + response, where `attention_mask`
is 1) into one row of shape (1, N), N = the sum of the rows' lengths, with `position_ids`
restarting at 0 for each row. Given those position ids and no attention mask, transformers
(5.x: `masking_utils.find_packed_sequence_indices`) restricts attention to each row: a
block-diagonal causal mask for sdpa and eager, variable-length kernels for flash attention.
`check_packing(model)` verifies that on the model itself (two rows packed vs run alone) and
raises a ConfigError naming the key when it does not hold.

Only the positions that predict a real response token are read (`Packed.predicts`; the actor
passes them as `logits_to_keep`, so the head runs on R response tokens, not N); `unpack` puts
each of the R per-token results back at its (row, column) of the (B, T) response layout, zeros
at padding, so log-probs, entropies, values and every loss are computed as in the padded path.

How the attention costs: with sdpa or eager the mask is dense, so attention scores cost N^2
per micro-batch instead of the padded rows x width^2; flash attention's varlen kernels cost
sum(row length^2). Linear layers and the head run on real tokens only.

Not here: planning which rows share a micro-batch (`batch.plan_micro_batches`, which counts
real tokens when packing) or any loss math.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from asyncrl.errors import ConfigError
from asyncrl.training.batch import TrainBatch

KEY = "model.use_remove_padding"


@dataclass(frozen=True)
class Packed:
    """A micro-batch's real tokens as one sequence, and where its response tokens are."""

    input_ids: Tensor  # (1, N)
    position_ids: Tensor  # (1, N), 0 at each row's first token
    predicts: Tensor  # (R,) the packed position whose output predicts each real response token
    labels: Tensor  # (R,) those response tokens, row by row
    real: Tensor  # (B, T) bool: the real response tokens (R of them)


def pack(batch: TrainBatch) -> Packed:
    """`batch`'s attended tokens, row after row, as one (1, N) sequence.

    Needs contiguous rows (left-padded prompt, right-padded response, as `build_batch` makes)
    whose `position_ids` count from 0 (transformers finds row starts where they do not rise by 1).
    Example: P = 2, T = 2, attention [[0, 1 | 1, 0], [1, 1 | 1, 1]] -> ids of the 1s, positions
    [0, 1, 0, 1, 2, 3], predicts [0, 3, 4] (row 0's prompt token, row 1's 2nd and 3rd tokens)."""
    keep = batch.attention_mask != 0  # (B, P+T)
    P = batch.prompt_width
    real = keep[:, P:]  # (B, T)
    slot = keep.flatten().cumsum(0).view(keep.shape) - 1  # (B, P+T): packed position of each kept token
    before = keep[:, P - 1 : -1]  # (B, T): the token before each response column
    assert bool(before[real].all()), "a real response token without a real token before it: rows must be contiguous"
    return Packed(input_ids=batch.input_ids[keep][None], position_ids=batch.position_ids[keep][None],
                  predicts=slot[:, P - 1 : -1][real], labels=batch.responses[real], real=real)


def unpack(values_R: Tensor, packed: Packed) -> Tensor:
    """Per-response-token `values_R` (R,) at their rows and columns, zeros elsewhere; the
    gradient flows back to `values_R`. # (B, T)"""
    return values_R.new_zeros(packed.real.shape).masked_scatter(packed.real, values_R)


def resolve(setting: bool | None, device: torch.device) -> bool:
    """`model.use_remove_padding` for a model on `device`: None (the default) packs on CUDA
    and not on the CPU (docs/training.md has the measurements behind that)."""
    return device.type == "cuda" if setting is None else setting


@torch.no_grad()
def check_packing(model: nn.Module, logits: bool = True) -> None:
    """Raise a ConfigError unless `model` run on two packed rows gives what it gives on each row
    alone (logits, or with `logits=False` the first output, e.g. a decoder's hidden states)."""
    vocab = int(cast(Any, model).get_input_embeddings().num_embeddings)
    device = next(model.parameters()).device
    rows = [torch.arange(1, 4, device=device) % vocab, torch.arange(4, 6, device=device) % vocab]
    was_training = model.training
    model.eval()
    try:
        alone = torch.cat([_first_output(model, row[None], torch.arange(len(row), device=device)[None], logits)[0]
                           for row in rows])
        positions = torch.cat([torch.arange(len(row), device=device) for row in rows])[None]
        packed = _first_output(model, torch.cat(rows)[None], positions, logits)[0]
    except TypeError as exc:
        raise ConfigError(f"{KEY}=true: {type(model).__name__} cannot run packed rows ({exc}); "
                          f"set {KEY}=false") from None
    finally:
        model.train(was_training)
    if not torch.allclose(packed.float(), alone.float(), rtol=1e-3, atol=1e-3):
        raise ConfigError(f"{KEY}=true: {type(model).__name__} (attention {_attention(model)}) lets packed rows "
                          f"attend to each other; set {KEY}=false")


def _first_output(model: nn.Module, input_ids: Tensor, position_ids: Tensor, logits: bool) -> Tensor:
    if logits:
        return model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                     logits_to_keep=torch.arange(input_ids.shape[1], device=input_ids.device)).logits
    return model(input_ids=input_ids, position_ids=position_ids, use_cache=False)[0]


def _attention(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", "unknown"))
