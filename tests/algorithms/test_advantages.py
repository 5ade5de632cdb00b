"""Tests for asyncrl.algorithms.advantages: hand examples per estimator and masking properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.algorithms.advantages import ADV_ESTIMATOR_NAMES, NEEDS_CRITIC, compute_advantage, episode_advantage

from ._util import close, random_mask, scramble


def outcome(
    scores: list[float], lengths: list[int] | None = None, length: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards, mask): each score on the last unmasked token of its row."""
    lengths = lengths or [length] * len(scores)
    mask = (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]).float()
    rewards = torch.zeros(len(scores), length)
    rewards[torch.arange(len(scores)), torch.tensor(lengths) - 1] = torch.tensor(scores)
    return rewards, mask


def per_row(adv: torch.Tensor, mask: torch.Tensor, expected_B: list[float]) -> None:
    """adv equals expected_B broadcast over each row's unmasked tokens and 0 elsewhere."""
    close(adv, torch.tensor(expected_B)[:, None] * mask)


def test_grpo_hand_example_and_dr_grpo() -> None:
    rewards, mask = outcome([1.0, 0.0, 0.0, 1.0])
    adv, ret = compute_advantage("grpo", rewards, mask, ["p"] * 4)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # mean 0.5, unbiased std sqrt(1/3)
    per_row(adv, mask, [a, -a, -a, a])
    close(ret, adv)
    adv, _ = compute_advantage("grpo", rewards, mask, ["p"] * 4, norm_adv_by_std_in_grpo=False)
    per_row(adv, mask, [0.5, -0.5, -0.5, 0.5])


@pytest.mark.parametrize("value", [0.0, 0.7, 1.0])
def test_grpo_identical_rewards_give_zero(value: float) -> None:
    rewards, mask = outcome([value] * 5, lengths=[3, 1, 2, 3, 2])
    for norm in (True, False):
        adv, _ = compute_advantage("grpo", rewards, mask, ["p"] * 5, norm_adv_by_std_in_grpo=norm)
        close(adv, torch.zeros(5, 3))


def test_grpo_groups_interleaved_with_mixed_key_types() -> None:
    rewards, mask = outcome([1.0, 5.0, 0.0, 3.0])
    index_variants = [["a", "b", "a", "b"], [7, 8, 7, 8], torch.tensor([7, 8, 7, 8])]
    for index in index_variants:
        adv, _ = compute_advantage("grpo", rewards, mask, index, norm_adv_by_std_in_grpo=False)
        per_row(adv, mask, [0.5, 1.0, -0.5, -1.0])


def test_singleton_group_is_plain_reinforce() -> None:
    rewards, mask = outcome([0.8, 1.0, 0.0])
    index = ["solo", "pair", "pair"]
    adv, _ = compute_advantage("grpo", rewards, mask, index)
    b = 0.5 / (math.sqrt(0.5) + 1e-6)
    per_row(adv, mask, [0.8 / (1 + 1e-6), b, -b])
    for name, expected in (("rloo", [0.8, 1.0, -1.0]), ("opo", [0.8, 0.5, -0.5]), ("gpg", [1.2, 0.75, -0.75])):
        adv, _ = compute_advantage(name, rewards, mask, index)
        per_row(adv, mask, expected)


