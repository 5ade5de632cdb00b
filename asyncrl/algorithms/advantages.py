"""Advantage estimators: (token_level_rewards, response_mask, group index) -> (advantages, returns).

All estimators are looked up by name in `ADV_ESTIMATORS` (the key type of
`algorithm.adv_estimator`) and called through `compute_advantage`. Inputs and outputs are (B, T)
over response tokens; both outputs are 0 at masked tokens, and what sits at masked positions of
any input never changes a result. Everything runs under `torch.no_grad()`.

Outcome-reward estimators score a response by the sum of its unmasked token rewards (the reward
sits on the last token) and compare it with its group: the rows sharing the same `index` entry
(the prompt uid; strings, ints or a 1-D tensor).

Groups of one response: there is nothing to compare with, so the baseline is 0 and the scale 1
(verl's convention): the advantage is the raw score, i.e. plain REINFORCE. This keeps
`rollout.n=1` learning instead of silently producing zero gradients. `grpo_passk` cannot rank a
single response and raises instead.

An agent episode may be several rows (its chains, `episode_advantage`): a group estimator then
compares the n episodes of a prompt, not their rows, and each chain takes its episode's advantage.

Not here: KL-in-reward (see `kl.py`), dynamic-sampling filters, any distributed gather.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from asyncrl.algorithms.agg import masked_sum, masked_whiten
from asyncrl.config.names import AdvEstimatorName, choices

GroupIndex = Sequence[Hashable] | Tensor
AdvEstimator = Callable[..., tuple[Tensor, Tensor]]


# ---------------------------------------------------------------- group helpers


def _group_ids(index: GroupIndex, batch_size: int) -> Tensor:
    """Dense int ids (B,) for arbitrary hashable group keys, in order of first appearance."""
    keys = index.tolist() if hasattr(index, "tolist") else list(index)
    assert len(keys) == batch_size, f"index has {len(keys)} entries for {batch_size} rows"
    ids: dict[Hashable, int] = {}
    return torch.tensor([ids.setdefault(k, len(ids)) for k in keys], dtype=torch.long)


def _group_sum(x_B: Tensor, gid_B: Tensor) -> Tensor:
    """Sum of x over each row's group, broadcast back to rows (B,)."""
    n_groups = int(gid_B.max()) + 1 if gid_B.numel() else 0
    sums = torch.zeros(n_groups, dtype=x_B.dtype, device=x_B.device)
    gid_B = gid_B.to(x_B.device)
    return sums.index_add_(0, gid_B, x_B)[gid_B]


def _group_stats(scores_B: Tensor, index: GroupIndex) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row group (mean, unbiased std, size); singleton groups get mean 0, std 1."""
    gid_B = _group_ids(index, scores_B.shape[0])
    size_B = _group_sum(torch.ones_like(scores_B), gid_B)
    mean_B = _group_sum(scores_B, gid_B) / size_B
    var_B = _group_sum((scores_B - mean_B).square(), gid_B) / (size_B - 1).clamp(min=1)
    single = size_B == 1
    mean_B = torch.where(single, torch.zeros_like(mean_B), mean_B)
    std_B = torch.where(single, torch.ones_like(var_B), var_B.sqrt())
    return mean_B, std_B, size_B


def _outcome_scores(token_level_rewards: Tensor, response_mask: Tensor) -> Tensor:
    """One score per response (B,): the sum of its unmasked token rewards."""
    return masked_sum(token_level_rewards, response_mask, dim=-1)


def _broadcast(adv_B: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(B,) outcome advantages -> (B, T) on the unmasked tokens; returns == advantages."""
    adv = torch.where(response_mask.bool(), adv_B.unsqueeze(-1), 0.0)  # (B, T)
    return adv, adv


# ---------------------------------------------------------------- estimators


