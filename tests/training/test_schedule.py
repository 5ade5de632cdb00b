"""LR schedules: verl's warm-up / constant / cosine factors at hand-computed steps, the actor's
optimizer following them step by step, and a resumed actor continuing the schedule exactly."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config.schema import ActorConfig
from asyncrl.training.actor import Actor
from asyncrl.training.optim import LRSchedule, actor_schedule, lr_factor, resolve_warmup
from tests.training.helpers import make_groups, tiny_lm
from tests.training.test_actor import prepared_batch


@pytest.mark.parametrize(("step", "want"), [(0, 0.0), (1, 0.5), (2, 1.0), (3, 1.0), (1000, 1.0)])
def test_constant_with_warmup(step, want):
    assert lr_factor(step, LRSchedule(warmup_steps=2)) == pytest.approx(want, rel=1e-12, abs=1e-12)


# warm-up 2, 10 steps, min ratio 0.1: after warm-up, 0.55 + 0.45 cos(pi (s - 2) / 8)
@pytest.mark.parametrize(("step", "want"), [
    (0, 0.0), (1, 0.5), (2, 1.0), (4, 0.55 + 0.45 * math.sqrt(0.5)), (6, 0.55),
    (8, 0.55 - 0.45 * math.sqrt(0.5)), (10, 0.1), (12, 0.55 - 0.45 * math.cos(math.pi / 4))])
def test_cosine_with_warmup_and_min_ratio(step, want):
    schedule = LRSchedule(warmup_steps=2, total_steps=10, kind="cosine", min_lr_ratio=0.1)
    assert lr_factor(step, schedule) == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_no_warmup_starts_at_full_rate():
    assert lr_factor(0, LRSchedule()) == 1.0
    assert lr_factor(0, LRSchedule(total_steps=4, kind="cosine")) == 1.0
    assert lr_factor(4, LRSchedule(total_steps=4, kind="cosine")) == pytest.approx(0.0, abs=1e-12)


def test_warmup_ratio_is_a_fraction_of_all_optimizer_steps():
    assert resolve_warmup(-1, 0.1, 36) == 3  # int(3.6), as verl
    assert resolve_warmup(5, 0.1, 36) == 5
    cfg = ActorConfig(warmup_steps=-1, warmup_ratio=0.25, lr_scheduler="cosine", min_lr_ratio=0.5)
    assert actor_schedule(cfg, 20) == LRSchedule(warmup_steps=5, total_steps=20, kind="cosine", min_lr_ratio=0.5)


def lr_trace(actor: Actor, batch, updates: int) -> list[float]:
    lrs = []
    for _ in range(updates):
        actor.train_step(batch, num_mini_batches=2)
        lrs.append(actor.optimizer.param_groups[0]["lr"])
    return lrs


def test_actor_optimizer_follows_the_cosine_schedule_and_resumes_exactly(tmp_path):
    cfg = ActorConfig(lr=1e-2, warmup_steps=-1, warmup_ratio=0.25, lr_scheduler="cosine", min_lr_ratio=0.1)
    groups = make_groups(2, 4)
    model = tiny_lm()
    actor = Actor(model, cfg, temperature=1.0, norm_length=4, total_steps=8)  # 4 updates x 2 mini-batches
    batch = prepared_batch(model, groups, actor)
    # warm-up int(0.25 x 8) = 2; after update u the next step is 2u, factor 0.55 + 0.45 cos(pi (2u - 2) / 6)
    first = lr_trace(actor, batch, 2)
    torch.testing.assert_close(torch.tensor(first), torch.tensor([1e-2, 1e-2 * (0.55 + 0.45 * 0.5)]),
                               rtol=1e-9, atol=1e-12)
    assert actor.train_step(batch, 2)["actor/lr"] == pytest.approx(1e-2 * 0.55, rel=1e-9, abs=1e-12)  # step 5
    actor.save(tmp_path / "actor")
    resumed = Actor(tiny_lm(seed=1), cfg, temperature=1.0, norm_length=4, total_steps=8)
    resumed.load(tmp_path / "actor")
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * (0.55 - 0.45 * 0.5), rel=1e-9, abs=1e-12)
    assert lr_trace(resumed, batch, 1) == lr_trace(actor, batch, 1)
    for a, b in zip(actor.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
