"""Critic: values and the value update do not depend on how rows are cut into micro-batches;
a multi-turn episode's tool tokens get no value and no value loss."""

from __future__ import annotations

import torch

from asyncrl.config.schema import CriticConfig
from asyncrl.training.batch import build_batch
from asyncrl.training.critic import Critic
from tests.training.helpers import episode_groups, make_ragged_groups, tiny_lm


def critic_with_budget(budget: int) -> Critic:
    critic = Critic(tiny_lm(), CriticConfig(lr=1e-2), micro_batch_tokens=budget, forward_micro_batch_tokens=budget,
                    loss_agg_mode="token-mean")
    torch.manual_seed(1)
    torch.nn.init.normal_(critic.model.head.weight)  # the zero-initialised head would make every value 0
    return critic


def test_values_and_update_match_across_trimmed_micro_batches():
    batch = build_batch(make_ragged_groups(), pad_id=0)
    grads, values = [], []
    for budget in (10_000, 30):
        critic = critic_with_budget(budget)
        batch.values = critic.compute_values(batch)
        batch.returns = batch.values.detach() + batch.response_mask * torch.linspace(-1, 1, batch.size)[:, None]
        critic.train_step(batch, num_mini_batches=1)
        values.append(batch.values)
        grads.append(torch.cat([p.grad.flatten() for p in critic.model.parameters()]))
    assert values[0].abs().sum() > 0 and (values[0][batch.response_mask == 0] == 0).all()
    torch.testing.assert_close(values[0], values[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def test_tool_tokens_get_no_value_and_no_value_loss():
    batch = build_batch(episode_groups(), pad_id=0)
    tool = (batch.response_mask - batch.loss_mask).bool()
    grads, metrics = [], []
    for corrupt in (False, True):
        critic = critic_with_budget(30)
        batch.values = critic.compute_values(batch)
        assert (batch.values[tool] == 0).all() and (batch.values[batch.loss_mask.bool()] != 0).all()
        batch.returns = batch.values + 0.5 * batch.loss_mask
        if corrupt:  # whatever sits at the tool tokens
            batch.values, batch.returns = (torch.where(tool, float("nan"), x) for x in (batch.values, batch.returns))
        metrics.append(critic.train_step(batch, num_mini_batches=1))
        grads.append(torch.cat([p.grad.flatten() for p in critic.model.parameters()]))
    assert grads[0].abs().sum() > 0 and torch.equal(grads[0], grads[1])
    assert metrics[0] == metrics[1]