def gae(token_level_rewards: Tensor, response_mask: Tensor, index: GroupIndex, *,
        values: Tensor, gamma: float = 1.0, lam: float = 1.0, **_unused: object) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438, eq. 16).

    delta_t = r_t + gamma V_{t+1} - V_t;  A_t = delta_t + gamma lam A_{t+1}; returns = A + V;
    masked tokens are skipped (V and A carry over them). Advantages are then whitened over the
    batch (as verl does); returns are not. Example (gamma = lam = 1, one row, no whitening):
    rewards [0, 0, 1], values [0.5, 0.6, 0.7] -> returns [1, 1, 1], raw A = [0.5, 0.4, 0.3].
    """
    mask = response_mask.bool()
    rewards = torch.where(mask, token_level_rewards, 0.0)
    values = torch.where(mask, values, 0.0)
    next_value = torch.zeros_like(rewards[:, 0])
    running = torch.zeros_like(next_value)
    adv_T: list[Tensor] = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        m = mask[:, t]
        next_value = torch.where(m, values[:, t], next_value)
        running = torch.where(m, delta + gamma * lam * running, running)
        adv_T.append(running)
    advantages = torch.stack(adv_T[::-1], dim=1)  # (B, T)
    returns = torch.where(mask, advantages + values, 0.0)
    return masked_whiten(advantages, response_mask), returns


def grpo(token_level_rewards: Tensor, response_mask: Tensor, index: GroupIndex, *,
         norm_adv_by_std_in_grpo: bool = True, epsilon: float = 1e-6,
         **_unused: object) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, arXiv:2402.03300, §4.1.2): (r - mean_g) / (std_g + eps).

    `norm_adv_by_std_in_grpo=False` drops the std division (Dr.GRPO, arXiv:2503.20783).
    std is the unbiased group std. Example: one group with scores [1, 0, 0, 1] -> mean 0.5,
    std 0.57735 -> advantages [0.866024, -0.866024, -0.866024, 0.866024] (Dr.GRPO: ±0.5).
    """
    scores_B = _outcome_scores(token_level_rewards, response_mask)
    mean_B, std_B, _ = _group_stats(scores_B, index)
    adv_B = scores_B - mean_B
    if norm_adv_by_std_in_grpo:
        adv_B = adv_B / (std_B + epsilon)
    return _broadcast(adv_B, response_mask)


def grpo_passk(token_level_rewards: Tensor, response_mask: Tensor, index: GroupIndex, *,
               norm_adv_by_std_in_grpo: bool = True, epsilon: float = 1e-6,
               **_unused: object) -> tuple[Tensor, Tensor]:
    """Pass@k advantage (arXiv:2503.19595): only each group's best response gets r_max - r_2nd.

    Divided by (group std + eps) when `norm_adv_by_std_in_grpo`. Ties go to the first row.
    Example: scores [0.2, 1.0, 0.5], no std -> advantages [0, 0.5, 0].
    """
    scores_B = _outcome_scores(token_level_rewards, response_mask)
    _, std_B, _ = _group_stats(scores_B, index)
    gid_B = _group_ids(index, scores_B.shape[0])
    adv_B = torch.zeros_like(scores_B)
    for g in range(int(gid_B.max()) + 1 if gid_B.numel() else 0):
        rows = (gid_B == g).nonzero().squeeze(-1).to(scores_B.device)
        if rows.numel() < 2:
            raise ValueError("grpo_passk needs >= 2 responses per prompt; set rollout.n >= 2")
        top = torch.topk(scores_B[rows], 2)
        best = rows[top.indices[0]]
        gap = top.values[0] - top.values[1]
        adv_B[best] = gap / (std_B[best] + epsilon) if norm_adv_by_std_in_grpo else gap
    return _broadcast(adv_B, response_mask)


def rloo(token_level_rewards: Tensor, response_mask: Tensor, index: GroupIndex,
         **_unused: object) -> tuple[Tensor, Tensor]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740, eq. 5).

    A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean_g). Example: scores [1, 0, 0, 1]
    -> [1 - 1/3, 0 - 2/3, 0 - 2/3, 1 - 1/3] = [0.666667, -0.666667, -0.666667, 0.666667].
    """
    scores_B = _outcome_scores(token_level_rewards, response_mask)
    mean_B, _, size_B = _group_stats(scores_B, index)
    adv_B = (scores_B - mean_B) * size_B / (size_B - 1).clamp(min=1)
    return _broadcast(adv_B, response_mask)


def reinforce_plus_plus(token_level_rewards: Tensor, response_mask: Tensor, index: GroupIndex, *,
                        gamma: float = 1.0, **_unused: object) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return-to-go, whitened over the batch.

    Masked tokens are skipped: the return carries over them undiscounted, so a multi-turn
    episode's first turns get the reward that sits after its tool text (verl restarts the return
    at a masked token; for trailing padding, the single-turn case, the two agree). Example
    (gamma = 0.5): rewards [[0, 0, 1]] -> returns [[0.25, 0.5, 1]]; rewards [[1, 5, 2]], mask
    [[1, 0, 1]] -> [[2, 0, 2]]; advantages = whiten(returns) over the batch.
    """
    mask = response_mask.bool()
    rewards = torch.where(mask, token_level_rewards, 0.0)
    running = torch.zeros_like(rewards[:, 0])
    ret_T: list[Tensor] = []
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
        ret_T.append(running)
    returns = torch.where(mask, torch.stack(ret_T[::-1], dim=1), 0.0)  # (B, T)
    return masked_whiten(returns, response_mask), returns


