"""Tests for asyncrl.algorithms.value_loss: PPO value clipping."""

from __future__ import annotations

import pytest
import torch

from asyncrl.algorithms.value_loss import compute_value_loss

from ._util import close, scramble


def test_hand_examples_unclipped_and_clipped() -> None:
    vpreds = torch.tensor([[2.0, 2.0]], requires_grad=True)
    values = torch.tensor([[1.0, 1.0]])
    returns = torch.tensor([[1.0, 3.0]])
    loss, m = compute_value_loss(vpreds, values, returns, torch.ones(1, 2), cliprange_value=0.5)
    # token 0: max(1.0, 0.25) = 1.0; token 1: max(1.0, 2.25) = 2.25
    close(loss, 0.5 * (1.0 + 2.25) / 2)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad for v in m.values())
    assert m["critic/vf_loss"].item() == pytest.approx(0.8125, rel=1e-6, abs=1e-7)
    assert m["critic/vf_clipfrac"].item() == 0.5
    loss.backward()
    close(vpreds.grad, [[0.5 * (2.0 - 1.0), 0.0]])  # clipped term is flat in vpreds


def test_agg_mode_passthrough() -> None:
    vpreds = torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    zeros = torch.zeros(2, 2)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, _ = compute_value_loss(vpreds, vpreds, zeros, mask, 0.5, "seq-mean-token-sum")
    close(loss, 0.5 * (2.0 + 4.0) / 2)


@pytest.mark.parametrize("fill", [None, float("nan")])
def test_masked_positions_change_nothing(fill: float | None) -> None:
    gen = torch.Generator().manual_seed(5)
    vpreds, values, returns = (torch.randn(3, 4, generator=gen) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    clean, clean_m = compute_value_loss(vpreds, values, returns, mask, 0.2)
    dirty, dirty_m = compute_value_loss(*(scramble(x, mask, fill) for x in (vpreds, values, returns)), mask, 0.2)
    close(dirty, clean)
    assert {k: v.item() for k, v in dirty_m.items()} == {k: v.item() for k, v in clean_m.items()}
