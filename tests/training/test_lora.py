"""LoRA: only the adapters train (base weights bit for bit unchanged), the optimizer holds only
them, a weight sync gives the engine peft's merge_and_unload of the trained model under the
base names, the reference is the base model, and a checkpoint holds the adapters and a merged
HF model and resumes exactly."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from asyncrl.config.schema import ActorConfig, AlgorithmConfig, Config, ModelConfig
from asyncrl.models.tensors import checksum, export_named
from asyncrl.rollout.engine import TorchEngine
from asyncrl.scheduling.plan import plan_run
from asyncrl.sync import ParameterSynchronizer
from asyncrl.sync.transports import InProcessTransport
from asyncrl.training.actor import Actor
from asyncrl.training.lora import ADAPTER_DIR
from asyncrl.training.model import prepare_actor_model
from asyncrl.workers.factory import build_trainer_side
from asyncrl.workers.trainer import PPOTrainer
from tests.training.helpers import make_groups, tiny_lm

pytest.importorskip("peft")

LORA = ModelConfig(lora_rank=4, lora_alpha=8)
ACTOR = ActorConfig(lr=1e-2, warmup_steps=0, ppo_mini_batch_size=1)


def lora_trainer(seed: int = 0) -> PPOTrainer:
    actor = Actor(prepare_actor_model(tiny_lm(seed), LORA), ACTOR, temperature=1.0, norm_length=4)
    return PPOTrainer(actor, AlgorithmConfig(), pad_id=0)


def train(trainer: PPOTrainer, updates: int = 2) -> None:
    for step in range(updates):
        asyncio.run(trainer.train_groups(make_groups(2, 4, seed=step)))


def merged_reference(trainer: PPOTrainer) -> dict[str, torch.Tensor]:
    """peft's own merge of a copy of the trained model."""
    return export_named(copy.deepcopy(trainer.actor.model).merge_and_unload())


def test_only_adapter_weights_train_and_the_optimizer_holds_only_them():
    trainer = lora_trainer()
    model = trainer.actor.model
    named = dict(model.named_parameters())
    adapters = {n for n, p in named.items() if p.requires_grad}
    assert adapters and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    held = {id(p) for g in trainer.actor.optimizer.param_groups for p in g["params"]}
    assert held == {id(named[n]) for n in adapters}
    before = {n: p.detach().clone() for n, p in named.items()}
    train(trainer)  # two updates of two mini-batches: B moves first (it starts at 0), then A
    for name, param in named.items():
        if name in adapters:
            assert not torch.equal(param, before[name]), f"{name} did not train"
        else:
            assert torch.equal(param, before[name]), f"{name} (base) changed"


def test_sync_gives_the_engine_the_merged_weights_under_base_names():
    trainer = lora_trainer()
    engine = TorchEngine(tiny_lm(), eos_token_id=1)
    base_sum = engine.weights_checksum()
    train(trainer)
    sync = ParameterSynchronizer(trainer, [engine], InProcessTransport(trainer, [engine]))
    asyncio.run(sync.sync())
    want = merged_reference(trainer)
    assert engine.weights_checksum() == checksum(want) != base_sum  # bit for bit, base names only
    assert [m[0] for m in asyncio.run(trainer.weight_meta())] == list(want)


def test_reference_model_is_the_base_model_without_adapters():
    cfg = Config(model=LORA, actor=replace(ACTOR, use_kl_loss=True))
    base = tiny_lm()
    want = {n: p.detach().clone() for n, p in base.named_parameters()}
    trainer = build_trainer_side(cfg, plan_run(cfg), base, SimpleNamespace(pad_token_id=0))
    assert isinstance(trainer, PPOTrainer) and trainer.ref is not None
    ref = dict(trainer.ref.model.named_parameters())
    assert ref.keys() == want.keys() and all(torch.equal(ref[n], want[n]) for n in want)
    assert any(".lora_" in n for n, _ in trainer.actor.model.named_parameters())


def test_checkpoint_holds_adapters_and_a_merged_hf_model_and_resumes_exactly(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = lora_trainer()
    train(trainer)
    asyncio.run(trainer.save(tmp_path))
    actor_dir = tmp_path / "actor"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (actor_dir / ADAPTER_DIR).iterdir()}
    want = merged_reference(trainer)
    plain = export_named(AutoModelForCausalLM.from_pretrained(actor_dir))
    assert checksum(plain) == checksum(want)
    adapted = PeftModel.from_pretrained(tiny_lm(), actor_dir / ADAPTER_DIR)
    assert checksum(export_named(adapted.merge_and_unload())) == checksum(want)

    resumed = lora_trainer()
    asyncio.run(resumed.load(tmp_path))
    train(trainer, 1)
    train(resumed, 1)
    assert checksum(export_named(resumed.actor.model)) == checksum(export_named(trainer.actor.model))
