"""build_trainer_side hands the config's model keys to every trainer part."""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.scheduling.plan import plan_run
from asyncrl.training.packed_attention import attention_name
from asyncrl.workers.factory import build_trainer_side


@pytest.mark.parametrize("pack", [True, False])
def test_use_remove_padding_reaches_actor_reference_and_critic(tiny_cache, pack):
    cfg = load_config(None, [f"model.use_remove_padding={str(pack).lower()}", "algorithm.adv_estimator=gae",
                             "actor.use_kl_loss=true"])
    trainer = build_trainer_side(cfg, plan_run(cfg))
    assert (trainer.actor.pack, trainer.ref.pack, trainer.critic.model.pack) == (pack, pack, pack)


def test_packed_attention_reaches_actor_reference_and_critic(tiny_cache):
    cfg = load_config(None, ["model.packed_attention=grouped", "algorithm.adv_estimator=gae", "actor.use_kl_loss=true"])
    trainer = build_trainer_side(cfg, plan_run(cfg))
    models = (trainer.actor.model, trainer.ref.model, trainer.critic.model.body)
    assert {m.config._attn_implementation for m in models} == {attention_name("grouped")}