def test_rloo_hand_examples() -> None:
    rewards, mask = outcome([1.0, 0.0, 0.0, 1.0])
    adv, _ = compute_advantage("rloo", rewards, mask, ["p"] * 4)
    per_row(adv, mask, [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    rewards, mask = outcome([3.0, 1.0, 2.0], lengths=[1, 2, 3])
    adv, ret = compute_advantage("rloo", rewards, mask, ["p"] * 3)
    per_row(adv, mask, [3.0 - 1.5, 1.0 - 2.5, 2.0 - 2.0])
    close(ret, adv)


def test_grpo_passk_only_best_gets_gap() -> None:
    rewards, mask = outcome([0.2, 1.0, 0.5, 0.0, 0.0])
    index = ["a", "a", "a", "b", "b"]
    adv, _ = compute_advantage("grpo_passk", rewards, mask, index, norm_adv_by_std_in_grpo=False)
    per_row(adv, mask, [0.0, 0.5, 0.0, 0.0, 0.0])
    adv, _ = compute_advantage("grpo_passk", rewards, mask, index)
    per_row(adv, mask, [0.0, 0.5 / (0.404145188 + 1e-6), 0.0, 0.0, 0.0])


def test_grpo_passk_rejects_singleton_group() -> None:
    rewards, mask = outcome([1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"rollout\.n"):
        compute_advantage("grpo_passk", rewards, mask, ["a", "a", "b"])


def test_reinforce_plus_plus_discounted_and_whitened() -> None:
    rewards, mask = outcome([1.0])
    adv, ret = compute_advantage("reinforce_plus_plus", rewards, mask, ["p"], gamma=0.5)
    close(ret, [[0.25, 0.5, 1.0]])
    close(adv, [[-0.87287153, -0.21821788, 1.09108941]])


def test_reinforce_plus_plus_carries_the_return_over_masked_tokens() -> None:
    # a tool segment between two turns: turn 1 gets the reward after it, undiscounted across it
    rewards = torch.tensor([[1.0, 5.0, 2.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    _, ret = compute_advantage("reinforce_plus_plus", rewards, mask, ["p"], gamma=1.0)
    close(ret, [[3.0, 0.0, 2.0]])
    _, ret = compute_advantage("reinforce_plus_plus", rewards, mask, ["p"], gamma=0.5)
    close(ret, [[2.0, 0.0, 2.0]])


def test_reinforce_plus_plus_baseline_hand_example() -> None:
    rewards, mask = outcome([1.0, 0.0, 1.0, 1.0], length=1)
    adv, ret = compute_advantage("reinforce_plus_plus_baseline", rewards, mask, ["a", "a", "b", "b"])
    close(adv, [[1.22474487], [-1.22474487], [0.0], [0.0]])
    close(ret, adv)


def test_opo_length_weighted_baseline() -> None:
    rewards, mask = outcome([1.0, 0.0], lengths=[1, 3])
    adv, _ = compute_advantage("opo", rewards, mask, ["p", "p"])
    per_row(adv, mask, [0.75, -0.25])


def test_gpg_rescales_by_nonzero_fraction() -> None:
    rewards, mask = outcome([1.0, 0.0, 0.0, 0.0])
    adv, _ = compute_advantage("gpg", rewards, mask, ["p"] * 4)
    per_row(adv, mask, [3.0, -1.0, -1.0, -1.0])


def test_remax_subtracts_greedy_reward() -> None:
    rewards, mask = outcome([1.0, 0.0], lengths=[3, 2])
    adv, ret = compute_advantage("remax", rewards, mask, ["p", "q"], reward_baselines=torch.tensor([0.4, 0.5]))
    close(ret, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    close(adv, [[0.6, 0.6, 0.6], [-0.5, -0.5, 0.0]])


def test_gae_hand_example() -> None:
    rewards, mask = outcome([1.0])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = compute_advantage("gae", rewards, mask, ["p"], values=values)
    close(ret, [[1.0, 1.0, 1.0]])
    close(adv, [[0.9999995, 0.0, -0.9999995]])  # raw [0.5, 0.4, 0.3] whitened


def test_gae_with_discount_and_lambda() -> None:
    rewards, mask = outcome([1.0], length=2)
    values = torch.tensor([[0.5, 0.2]])
    adv, ret = compute_advantage("gae", rewards, mask, ["p"], values=values, gamma=0.9, lam=0.8)
    close(ret, [[0.756, 1.0]])  # A = [-0.32 + 0.72 * 0.8, 0.8] = [0.256, 0.8]
    close(adv, [[-0.70710676, 0.70710676]])


def test_gae_skips_masked_interior_tokens() -> None:
    rewards = torch.tensor([[0.0, 9.0, 1.0]])
    values = torch.tensor([[0.5, 9.0, 0.7]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    _, ret = compute_advantage("gae", rewards, mask, ["p"], values=values)
    close(ret, [[1.0, 0.0, 1.0]])  # A0 = (0.7 - 0.5) + 0.3 = 0.5


def test_missing_inputs_and_unknown_name_raise() -> None:
    rewards, mask = outcome([1.0, 0.0])
    with pytest.raises(ValueError, match="adv_estimator"):
        compute_advantage("ppo", rewards, mask, ["p", "p"])
    with pytest.raises(ValueError, match="critic"):
        compute_advantage("gae", rewards, mask, ["p", "p"])
    with pytest.raises(ValueError, match="reward_baselines"):
        compute_advantage("remax", rewards, mask, ["p", "p"])
    assert {"gae"} == NEEDS_CRITIC


def test_the_config_accepts_exactly_the_registered_estimators():
    from asyncrl.config import load_config
    from asyncrl.config.names import AdvEstimatorName, choices

    assert ADV_ESTIMATOR_NAMES == choices(AdvEstimatorName)  # the registry's keys are the config's type
    for name in ADV_ESTIMATOR_NAMES:
        assert load_config(None, [f"algorithm.adv_estimator={name}"]).algorithm.adv_estimator == name


def _run_all(name: str, rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor,
             index: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_advantage(name, rewards, mask, index, values=values, gamma=0.9, lam=0.95,
                             reward_baselines=torch.full((rewards.shape[0],), 0.3))


@settings(max_examples=15, deadline=None, database=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), groups=st.integers(1, 3), n=st.integers(2, 4), length=st.integers(1, 5))
def test_every_estimator_zero_at_masked_tokens_and_blind_to_them(seed: int, groups: int, n: int, length: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch = groups * n
    mask = random_mask(gen, batch, length)
    rewards = torch.randn(batch, length, generator=gen) * mask
    values = torch.randn(batch, length, generator=gen)
    index = [i // n for i in range(batch)]
    for name in ADV_ESTIMATOR_NAMES:
        adv, ret = _run_all(name, rewards, mask, values, index)
        assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0), name
        for fill in (None, float("nan")):
            adv2, ret2 = _run_all(name, scramble(rewards, mask, fill, seed), mask, scramble(values, mask, fill), index)
            close(adv2, adv)
            close(ret2, ret)


def test_outputs_carry_no_gradient() -> None:
    rewards, mask = outcome([1.0, 0.0])
    rewards.requires_grad_(True)
    adv, ret = compute_advantage("grpo", rewards, mask, ["p", "p"])
    assert not adv.requires_grad and not ret.requires_grad


def test_an_episodes_chains_take_its_group_advantage_and_do_not_count_in_the_group() -> None:
    # the episode_advantage docstring example: rows [c, e0, e1], c a chain of e0
    rewards, mask = outcome([1.0, 1.0, 0.0], lengths=[2, 3, 1])
    adv, ret = episode_advantage("grpo", rewards, mask, ["p"] * 3, [1, 1, 2])
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # two episodes, scores 1 and 0: mean 0.5, unbiased std sqrt(1/2)
    per_row(adv, mask, [a, a, -a])
    close(ret, adv)
    adv, _ = episode_advantage("rloo", rewards, mask, ["p"] * 3, [1, 1, 2])
    per_row(adv, mask, [1.0, 1.0, -1.0])  # rloo over 2 episodes (over 3 rows: 0.5, 0.5, -1.0)
    adv, _ = episode_advantage("grpo", rewards, mask, ["p"] * 3, [1, 1, 2], norm_adv_by_std_in_grpo=False)
    per_row(adv, mask, [0.5, 0.5, -0.5])  # (over 3 rows: 1/3, 1/3, -2/3)


def test_without_chains_or_with_a_per_row_estimator_episode_advantage_is_compute_advantage() -> None:
    rewards, mask = outcome([1.0, 0.0, 0.0, 1.0])
    for name in ("grpo", "reinforce_plus_plus"):
        plain, _ = compute_advantage(name, rewards, mask, ["p"] * 4)
        close(episode_advantage(name, rewards, mask, ["p"] * 4, [0, 1, 2, 3])[0], plain)
    chained, _ = episode_advantage("reinforce_plus_plus", rewards, mask, ["p"] * 4, [1, 1, 2, 3])
    close(chained, compute_advantage("reinforce_plus_plus", rewards, mask, ["p"] * 4)[0])  # each chain a sequence
