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

The packing plan (which tokens, the rows' boundaries, the longest row) is computed on the CPU
from the batch's `HostRows`, read where the batch was built: its indices go to the device in one
asynchronous copy and the tokens are gathered there, with no host synchronisation.

Not here: planning which rows share a micro-batch (`batch.plan_micro_batches`, which counts
real tokens when packing), the attention kernels (`packed_attention`) or any loss math.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from asyncrl.errors import ConfigError
from asyncrl.training.batch import HostRows, TrainBatch, host_rows, to_device
from asyncrl.training.packed_attention import ROWS, use_packed_attention

KEY = "model.use_remove_padding"


@dataclass(frozen=True)
class Packed:
    """A micro-batch's real tokens as one sequence, and where its response tokens are."""

    input_ids: Tensor  # (1, N)
    position_ids: Tensor  # (1, N), 0 at each row's first token
    predicts: Tensor  # (R,) the packed position whose output predicts each real response token
    labels: Tensor  # (R,) those response tokens, row by row
    real: Tensor  # (R,) where each real response token sits in the (B, T) layout, flattened
    shape: tuple[int, int]  # (B, T), the response layout
    bounds: Tensor  # (B+1,) int32: row i is input_ids[0, bounds[i] : bounds[i+1]]
    lengths: tuple[int, ...]  # (B,) each row's tokens, host ints: packed attention plans from them
    longest: int  # the longest row's tokens

    def forward_kwargs(self) -> dict[str, Any]:
        """What a transformers model takes to run these rows: ids, positions and the rows'
        boundaries (flash attention's names; `packed_attention` reads them too)."""
        return dict(input_ids=self.input_ids, position_ids=self.position_ids, cu_seq_lens_q=self.bounds,
                    cu_seq_lens_k=self.bounds, max_length_q=self.longest, max_length_k=self.longest,
                    **{ROWS: self.lengths})


def pack(batch: TrainBatch) -> Packed:
    """`batch`'s attended tokens, row after row, as one (1, N) sequence.

    Needs contiguous rows (left-padded prompt, right-padded response) whose `position_ids` count
    from 0 at their first real token, as `build_batch` makes them: the rotary positions stay
    those of the padded rows. Planned on the CPU (`plan`); on the device only gathers run.
    Example: P = 2, T = 2, attention [[0, 1 | 1, 0], [1, 1 | 1, 1]] -> ids of the 1s, positions
    [0, 1, 0, 1, 2, 3], predicts [0, 3, 4] (row 0's prompt token, row 1's 2nd and 3rd tokens)."""
    P, T = batch.prompt_width, batch.responses.shape[1]
    host = host_rows(batch)
    assert all(host.contiguous_B), "a real response token without a real token before it: rows must be contiguous"
    index = plan(host, P, T)
    device = batch.input_ids.device
    gather, predicts, real, bounds = to_device(torch.cat(index), device).split([len(i) for i in index])
    lengths = tuple(p + r for p, r in zip(host.prompt_real_B, host.response_real_B, strict=True))
    return Packed(input_ids=batch.input_ids.reshape(-1).index_select(0, gather)[None],
                  position_ids=batch.position_ids.reshape(-1).index_select(0, gather)[None],
                  predicts=predicts, labels=batch.responses.reshape(-1).index_select(0, real), real=real,
                  shape=(batch.size, T), bounds=bounds.to(torch.int32),
                  lengths=lengths, longest=max(lengths))


def plan(host: HostRows, P: int, T: int) -> list[Tensor]:
    """CPU indices of contiguous rows packed end to end: (gather (N,) into the flattened
    (B, P+T) tokens, predicts (R,) packed positions, real (R,) into the flattened (B, T)
    responses, bounds (B+1,)). Row i's tokens are its columns [P - prompt_i, P + response_i).
    Example: P = 2, T = 2, prompt (1, 2), response (1, 2) -> gather [1, 2, 4, 5, 6, 7], predicts
    [0, 3, 4], real [0, 2, 3], bounds [0, 2, 6]."""
    prompt = torch.tensor(host.prompt_real_B, dtype=torch.long)  # (B,)
    response = torch.tensor(host.response_real_B, dtype=torch.long)
    lengths = prompt + response
    bounds = torch.nn.functional.pad(lengths.cumsum(0), (1, 0))  # (B+1,)
    rows = torch.arange(len(lengths))
    first = rows * (P + T) + P - prompt  # each row's first token in the flattened (B, P+T)
    gather = torch.repeat_interleave(first - bounds[:-1], lengths) + torch.arange(int(bounds[-1]))
    step = torch.arange(int(response.sum())) - torch.repeat_interleave(response.cumsum(0) - response, response)
    predicts = torch.repeat_interleave(bounds[:-1] + prompt - 1, response) + step
    real = torch.repeat_interleave(rows * T, response) + step
    return [gather, predicts, real, bounds]


def unpack(values_R: Tensor, packed: Packed) -> Tensor:
    """Per-response-token `values_R` (R,) at their rows and columns, zeros elsewhere; the
    gradient flows back to `values_R`. # (B, T)"""
    B, T = packed.shape
    return values_R.new_zeros(B * T).index_copy(0, packed.real, values_R).view(B, T)


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
    tol = packing_tolerance(packed.dtype)
    if not torch.allclose(packed.float(), alone.float(), rtol=tol, atol=tol):
        raise ConfigError(f"{KEY}=true: {type(model).__name__} (attention {_attention(model)}) lets packed rows "
                          f"attend to each other; set {KEY}=false")


def packing_tolerance(dtype: torch.dtype) -> float:
    """`check_packing`'s rtol and atol for outputs in `dtype`: 4 units of its rounding, at least 1e-3.
    A packed row runs other kernels than a row alone (cuBLAS picks by shape), so bf16 outputs may
    differ by an ulp or two; rows that attend to each other differ by far more.

    Example: float32 -> 1e-3; bfloat16 -> 4 x 2^-7 = 0.03125 (one ulp of a 0.6 logit is 2^-9)."""
    return max(1e-3, 4 * torch.finfo(dtype).eps)


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
