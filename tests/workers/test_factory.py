"""build_trainer_side hands the config's model keys to every trainer part."""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.scheduling.plan import plan_run
from asyncrl.workers.factory import build_trainer_side


@pytest.mark.parametrize("pack", [True, False])
def test_use_remove_padding_reaches_actor_reference_and_critic(tiny_cache, pack):
    cfg = load_config(None, [f"model.use_remove_padding={str(pack).lower()}", "algorithm.adv_estimator=gae",
                             "actor.use_kl_loss=true"])
    trainer = build_trainer_side(cfg, plan_run(cfg))
    assert (trainer.actor.pack, trainer.ref.pack, trainer.critic.model.pack) == (pack, pack, pack)
