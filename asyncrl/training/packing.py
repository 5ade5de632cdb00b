"""Padding-free micro-batches (`model.use_remove_padding`): a micro-batch's rows as one sequence.

`pack(batch)` concatenates every row's real tokens (prompt + response, where `attention_mask`
is 1) into one row of shape (1, N), N = the sum of the rows' lengths, with `position_ids`
restarting at 0 for each row and the rows' boundaries (`bounds`, flash attention's
`cu_seq_lens`). transformers (5.x) alone already keeps packed rows apart, given restarting
position ids and no attention mask (`masking_utils.find_packed_sequence_indices`: a dense
block-diagonal causal mask for sdpa and eager, varlen kernels for flash attention); sdpa and
eager models are switched to `packed_attention`, which runs each row's attention within itself
(rows of similar length in one call) instead of over an (N, N) mask. `enable_packing(model)` does
that switch and `check_packing` then runs the model on two packed rows vs each alone, raising a
ConfigError naming the key when they differ or the forward cannot take packed rows.

Only the positions that predict a real response token are read (`Packed.predicts`; the actor
passes them as `logits_to_keep`, so the head runs on R response tokens, not N); `unpack` puts
each of the R per-token results back at its (row, column) of the (B, T) response layout, zeros
at padding, so log-probs, entropies, values and every loss are computed as in the padded path.
Linear layers and the head run on real tokens only; attention costs sum(row length^2).

Not here: planning which rows share a micro-batch (`batch.plan_micro_batches`, which counts
real tokens when packing), the attention kernels (`packed_attention`) or any loss math.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from asyncrl.errors import ConfigError
from asyncrl.training.batch import TrainBatch
from asyncrl.training.packed_attention import use_packed_attention

KEY = "model.use_remove_padding"


@dataclass(frozen=True)
class Packed:
    """A micro-batch's real tokens as one sequence, and where its response tokens are."""

    input_ids: Tensor  # (1, N)
    position_ids: Tensor  # (1, N), 0 at each row's first token
    predicts: Tensor  # (R,) the packed position whose output predicts each real response token
    labels: Tensor  # (R,) those response tokens, row by row
    real: Tensor  # (B, T) bool: the real response tokens (R of them)
    bounds: Tensor  # (B+1,) int32: row i is input_ids[0, bounds[i] : bounds[i+1]]
    longest: int  # the longest row's tokens

    def forward_kwargs(self) -> dict[str, Any]:
        """What a transformers model takes to run these rows: ids, positions and the rows'
        boundaries (flash attention's names; `packed_attention` reads them too)."""
        return dict(input_ids=self.input_ids, position_ids=self.position_ids, cu_seq_lens_q=self.bounds,
                    cu_seq_lens_k=self.bounds, max_length_q=self.longest, max_length_k=self.longest)


def pack(batch: TrainBatch) -> Packed:
    """`batch`'s attended tokens, row after row, as one (1, N) sequence.

    Needs contiguous rows (left-padded prompt, right-padded response) whose `position_ids` count
    from 0 at their first real token, as `build_batch` makes them: the rotary positions stay
    those of the padded rows.
    Example: P = 2, T = 2, attention [[0, 1 | 1, 0], [1, 1 | 1, 1]] -> ids of the 1s, positions
    [0, 1, 0, 1, 2, 3], predicts [0, 3, 4] (row 0's prompt token, row 1's 2nd and 3rd tokens)."""
    keep = batch.attention_mask != 0  # (B, P+T)
    P = batch.prompt_width
    real = keep[:, P:]  # (B, T)
    slot = keep.flatten().cumsum(0).view(keep.shape) - 1  # (B, P+T): packed position of each kept token
    before = keep[:, P - 1 : -1]  # (B, T): the token before each response column
    assert bool(before[real].all()), "a real response token without a real token before it: rows must be contiguous"
    lengths = keep.sum(-1)  # (B,)
    bounds = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    return Packed(input_ids=batch.input_ids[keep][None], position_ids=batch.position_ids[keep][None],
                  predicts=slot[:, P - 1 : -1][real], labels=batch.responses[real], real=real, bounds=bounds,
                  longest=int(lengths.max()))


def unpack(values_R: Tensor, packed: Packed) -> Tensor:
    """Per-response-token `values_R` (R,) at their rows and columns, zeros elsewhere; the
    gradient flows back to `values_R`. # (B, T)"""
    return values_R.new_zeros(packed.real.shape).masked_scatter(packed.real, values_R)


def enable_packing(model: nn.Module, logits: bool = True) -> None:
    """Make `model` run packed rows at their own attention cost (`packed_attention`), then
    `check_packing` it."""
    use_packed_attention(model)
    check_packing(model, logits)


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
        alone = torch.cat([_first_output(model, [row], logits)[0] for row in rows])
        packed = _first_output(model, rows, logits)[0]
    except TypeError as exc:
        raise ConfigError(f"{KEY}=true: {type(model).__name__} cannot run packed rows ({exc}); "
                          f"set {KEY}=false") from None
    finally:
        model.train(was_training)
    if not torch.allclose(packed.float(), alone.float(), rtol=1e-3, atol=1e-3):
        raise ConfigError(f"{KEY}=true: {type(model).__name__} (attention {_attention(model)}) lets packed rows "
                          f"attend to each other; set {KEY}=false")


def _first_output(model: nn.Module, rows: list[Tensor], logits: bool) -> Tensor:
    """`model` on `rows` packed into one sequence, called as the trainer calls it."""
    device = rows[0].device
    lengths = [len(row) for row in rows]
    bounds = torch.tensor([0, *lengths], device=device).cumsum(0).to(torch.int32)
    positions = torch.cat([torch.arange(n, device=device) for n in lengths])
    kwargs = dict(input_ids=torch.cat(rows)[None], position_ids=positions[None], cu_seq_lens_q=bounds,
                  cu_seq_lens_k=bounds, max_length_q=max(lengths), max_length_k=max(lengths), use_cache=False)
    if logits:
        return model(**kwargs, logits_to_keep=torch.arange(sum(lengths), device=device)).logits
    return model(**kwargs)[0]


def _attention(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", "unknown"))
