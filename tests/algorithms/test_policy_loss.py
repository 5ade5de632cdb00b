"""Tests for asyncrl.algorithms.policy_loss: hand examples, ratio-1 property, masking, IS weights."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.algorithms.policy_loss import POLICY_LOSS_NAMES, compute_policy_loss

from ._util import close, random_mask, scramble

METRIC_KEYS = {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}


def logs(ratios: list[list[float]]) -> torch.Tensor:
    return torch.tensor(ratios, dtype=torch.float64).log()


def test_vanilla_clip_higher_and_dual_clip_hand_example() -> None:
    old = torch.zeros(1, 4, dtype=torch.float64)
    new = logs([[1.5, 5.0, 0.5, 0.5]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    loss, m = compute_policy_loss("vanilla", old, new, adv, torch.ones(1, 4))
    # per token: -1.2 (clipped high), 3.0 (dual clip), -0.5 (unclipped), 0.8 (clipped low)
    close(loss, torch.tensor((-1.2 + 3.0 - 0.5 + 0.8) / 4, dtype=torch.float64))
    assert m.keys() == METRIC_KEYS
    # device tensors, detached, so that a trainer reads them once per step
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad for v in m.values())
    m = {k: float(v) for k, v in m.items()}
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5, abs=1e-9)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(0.25, abs=1e-9)
    assert m["actor/ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(5) + 2 * math.log(0.5)) / 4, abs=1e-9)


def test_vanilla_asymmetric_clip_range() -> None:
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = logs([[1.25, 0.7]])
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    loss, _ = compute_policy_loss("vanilla", old, new, adv, torch.ones(1, 2), clip_ratio_low=0.2, clip_ratio_high=0.28)
    close(loss, torch.tensor((-1.25 + 0.8) / 2, dtype=torch.float64))  # 1.25 < 1.28 unclipped, 0.7 -> 0.8


def test_vanilla_gradient_zero_when_clipped() -> None:
    new = logs([[1.5, 1.1]]).requires_grad_(True)
    loss, _ = compute_policy_loss("vanilla", torch.zeros(1, 2, dtype=torch.float64), new,
                                  torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2))
    loss.backward()
    close(new.grad, torch.tensor([[0.0, -1.1 / 2]], dtype=torch.float64))


@settings(max_examples=25, deadline=None, database=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 4), length=st.integers(1, 6))
def test_ratio_one_vanilla_token_mean_is_minus_mean_advantage(seed: int, batch: int, length: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, batch, length)
    log_prob = -torch.rand(batch, length, generator=gen, dtype=torch.float64)
    adv = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    new = log_prob.clone().requires_grad_(True)
    loss, m = compute_policy_loss("vanilla", log_prob, new, adv, mask)
    expected = -(adv * mask).sum() / mask.sum()
    close(loss, expected)
    assert m["actor/pg_clipfrac"] == 0.0 and m["actor/ppo_kl"] == 0.0
    loss.backward()
    close(new.grad, -adv * mask / mask.sum())  # d(ratio)/d(log_prob) = 1 at ratio 1


def test_gspo_sequence_ratio_clipped_hand_example() -> None:
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = torch.tensor([[0.1, 0.3]], dtype=torch.float64)
    loss, m = compute_policy_loss("gspo", old, new, torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2))
    close(loss, torch.tensor(-1.2, dtype=torch.float64))  # s = exp(0.2) = 1.2214 -> clipped to 1.2
    assert m["actor/pg_clipfrac"] == 1.0


def test_gspo_token_wise_gradient_and_forced_seq_mean_token_mean() -> None:
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = torch.tensor([[0.05, 0.05, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]], dtype=torch.float64)
    s = math.exp(0.05)
    for mode in ("token-mean", "seq-mean-token-mean"):
        new.grad = None
        loss, _ = compute_policy_loss("gspo", old, new, adv, mask, loss_agg_mode=mode)
        close(loss, torch.tensor((-s + -2.0) / 2, dtype=torch.float64))
        loss.backward()
        close(new.grad, torch.tensor([[-s / 4, -s / 4, 0.0], [-2 / 6] * 3], dtype=torch.float64))


def test_cispo_hand_example() -> None:
    log_prob = torch.tensor([[-2.0, -1.0]], dtype=torch.float64)
    new = (log_prob + logs([[1.5, 1.0]])).detach().requires_grad_(True)
    # The ratio is taken against old = log_prob, so recentre: ratios 1.5 and 1.0.
    loss, m = compute_policy_loss("cispo", log_prob, new, torch.tensor([[1.0, 0.5]], dtype=torch.float64),
                                  torch.ones(1, 2))
    lp = new.detach()
    close(loss, (-1.2 * 1.0 * lp[0, 0] - 1.0 * 0.5 * lp[0, 1]) / 2)
    loss.backward()
    close(new.grad, torch.tensor([[-1.2 / 2, -0.5 / 2]], dtype=torch.float64))
    assert m["actor/pg_clipfrac"] == 0.5 and m["actor/pg_clipfrac_lower"] == 0.0


def test_gpg_hand_example() -> None:
    new = torch.tensor([[-0.5]], dtype=torch.float64, requires_grad=True)
    loss, m = compute_policy_loss("gpg", torch.zeros(1, 1, dtype=torch.float64), new,
                                  torch.tensor([[2.0]], dtype=torch.float64), torch.ones(1, 1))
    close(loss, torch.tensor(1.0, dtype=torch.float64))
    loss.backward()
    close(new.grad, torch.tensor([[-2.0]], dtype=torch.float64))
    assert m["actor/pg_clipfrac"] == 0.0


def test_is_weights_scale_loss_without_gradient() -> None:
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    weights = torch.tensor([[2.0, 0.5]], dtype=torch.float64, requires_grad=True)
    loss, _ = compute_policy_loss("vanilla", old, new, adv, torch.ones(1, 2), is_weights=weights)
    close(loss, torch.tensor(-(2.0 + 0.5) / 2, dtype=torch.float64))
    loss.backward()
    assert weights.grad is None
    close(new.grad, torch.tensor([[-1.0, -0.25]], dtype=torch.float64))


def test_loss_agg_mode_passthrough_with_norm_length() -> None:
    old = torch.zeros(2, 2, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0], [3.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, _ = compute_policy_loss("vanilla", old, old.clone(), adv, mask, loss_agg_mode="seq-mean-token-sum-norm",
                                  norm_length=4)
    close(loss, torch.tensor(-(2.0 + 3.0) / 2 / 4, dtype=torch.float64))


def test_unknown_loss_and_bad_dual_clip_raise() -> None:
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="policy_loss"):
        compute_policy_loss("ppo", x, x, x, torch.ones(1, 1))
    with pytest.raises(AssertionError, match="clip_ratio_c"):
        compute_policy_loss("vanilla", x, x, x, torch.ones(1, 1), clip_ratio_c=1.0)


@pytest.mark.parametrize("name", POLICY_LOSS_NAMES)
@pytest.mark.parametrize("fill", [None, float("nan")])
def test_masked_positions_change_nothing(name: str, fill: float | None) -> None:
    gen = torch.Generator().manual_seed(11)
    mask = random_mask(gen, 4, 5)
    old = -torch.rand(4, 5, generator=gen, dtype=torch.float64)
    new = old + 0.3 * torch.randn(4, 5, generator=gen, dtype=torch.float64)
    adv = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    weights = torch.rand(4, 5, generator=gen, dtype=torch.float64) * 2
    results = []
    for dirty in (False, True):
        f = (lambda x: scramble(x, mask, fill)) if dirty else (lambda x: x)
        leaf = f(new).detach().clone().requires_grad_(True)
        loss, metrics = compute_policy_loss(name, f(old), leaf, f(adv), mask, is_weights=f(weights),
                                            clip_ratio_low=0.1, clip_ratio_high=0.1)
        loss.backward()
        results.append((loss.detach(), leaf.grad, {k: float(v) for k, v in metrics.items()}))
    close(results[1][0], results[0][0])
    close(results[1][1], results[0][1])
    assert torch.all(results[1][1][mask == 0] == 0)
    assert results[1][2] == pytest.approx(results[0][2], rel=1e-9, abs=1e-12)


def test_tool_tokens_between_turns_enter_no_ratio_and_no_gradient() -> None:
    # Two model tokens around tool text (loss mask 0; its behaviour log-prob is 0.0): ratios
    # exp(0.1) = 1.1051709 and exp(-0.2) = 0.8187308, neither clipped; A = 1 was broadcast over all.
    old = torch.tensor([[-1.0, 0.0, 0.0, -1.0]], dtype=torch.float64)
    new = torch.tensor([[-0.9, -6.0, -0.5, -1.2]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    adv = torch.ones(1, 4, dtype=torch.float64)
    loss, m = compute_policy_loss("vanilla", old, new, adv, mask)
    close(loss, torch.tensor(-(1.1051709 + 0.8187308) / 2, dtype=torch.float64), rtol=1e-6, atol=1e-7)
    close(m["actor/ppo_kl"], torch.tensor((-0.1 + 0.2) / 2, dtype=torch.float64), rtol=1e-6, atol=1e-9)
    assert float(m["actor/pg_clipfrac"]) == 0.0
    (grad,) = torch.autograd.grad(loss, new)
    close(grad, torch.tensor([[-1.1051709 / 2, 0.0, 0.0, -0.8187308 / 2]], dtype=torch.float64), rtol=1e-6, atol=1e-9)
    # other (even NaN) log-probs, behaviour log-probs and advantages at the tool tokens: the same
    tool = ~mask.bool()
    nan_new = torch.where(tool, float("nan"), new.detach()).requires_grad_(True)
    loss2, m2 = compute_policy_loss("vanilla", torch.where(tool, 50.0, old), nan_new,
                                    torch.where(tool, -1e3, adv), mask)
    assert torch.equal(loss2, loss) and all(torch.equal(m2[k], m[k]) for k in m)
    assert torch.equal(torch.autograd.grad(loss2, nan_new)[0], grad)