def reinforce_plus_plus_baseline(token_level_rewards: Tensor, response_mask: Tensor,
                                 index: GroupIndex, **_unused: object) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (arXiv:2501.03262): subtract the group mean, whiten over the batch tokens.

    Example: two groups, scores [1, 0] and [1, 1], one token each: centred [0.5, -0.5, 0, 0],
    whitened with the unbiased batch std sqrt(1/6) -> [1.224745, -1.224745, 0, 0].
    """
    scores_B = _outcome_scores(token_level_rewards, response_mask)
    mean_B, _, _ = _group_stats(scores_B, index)
    centred, _ = _broadcast(scores_B - mean_B, response_mask)
    adv = masked_whiten(centred, response_mask)
    return adv, adv


def opo(token_level_rewards: Tensor, response_mask: Tensor, index: GroupIndex,
        **_unused: object) -> tuple[Tensor, Tensor]:
    """OPO length-weighted baseline (Hao et al. 2025, arXiv:2505.23585): b = sum(l r) / sum(l).

    l is the number of unmasked tokens. Example: scores [1, 0] with lengths [1, 3] ->
    b = 0.25 -> advantages [0.75, -0.25].
    """
    scores_B = _outcome_scores(token_level_rewards, response_mask)
    len_B = response_mask.to(scores_B.dtype).sum(dim=-1)
    gid_B = _group_ids(index, scores_B.shape[0])
    baseline_B = _group_sum(len_B * scores_B, gid_B) / _group_sum(len_B, gid_B).clamp(min=1)
    single = _group_sum(torch.ones_like(scores_B), gid_B) == 1
    baseline_B = torch.where(single, torch.zeros_like(baseline_B), baseline_B)
    return _broadcast(scores_B - baseline_B, response_mask)


def gpg(token_level_rewards: Tensor, response_mask: Tensor, index: GroupIndex,
        **_unused: object) -> tuple[Tensor, Tensor]:
    """GPG (Chu et al. 2025, arXiv:2504.02546, eq. 8): alpha * (r - mean_g), alpha = B / #(r != 0).

    alpha rescales for the responses with zero reward (no signal). Example: scores [1, 0, 0, 0]
    in one group: alpha = 4, mean 0.25 -> advantages [3, -1, -1, -1].
    """
    scores_B = _outcome_scores(token_level_rewards, response_mask)
    mean_B, _, _ = _group_stats(scores_B, index)
    alpha = scores_B.shape[0] / torch.count_nonzero(scores_B).clamp(min=1)
    return _broadcast(alpha * (scores_B - mean_B), response_mask)


def remax(token_level_rewards: Tensor, response_mask: Tensor, index: GroupIndex, *,
          reward_baselines: Tensor, **_unused: object) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505, Alg. 1): return-to-go minus the greedy reward.

    `reward_baselines` (B,) is the reward of the greedy response to the same prompt.
    Example: rewards [[0, 0, 1]], baseline [0.4] -> returns [[1, 1, 1]], advantages [[0.6] * 3].
    """
    mask = response_mask.bool()
    rewards = torch.where(mask, token_level_rewards, 0.0)
    returns = rewards.flip(-1).cumsum(-1).flip(-1)  # (B, T)
    advantages = torch.where(mask, returns - reward_baselines.unsqueeze(-1), 0.0)
    return advantages, torch.where(mask, returns, 0.0)


