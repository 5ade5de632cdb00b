"""Tests for asyncrl.algorithms.agg: hand-computed reductions and masked-position invariance."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.algorithms.agg import LOSS_AGG_MODES, agg_loss, masked_mean, masked_sum, masked_var, masked_whiten

from ._util import close, random_mask, scramble

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token-mean", {}, 2.5),
        ("seq-mean-token-sum", {}, 5.0),
        ("seq-mean-token-mean", {}, 3.0),
        ("seq-mean-token-sum-norm", {}, 10.0 / 2 / 3),
        ("seq-mean-token-sum-norm", {"norm_length": 10}, 0.5),
    ],
)
def test_agg_loss_hand_example(mode: str, kwargs: dict, expected: float) -> None:
    close(agg_loss(LOSS, MASK, mode, **kwargs), expected)


def test_masked_reductions_hand_example() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    close(masked_sum(x, m), 6.0)
    close(masked_mean(x, m), 2.0)
    close(masked_mean(x, m, dim=-1), [2.0])
    close(masked_var(x, m), 1.0)
    close(masked_var(x, m, unbiased=False), 2.0 / 3.0)
    close(masked_whiten(x, m), [[-1.0, 0.0, 1.0, 0.0]])
    close(masked_whiten(x, m, shift_mean=False), [[1.0, 2.0, 3.0, 0.0]])


def test_empty_mask_gives_zero_not_nan() -> None:
    zero_mask = torch.zeros(2, 3)
    for mode in LOSS_AGG_MODES:
        close(agg_loss(LOSS, zero_mask, mode), 0.0)
    close(masked_mean(LOSS, zero_mask), 0.0)


def test_empty_rows_do_not_count_as_sequences() -> None:
    loss = torch.tensor([[2.0, 4.0], [7.0, 7.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    close(agg_loss(loss, mask, "seq-mean-token-mean"), 3.0)
    close(agg_loss(loss, mask, "seq-mean-token-sum"), 6.0)


def test_unknown_mode_raises() -> None:
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(LOSS, MASK, "token-sum")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_nan_at_masked_positions_is_ignored(mode: str) -> None:
    dirty = scramble(LOSS, MASK, fill=float("nan"))
    close(agg_loss(dirty, MASK, mode), agg_loss(LOSS, MASK, mode))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_with_global_counts_sum_to_full_loss(mode: str) -> None:
    gen = torch.Generator().manual_seed(3)
    loss, mask = torch.randn(6, 5, generator=gen), random_mask(gen, 6, 5)
    tokens, seqs = mask.sum().item(), (mask.sum(-1) > 0).sum().item()
    parts = [
        agg_loss(loss[s], mask[s], mode, global_token_count=tokens, global_seq_count=seqs)
        for s in (slice(0, 2), slice(2, 6))
    ]
    close(sum(parts), agg_loss(loss, mask, mode))


@settings(max_examples=30, deadline=None, database=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 5), length=st.integers(1, 6))
def test_agg_ignores_masked_values_property(seed: int, batch: int, length: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    loss, mask = torch.randn(batch, length, generator=gen), random_mask(gen, batch, length, allow_empty_rows=True)
    dirty = scramble(loss, mask, seed=seed)
    for mode in LOSS_AGG_MODES:
        close(agg_loss(dirty, mask, mode), agg_loss(loss, mask, mode))
    close(masked_whiten(dirty, mask), masked_whiten(loss, mask))


def test_token_mean_gradient_is_uniform_over_unmasked_tokens() -> None:
    loss = LOSS.clone().requires_grad_(True)
    agg_loss(loss, MASK, "token-mean").backward()
    close(loss.grad, [[0.25, 0.25, 0.25], [0.25, 0.0, 0.0]])
