"""Tests for asyncrl.algorithms.kl: estimator values, straight-through gradients, controllers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.algorithms.kl import (
    KL_PENALTY_KINDS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    kl_penalty,
)

from ._util import close, scramble

K3_AT_HALF = math.exp(-0.5) + 0.5 - 1.0  # 0.106531


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("k1", 0.5), ("kl", 0.5), ("abs", 0.5), ("k2", 0.125), ("mse", 0.125), ("k3", K3_AT_HALF),
     ("low_var_kl", K3_AT_HALF)],
)
def test_estimators_at_log_ratio_half(kind: str, expected: float) -> None:
    close(kl_penalty(torch.tensor([-1.0]), torch.tensor([-1.5]), kind), [expected])


def test_abs_and_k1_sign_for_negative_log_ratio() -> None:
    logprob, ref = torch.tensor([-2.0]), torch.tensor([-1.5])
    close(kl_penalty(logprob, ref, "k1"), [-0.5])
    close(kl_penalty(logprob, ref, "abs"), [0.5])
    close(kl_penalty(logprob, ref, "k3"), [math.exp(0.5) - 0.5 - 1.0])


def test_k3_is_clamped_to_ten() -> None:
    close(kl_penalty(torch.tensor([-40.0]), torch.tensor([0.0]), "k3"), [10.0])


@settings(max_examples=25, deadline=None, database=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1))
def test_straight_through_value_of_base_gradient_of_k2(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    start = ref + torch.randn(3, 4, generator=gen, dtype=torch.float64)
    for base in ("k1", "kl", "abs", "k3", "low_var_kl"):
        logprob = start.clone().requires_grad_(True)
        plus = kl_penalty(logprob, ref, base + "+")
        close(plus, kl_penalty(start, ref, base))
        (grad,) = torch.autograd.grad(plus.sum(), logprob)
        k2_input = start.clone().requires_grad_(True)
        (k2_grad,) = torch.autograd.grad(kl_penalty(k2_input, ref, "k2").sum(), k2_input)
        close(grad, k2_grad)
        close(grad, start - ref)


def test_k3_plus_hand_gradient() -> None:
    logprob = torch.tensor([-1.0], requires_grad=True)
    value = kl_penalty(logprob, torch.tensor([-1.5]), "k3+")
    value.sum().backward()
    close(value.detach(), [K3_AT_HALF])
    close(logprob.grad, [0.5])


def test_unknown_kind_raises() -> None:
    with pytest.raises(ValueError, match="KL penalty"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "full")
    assert "k3+" in KL_PENALTY_KINDS and "low_var_kl" in KL_PENALTY_KINDS


def test_fixed_controller_never_moves() -> None:
    ctrl = FixedKLController(0.001)
    ctrl.update(current_kl=5.0, n_steps=100)
    assert ctrl.value == 0.001


@pytest.mark.parametrize(("current_kl", "expected"), [(0.02, 0.102), (0.005, 0.098), (0.011, 0.101), (0.01, 0.1)])
def test_adaptive_controller_proportional_update(current_kl: float, expected: float) -> None:
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.01, horizon=100)
    ctrl.update(current_kl=current_kl, n_steps=10)
    assert ctrl.value == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_apply_kl_in_reward_hand_example() -> None:
    scores = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, 0.0], [-1.2, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    rewards, metrics = apply_kl_in_reward(scores, old, ref, mask, kl_coef=0.1, kind="k1")
    close(rewards, [[-0.05, 0.9, 0.0], [1.98, 0.0, 0.0]])
    assert metrics["actor/reward_kl_penalty"] == pytest.approx((0.75 + 0.2) / 2, rel=1e-6, abs=1e-7)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    dirty, dirty_metrics = apply_kl_in_reward(
        scramble(scores, mask, float("nan")), scramble(old, mask), scramble(ref, mask, 3.0), mask, 0.1, "k1"
    )
    close(dirty, rewards)
    assert dirty_metrics == metrics