# An estimator takes (token_level_rewards, response_mask, index) and compute_advantage's keyword
# options, ignoring those it does not use (hence `**_unused`); register new ones here by name.
ADV_ESTIMATORS: dict[AdvEstimatorName, AdvEstimator] = {
    "gae": gae,
    "grpo": grpo,
    "grpo_passk": grpo_passk,
    "rloo": rloo,
    "reinforce_plus_plus": reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
    "opo": opo,
    "gpg": gpg,
    "remax": remax,
}
ADV_ESTIMATOR_NAMES: tuple[str, ...] = tuple(ADV_ESTIMATORS)
assert ADV_ESTIMATOR_NAMES == choices(AdvEstimatorName), "register the name in asyncrl.config.names"
NEEDS_CRITIC: frozenset[str] = frozenset({"gae"})
NEEDS_REWARD_BASELINES: frozenset[str] = frozenset({"remax"})
GROUP_ESTIMATORS: frozenset[str] = frozenset({"grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline", "opo",
                                              "gpg"})
"""The estimators that compare a response with its group (one advantage per response)."""


def compute_advantage(
    name: AdvEstimatorName,
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: GroupIndex,
    *,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Run estimator `name` -> (advantages (B, T), returns (B, T)), both 0 at masked tokens.

    Example: compute_advantage("grpo", rewards, mask, ["p0"] * 4) with scores [1, 0, 0, 1]
    gives advantages ±0.866024 on each row's tokens (see `grpo`).
    """
    if name not in ADV_ESTIMATORS:
        raise ValueError(f"unknown algorithm.adv_estimator {name!r}; choose one of {ADV_ESTIMATOR_NAMES}")
    if name in NEEDS_CRITIC and values is None:
        raise ValueError(f"adv_estimator {name!r} needs critic values (enable the critic)")
    if name in NEEDS_REWARD_BASELINES and reward_baselines is None:
        raise ValueError(f"adv_estimator {name!r} needs reward_baselines (greedy-response rewards)")
    with torch.no_grad():
        advantages, returns = ADV_ESTIMATORS[name](
            token_level_rewards, response_mask, index, values=values,
            reward_baselines=reward_baselines, gamma=gamma, lam=lam,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, epsilon=epsilon,
        )
    return advantages.detach(), returns.detach()


def episode_advantage(name: AdvEstimatorName, token_level_rewards: Tensor, response_mask: Tensor,
                      index: GroupIndex, episode_B: Sequence[int], **options: Any) -> tuple[Tensor, Tensor]:
    """`compute_advantage` when some rows are chains of one agent episode: `episode_B[i]` is the
    row of row i's episode (i itself for a response or an episode's own row). A group estimator
    compares the episodes: its statistics run over the episodes' own rows only, and every chain
    takes its episode's advantage on its own trained tokens. The other estimators (gae,
    reinforce_plus_plus, remax) have no group statistic: each chain is a sequence of its own,
    ending in the episode's reward (`build_batch` puts it there).
    Example (grpo): rows [c, e0, e1], episode_B [1, 1, 2], scores of e0 1 and of e1 0 -> a group
    of 2 episodes: e0 +0.707107, e1 -0.707107, and c +0.707107 on its tokens (3 rows would
    give other statistics)."""
    if name not in GROUP_ESTIMATORS or all(e == i for i, e in enumerate(episode_B)):
        return compute_advantage(name, token_level_rewards, response_mask, index, **options)
    own = [i for i, e in enumerate(episode_B) if e == i]
    pick = torch.tensor(own, device=response_mask.device)
    keys = index.tolist() if hasattr(index, "tolist") else list(index)
    options = {k: v for k, v in options.items() if k not in ("values", "reward_baselines")}
    adv, _ = compute_advantage(name, token_level_rewards[pick], response_mask[pick], [keys[i] for i in own], **options)
    mask = response_mask[pick]
    per_episode = masked_sum(adv, mask, dim=-1) / mask.sum(-1).clamp(min=1)  # an outcome advantage: one per row
    slot = {row: k for k, row in enumerate(own)}
    adv_B = per_episode[torch.tensor([slot[e] for e in episode_B], device=per_episode.device)]
    return _broadcast(adv_B, response_mask)
