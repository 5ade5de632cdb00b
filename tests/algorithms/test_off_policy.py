"""Tests for asyncrl.algorithms.off_policy: truncated behaviour -> proximal importance weights."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.algorithms.off_policy import truncated_is_weights
from asyncrl.algorithms.policy_loss import compute_policy_loss

from ._util import close, scramble

PROX = torch.tensor([[0.0, 1.0, -0.5], [0.2, 0.3, 0.0]])
BEHAV = torch.zeros(2, 3)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_token_level_hand_example() -> None:
    w, m = truncated_is_weights(PROX, BEHAV, MASK)
    close(w, [[1.0, 2.0, math.exp(-0.5)], [math.exp(0.2), math.exp(0.3), 0.0]])
    expected_mean = (1.0 + 2.0 + math.exp(-0.5) + math.exp(0.2) + math.exp(0.3)) / 5
    assert m["off_policy/is_weight_mean"] == pytest.approx(expected_mean, rel=1e-6, abs=1e-7)
    assert m["off_policy/is_truncated_frac"] == pytest.approx(0.2, rel=1e-6, abs=1e-7)


def test_sequence_level_hand_example() -> None:
    w, m = truncated_is_weights(PROX, BEHAV, MASK, level="sequence")
    close(w, [[math.exp(0.5)] * 3, [math.exp(0.5)] * 2 + [0.0]])
    assert m["off_policy/is_truncated_frac"] == 0.0
    w, m = truncated_is_weights(PROX, BEHAV, MASK, level="sequence", cap=1.5)
    close(w, [[1.5] * 3, [1.5, 1.5, 0.0]])
    assert m["off_policy/is_truncated_frac"] == 1.0
    assert m["off_policy/is_weight_mean"] == pytest.approx(1.5, rel=1e-6, abs=1e-7)


def test_drop_above_cap_zeroes_instead_of_truncating() -> None:
    w, _ = truncated_is_weights(PROX, BEHAV, MASK, drop_above_cap=True)
    close(w, [[1.0, 0.0, math.exp(-0.5)], [math.exp(0.2), math.exp(0.3), 0.0]])


def test_huge_log_ratio_stays_finite() -> None:
    w, _ = truncated_is_weights(torch.tensor([[500.0, -500.0]]), torch.zeros(1, 2), torch.ones(1, 2))
    close(w, [[2.0, 0.0]])


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("fill", [None, float("nan")])
def test_masked_positions_zero_and_ignored(level: str, fill: float | None) -> None:
    clean, clean_m = truncated_is_weights(PROX, BEHAV, MASK, level=level)
    dirty, dirty_m = truncated_is_weights(scramble(PROX, MASK, fill), scramble(BEHAV, MASK, fill, seed=1), MASK,
                                          level=level)
    close(dirty, clean)
    assert dirty_m == clean_m
    assert torch.all(dirty[MASK == 0] == 0)


def test_weights_carry_no_gradient_and_bad_level_raises() -> None:
    prox = PROX.clone().requires_grad_(True)
    w, _ = truncated_is_weights(prox, BEHAV, MASK)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="level"):
        truncated_is_weights(PROX, BEHAV, MASK, level="batch")


def test_decoupled_ppo_loss_uses_weights() -> None:
    # Stale sample: behaviour -> proximal weight exp(0.3); current == proximal, so the PPO ratio is 1.
    behav = torch.tensor([[-1.3, -2.0]])
    prox = torch.tensor([[-1.0, -2.0]])
    w, _ = truncated_is_weights(prox, behav, torch.ones(1, 2))
    loss, _ = compute_policy_loss("vanilla", prox, prox.clone(), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2),
                                  is_weights=w)
    close(loss, (-math.exp(0.3) + 1.0) / 2)


def test_tool_tokens_get_no_weight_and_stay_out_of_the_sequence_ratio() -> None:
    # Behaviour log-prob 0.0 at the tool token (loss mask 0): prox - behav over the model tokens
    # is 0.1 + 0.2, so the sequence weight is exp(0.3) = 1.3498588 on them and 0 on the tool token.
    prox = torch.tensor([[-0.9, -3.0, -0.8]])
    behav = torch.tensor([[-1.0, 0.0, -1.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    w, m = truncated_is_weights(prox, behav, mask, level="sequence")
    close(w, [[1.3498588, 0.0, 1.3498588]], rtol=1e-6, atol=1e-7)
    w, m = truncated_is_weights(prox, behav, mask, level="token")
    close(w, [[1.1051709, 0.0, 1.2214028]], rtol=1e-6, atol=1e-7)
    assert m["off_policy/is_weight_mean"] == pytest.approx((1.1051709 + 1.2214028) / 2, rel=1e-6, abs=1e-7)
