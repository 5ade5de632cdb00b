"""`asyncrl train` (colocated, 2 steps) with models that are not the built-in tiny Llama: Qwen3 and a
Llama 3 rope-scaled model on the fast engine path, GPT-2 on the generic one. Each is a small
random model saved to a directory with the tiny model's character tokenizer (`model.path=<dir>`)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

from asyncrl.models.tokenizer import build_char_tokenizer
from tests.pipelines.helpers import run_pipeline

pytestmark = pytest.mark.slow

_DECODER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128)
ARCHS: dict[str, tuple[str, dict[str, object], bool]] = {  # config class, kwargs, fast path?
    "qwen3": ("Qwen3Config", {**_DECODER, "head_dim": 32}, True),
    "llama3": ("LlamaConfig", {**_DECODER, "rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}}, True),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4), False),
}


def save_random_model(arch: str, where: Path) -> Path:
    name, kwargs, _ = ARCHS[arch]
    tok = build_char_tokenizer()
    config = getattr(transformers, name)(vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                         eos_token_id=tok.eos_token_id, bos_token_id=None, **kwargs)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(where)
    tok.save_pretrained(where)
    return where


@pytest.mark.parametrize("arch", list(ARCHS))
def test_two_colocated_steps_train_the_model(arch: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model_dir = save_random_model(arch, tmp_path / "model")
    with caplog.at_level(logging.WARNING, logger="asyncrl.rollout"):
        rows = run_pipeline(tmp_path / "run", f"model.path={model_dir}", "pipeline=colocated",
                            "trainer.total_training_steps=2", "trainer.test_freq=0",
                            "trainer.val_before_train=false", "data.train_batch_size=4", "rollout.n=4",
                            "actor.ppo_mini_batch_size=4", "actor.warmup_steps=0",
                            # A random model's rewards are all 0 (zero advantages): the entropy
                            # term gives the update a gradient, so the weights must move.
                            "actor.entropy_coeff=0.01")
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(math.isfinite(r["actor/pg_loss"]) and r["response_length/mean"] > 0 for r in steps)
    generic = [r.getMessage() for r in caplog.records if "generic" in r.getMessage()]
    assert len(generic) == (0 if ARCHS[arch][2] else 1), generic
    before = AutoModelForCausalLM.from_pretrained(model_dir)
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoints" / "global_step_2" / "actor")
    assert after.config.model_type == before.config.model_type
    moved = [n for n, p in after.named_parameters() if not torch.equal(p, before.get_parameter(n))]
    assert moved, "two training steps changed no weight"
