"""PPOTrainer on multi-turn episodes: the behaviour log-probs of tool tokens (0.0) enter no
importance weight or log-prob comparison, and the model tokens per response are reported; a
single-turn batch reports what it did before."""

from __future__ import annotations

import dataclasses

import pytest

from asyncrl.config.schema import ActorConfig, AlgorithmConfig
from asyncrl.training.actor import Actor
from asyncrl.training.batch import build_batch
from asyncrl.types import Group
from asyncrl.workers.trainer import PPOTrainer
from tests.training.helpers import episode, make_groups, tiny_lm, two_episodes


def proximal_trainer() -> PPOTrainer:
    actor = Actor(tiny_lm(), ActorConfig(lr=1e-3, grad_clip=1e9), temperature=1.0, norm_length=8)
    return PPOTrainer(actor, AlgorithmConfig(), pad_id=0, old_log_prob_source="proximal")


def sampled_by(trainer: PPOTrainer, groups: list[Group], tool: float) -> list[Group]:
    """`groups` with the actor's own log-probs as behaviour log-probs at the model tokens (so
    every model token's weight is exactly 1) and `tool` at the tool tokens."""
    log_probs = trainer.actor.compute_log_probs(build_batch(groups, pad_id=0)).tolist()
    rows = iter(log_probs)
    return [dataclasses.replace(g, trajectories=[
        dataclasses.replace(t, logprobs=[lp if m else tool for lp, m in zip(next(rows), t.loss_mask, strict=False)])
        for t in g.trajectories]) for g in groups]


@pytest.mark.parametrize("tool", [0.0, -5.0], ids=["as-recorded", "other"])
def test_tool_tokens_stay_out_of_the_importance_weights_and_metrics(tool):
    """0.0 is what an episode records at a tool token; -5.0 would weigh e^5 if it entered."""
    trainer = proximal_trainer()
    groups = sampled_by(trainer, two_episodes(), tool)
    assert groups[0].trajectories[0].logprobs[1] == tool
    metrics = trainer.train(groups, {})
    assert metrics["off_policy/is_weight_mean"] == pytest.approx(1.0, rel=1e-6, abs=1e-7)
    assert metrics["off_policy/is_truncated_frac"] == 0.0
    assert metrics["training/rollout_logprob_diff_mean"] == pytest.approx(0.0, abs=1e-7)
    # model tokens 3 and 2 of responses 5 and 6 tokens long
    assert metrics["response_length/model_tokens/mean"] == pytest.approx(2.5, rel=1e-6, abs=1e-7)
    assert (metrics["response_length/model_tokens/max"], metrics["response_length/model_tokens/min"]) == (3.0, 2.0)
    assert metrics["response_length/model_token_ratio"] == pytest.approx(5 / 11, rel=1e-6, abs=1e-7)


def test_a_single_turn_batch_reports_no_model_token_metrics():
    metrics = PPOTrainer(Actor(tiny_lm(), ActorConfig(), temperature=1.0, norm_length=8), AlgorithmConfig(),
                         pad_id=0).train(make_groups(), {})
    assert "actor/pg_loss" in metrics and not any(k.startswith("response_length/") for k in metrics)


def test_an_episodes_other_chain_is_trained_with_its_episodes_advantage():
    trainer = PPOTrainer(Actor(tiny_lm(), ActorConfig(), temperature=1.0, norm_length=8), AlgorithmConfig(), pad_id=0)
    (group,) = two_episodes()
    e0, e1 = group.trajectories
    chain = episode("e0/chain0", [3, 4], [[17, 18]], [], reward=0.0)
    groups = [dataclasses.replace(group, trajectories=[dataclasses.replace(e0, chains=[chain]), e1])]
    batch = trainer._prepare(groups, {})
    assert batch.responses[0, :2].tolist() == [17, 18] and batch.loss_mask[0].tolist()[:3] == [1, 1, 0]
    a = 0.5 / (0.5 ** 0.5 + 1e-6)  # GRPO over the 2 episodes (rewards 1, 0), not the 3 rows
    per_row = [float(batch.advantages[i][batch.loss_mask[i].bool()].unique()) for i in range(3)]
    assert per_row == pytest.approx([a, a, -a], rel=1e-6, abs=1e-7)
    assert "actor/pg_loss" in trainer.train(groups, {})
