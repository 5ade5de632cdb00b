"""Actor: log-probs equal a plain transformers forward; micro-batching (length-sorted, trimmed)
does not change the gradient; a PPO step on positive-advantage samples raises their probability;
losses, KL and entropy run over the loss mask (a multi-turn episode's model tokens) only."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncrl.algorithms import compute_advantage
from asyncrl.config.schema import ActorConfig
from asyncrl.training import actor as actor_module
from asyncrl.training.actor import Actor, RefWorker
from asyncrl.training.batch import build_batch
from tests.training.helpers import (
    episode_groups,
    make_groups,
    make_ragged_groups,
    single_turn_as_episodes,
    tiny_lm,
    two_episodes,
)


def plain_log_probs(model, groups, temperature):
    out = []
    for g in groups:
        for t in g.trajectories:
            ids = torch.tensor([t.prompt_ids + t.response_ids])
            logits = model(input_ids=ids).logits[0, len(t.prompt_ids) - 1 : -1] / temperature
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(t.response_ids)[:, None])[:, 0])
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_match_transformers_forward(temperature):
    model, groups = tiny_lm(), make_groups()
    actor = Actor(model, ActorConfig(), temperature=temperature, norm_length=4)
    batch = build_batch(groups, pad_id=0)
    got = actor.compute_log_probs(batch)
    want = plain_log_probs(model, groups, temperature)
    for i, w in enumerate(want):
        torch.testing.assert_close(got[i, : len(w)], w, rtol=1e-5, atol=1e-5)
        assert got[i, len(w):].abs().sum() == 0
    ref = RefWorker(copy.deepcopy(model), temperature, 10_000)
    torch.testing.assert_close(ref.compute_log_probs(batch), got, rtol=1e-6, atol=1e-6)


def prepared_batch(model, groups, actor):
    batch = build_batch(groups, pad_id=0)
    batch.old_log_probs = actor.compute_log_probs(batch)
    batch.advantages, _ = compute_advantage("grpo", batch.token_level_scores, batch.response_mask, batch.index)
    return batch


def update_with_budget(groups, budget, mode, policy_loss="vanilla", pack=False):
    """Gradients, metrics and the micro-batch shapes of one train step at token budget `budget`
    (padded micro-batches unless `pack`)."""
    model = tiny_lm()
    cfg = ActorConfig(ppo_micro_batch_tokens=budget, loss_agg_mode=mode, lr=1e-2, grad_clip=1e9,
                      policy_loss=policy_loss, entropy_coeff=0.01)
    actor = Actor(model, cfg, temperature=1.0, norm_length=4, use_remove_padding=pack)
    batch = prepared_batch(model, groups, actor)
    batch.old_log_probs = batch.old_log_probs - 0.05 * batch.response_mask  # ratios != 1: clipping matters
    shapes, loss_of = [], actor._micro_batch_loss

    def recording_loss(mb, counts):
        shapes.append(tuple(mb.input_ids.shape))
        return loss_of(mb, counts)

    actor._micro_batch_loss = recording_loss
    metrics = actor.train_step(batch, num_mini_batches=1)
    return torch.cat([p.grad.flatten() for p in model.parameters()]), metrics, shapes, batch


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batching_gives_the_same_update(mode, ragged, pack):
    """One micro-batch vs length-sorted, trimmed ones (ragged: prompts of 2-7 and responses of
    1-14 tokens, so micro-batches drop columns on both sides and rows run out of order), padded
    or packed."""
    groups = make_ragged_groups() if ragged else make_groups(2, 4)
    whole, whole_metrics, whole_shapes, batch = update_with_budget(groups, 10_000, mode, pack=pack)
    split, split_metrics, split_shapes, _ = update_with_budget(groups, 30 if ragged else 8, mode, pack=pack)
    assert whole_shapes == [tuple(batch.input_ids.shape)] and len(split_shapes) > 2
    torch.testing.assert_close(whole, split, rtol=1e-4, atol=1e-7)
    for key in ("actor/pg_loss", "actor/entropy"):
        assert whole_metrics[key] == pytest.approx(split_metrics[key], rel=1e-4, abs=1e-7)


def test_trimmed_micro_batches_are_narrower_than_the_batch():
    groups = make_ragged_groups()
    _, _, shapes, batch = update_with_budget(groups, 30, "token-mean")
    width = batch.input_ids.shape[1]  # 7 + 14
    assert sum(rows for rows, _ in shapes) == batch.size
    assert all(rows * w <= 30 or rows == 1 for rows, w in shapes)
    assert min(w for _, w in shapes) <= 4 < width  # prompt 2 + response 1-2
    assert sum(rows * w for rows, w in shapes) < batch.input_ids.numel() / 2


def test_log_probs_of_ragged_micro_batches_come_back_in_row_order():
    model, groups = tiny_lm(), make_ragged_groups()
    batch = build_batch(groups, pad_id=0)
    cfg = ActorConfig(ppo_micro_batch_tokens=60, log_prob_micro_batch_tokens=30)
    got = Actor(model, cfg, temperature=1.0, norm_length=4).compute_log_probs(batch)
    for i, w in enumerate(plain_log_probs(model, groups, 1.0)):
        torch.testing.assert_close(got[i, : len(w)], w, rtol=1e-5, atol=1e-5)
        assert got[i, len(w):].abs().sum() == 0


def test_update_raises_probability_of_rewarded_responses():
    model, groups = tiny_lm(), make_groups(2, 4)
    actor = Actor(model, ActorConfig(lr=1e-2), temperature=1.0, norm_length=4)
    batch = prepared_batch(model, groups, actor)
    before = actor.compute_log_probs(batch).sum(-1)
    for _ in range(5):
        actor.train_step(batch, num_mini_batches=2)
    delta = actor.compute_log_probs(batch).sum(-1) - before
    adv = batch.advantages[:, 0]
    assert (delta[adv > 0] > 0).all() and (delta[adv < 0] < 0).all()
    assert actor.version == 5


@pytest.mark.parametrize("policy_loss", ["vanilla", "gspo"])
def test_one_step_batch_takes_old_log_probs_from_its_own_forward(policy_loss):
    """old_log_probs None (source "update"): the step equals the one on recomputed log-probs."""
    groups = make_groups(2, 4)
    grads = []
    for recompute in (True, False):
        model = tiny_lm()
        cfg = ActorConfig(ppo_micro_batch_tokens=8, lr=1e-2, grad_clip=1e9, policy_loss=policy_loss,
                          clip_ratio_low=1e-3, clip_ratio_high=1e-3)
        actor = Actor(model, cfg, temperature=0.7, norm_length=4)
        batch = prepared_batch(model, groups, actor)
        if not recompute:
            batch.old_log_probs = None
        metrics = actor.train_step(batch, num_mini_batches=1)
        assert metrics["actor/pg_clipfrac"] == 0.0  # ratio exactly 1 in both
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)
    with pytest.raises(AssertionError, match="one optimizer step"):
        Actor(tiny_lm(), ActorConfig(), temperature=1.0, norm_length=4).train_step(batch, num_mini_batches=2)


def grads_of(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def kl_entropy_actor(pack=False, **cfg):
    config = dict(ppo_micro_batch_tokens=30, log_prob_micro_batch_tokens=30, lr=1e-2, grad_clip=1e9,
                  use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01) | cfg
    return Actor(tiny_lm(), ActorConfig(**config), temperature=0.8, norm_length=8, use_remove_padding=pack)


def ready(actor, groups, pack=False):
    """A batch with old (shifted: ratios != 1) and reference log-probs and GRPO advantages."""
    batch = build_batch(groups, pad_id=0)
    batch.old_log_probs = actor.compute_log_probs(batch) - 0.05 * batch.loss_mask
    batch.ref_log_probs = RefWorker(tiny_lm(seed=1), 0.8, 30, use_remove_padding=pack).compute_log_probs(batch)
    batch.advantages, _ = compute_advantage("grpo", batch.token_level_scores, batch.loss_mask, batch.index)
    return batch


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_single_turn_update_is_bit_identical_with_an_all_ones_loss_mask(mode, pack):
    """Empty loss masks (the response mask itself, today's batch) and ones spelled out as all
    ones: the same old and reference log-probs, advantages, gradients and metrics, bit for bit."""
    runs = []
    for groups in (make_ragged_groups(), single_turn_as_episodes(make_ragged_groups())):
        actor = kl_entropy_actor(pack, loss_agg_mode=mode)
        batch = ready(actor, groups, pack)
        runs.append((batch, actor.train_step(batch, num_mini_batches=1), grads_of(actor.model)))
    (today, metrics, grads), (spelled, spelled_metrics, spelled_grads) = runs
    assert today.loss_mask is today.response_mask and spelled.has_context_tokens
    for name in ("old_log_probs", "ref_log_probs", "advantages"):
        assert torch.equal(getattr(today, name), getattr(spelled, name)), name
    assert grads.abs().sum() > 0 and torch.equal(grads, spelled_grads)
    assert metrics == spelled_metrics


class ToolNoise:
    """What the model says at a micro-batch's tool tokens, replaced: `fill` added to their
    log-probs and entropies (the gradient path kept)."""

    def __init__(self, out, mb, fill):
        self.out, self.noise = out, torch.where((mb.response_mask - mb.loss_mask).bool(), fill, 0.0)

    def log_probs(self, temperature):
        return self.out.log_probs(temperature) + self.noise

    def entropies(self, temperature, grad=True):
        return self.out.entropies(temperature, grad) + self.noise


@pytest.mark.parametrize(("policy_loss", "kl"), [("vanilla", "k2"), ("gspo", "low_var_kl"), ("cispo", "k1")])
def test_tool_tokens_change_nothing_in_the_loss_or_gradient(policy_loss, kl, monkeypatch):
    """Log-probs, entropies, old, reference and behaviour log-probs, IS weights (NaN) and
    advantages (1e3) at the tool tokens: the policy, KL and entropy terms, their gradients and
    every metric stay bit-identical."""
    mode = "seq-mean-token-mean" if policy_loss == "gspo" else "token-mean"
    real = actor_module.response_logits

    def noisy(model, mb, *args):
        return ToolNoise(real(model, mb, *args), mb, float("nan"))

    runs = []
    for corrupt in (False, True):
        actor = kl_entropy_actor(loss_agg_mode=mode, policy_loss=policy_loss, kl_loss_type=kl)
        batch = ready(actor, episode_groups())
        batch.is_weights = 0.9 * batch.loss_mask
        if corrupt:
            tool = (batch.response_mask - batch.loss_mask).bool()
            for name in ("old_log_probs", "ref_log_probs", "rollout_log_probs", "is_weights"):
                setattr(batch, name, torch.where(tool, float("nan"), getattr(batch, name)))
            batch.advantages = torch.where(tool, 1e3, batch.advantages)
            monkeypatch.setattr(actor_module, "response_logits", noisy)
        runs.append((actor.train_step(batch, num_mini_batches=1), grads_of(actor.model)))
    (metrics, grads), (corrupt_metrics, corrupt_grads) = runs
    assert torch.isfinite(grads).all() and grads.abs().sum() > 0
    assert torch.equal(grads, corrupt_grads)
    assert metrics == corrupt_metrics and "actor/kl_loss" in metrics


@pytest.mark.parametrize(("mode", "want"), [("token-mean", -0.1414211), ("seq-mean-token-sum", -0.3535529),
                                            ("seq-mean-token-mean", 0.0)])
def test_loss_normalises_by_model_tokens(mode, want):
    """GRPO on rewards [1, 0]: advantages +-0.5 / (0.707107 + 1e-6) = +-0.7071058 on the model
    tokens. At ratio 1 (old log-probs from the step's own forward) the token-mean loss is
    -(3 - 2) x 0.7071058 / 5 model tokens (11 attended); seq-mean-token-sum -(3 - 2) x 0.7071058 / 2."""
    actor = Actor(tiny_lm(), ActorConfig(loss_agg_mode=mode), temperature=1.0, norm_length=8)
    batch = build_batch(two_episodes(), pad_id=0)
    batch.advantages, _ = compute_advantage("grpo", batch.token_level_scores, batch.loss_mask, batch.index)
    model_tokens = torch.tensor([[1.0, 0, 0, 1, 1, 0], [1, 0, 0, 0, 0, 1]])  # turn, tool, turn
    assert torch.equal(batch.loss_mask, model_tokens)
    torch.testing.assert_close(batch.advantages, model_tokens * torch.tensor([[0.7071058], [-0.7071058]]),
                               rtol=1e-6, atol=1e-7)
    metrics = actor.train_step(batch, num_mini_batches=1)
    assert metrics["actor/pg_loss"] == pytest.approx(want, rel=1e-5, abs=1e-7)
