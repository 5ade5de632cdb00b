"""Regional compilation (`asyncrl.training.compile`, `actor.use_torch_compile`) on the CPU through
inductor: compiled steps equal eager ones up to float32 reordering, new packed lengths and row
counts reuse the compiled layer, the compile cost is reported apart from the step, and the key
maps from verl's. Each test starts from an empty dynamo cache, so what it counts is its own.

Dynamo's cache is the process's: a test here may reuse what an earlier one compiled (the same
tiny model), so a test asserts what the cache holds and what a step adds, never that its own
first step compiled. Hitting the recompile limit, where dynamo would fall back to eager
silently, is an error here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from asyncrl.config import load_config
from asyncrl.config.schema import ActorConfig
from asyncrl.scheduling.plan import plan_run
from asyncrl.training import fsdp, packed_attention, vocab_chunks
from asyncrl.training.actor import Actor
from asyncrl.training.batch import build_batch
from asyncrl.training.compile import _layer_forward, compile_layers, compile_metrics, is_compiled
from asyncrl.training.logits import response_logits
from asyncrl.training.lora import apply_lora
from asyncrl.training.memory import enable_gradient_checkpointing
from asyncrl.training.packed_attention import use_packed_attention
from asyncrl.workers.factory import build_trainer_side
from asyncrl.workers.trainer import PPOTrainer
from tests.tolerances import Lockstep, assert_same_steps, assert_within, sum_error
from tests.training.helpers import gradient_terms, groups_of_lengths, tiny_lm
from tests.training.test_packing import spread_groups, train_batch

LR = 1e-2


@pytest.fixture(autouse=True)
def strict_dynamo():
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield


def layer_compiled() -> bool:
    """Whether dynamo holds compiled code for the decoder layers' shared frame."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(_layer_forward.__code__)) > 0


def actor(compiled: bool, prepare: Any = None, **cfg: Any) -> Actor:
    model = tiny_lm() if prepare is None else prepare(tiny_lm())
    config = ActorConfig(ppo_micro_batch_tokens=40, lr=LR, warmup_steps=0, grad_clip=1e9, entropy_coeff=0.01, **cfg)
    return Actor(compile_layers(model, compiled), config, temperature=1.0, norm_length=8)


def lora_checkpointed(model: Any) -> Any:
    enable_gradient_checkpointing(model)
    return apply_lora(model, 4, 8, ("q_proj", "v_proj"))


@pytest.mark.parametrize("prepare", [None, lora_checkpointed], ids=["full", "lora+checkpointing"])
def test_compiled_steps_equal_eager_steps(prepare):
    """Two optimizer steps over micro-batches of different packed lengths: compiled layers give
    the eager gradients within float32 summation reordering (`sum_error` over the gradient's
    terms), and the weights what AdamW makes of that (`Lockstep`: each step from the same
    weights). Inductor fuses the norms, rotary embeddings and SiLU-mul, which reorders float32
    sums and nothing else."""
    batch = train_batch(spread_groups())
    batch.old_log_probs = actor(False).compute_log_probs(batch) - 0.05 * batch.response_mask  # ratios != 1
    lead = Lockstep()
    follow = Lockstep(leader=lead)  # the compiled run starts each step from the eager one's weights
    for lock in (lead, follow):
        a = actor(lock is follow, prepare)
        lock.attach(a.model, a.optimizer)
        a.train_step(batch, num_mini_batches=2)
    assert is_compiled(a.model) and layer_compiled()  # the path under test ran
    tokens = [int(batch.response_mask[rows].sum()) for rows in (slice(0, 6), slice(6, 12))]
    assert_same_steps(lead.steps, follow.steps, [gradient_terms(a.cfg, n) for n in tokens], LR)


def test_the_run_compiles_by_its_plan_and_new_lengths_recompile_nothing(monkeypatch):
    """The factory compiles the actor's and the reference's layers when the plan says so; the
    trainer's step metrics carry the compile time and recompiles beside the stage timings. After
    the first step (which compiles what a step needs), steps with other token counts and other
    numbers of rows compile nothing. The chunked vocabulary head (forced on for this vocabulary)
    runs after the compiled layers, packed attention eagerly inside them."""
    monkeypatch.setattr(vocab_chunks, "CPU_MIN_VOCAB", 0)
    cfg = load_config(overrides=["actor.use_torch_compile=true", "actor.use_kl_loss=true", "actor.warmup_steps=0",
                                 "data.max_response_length=40"])
    side = build_trainer_side(cfg, plan_run(cfg, "cpu"), model=tiny_lm(), tok=SimpleNamespace(pad_token_id=0))
    assert isinstance(side, PPOTrainer) and side.ref is not None and side.actor.head.chunked
    assert is_compiled(side.actor.model) and is_compiled(side.ref.model)
    shapes = [([3, 9], [[5, 1, 2], [7, 3]]), ([2, 4, 6], [[11], [1, 2, 3, 4], [2, 2]]), ([8], [[1, 30, 6, 2]])]
    before = packed_attention.PATHS["grouped"]
    steps = [side.train(groups_of_lengths(prompts, responses, seed=i), {})
             for i, (prompts, responses) in enumerate(shapes)]
    assert layer_compiled() and all(m["timing_s/update_actor"] > 0 for m in steps)
    assert [m["perf/recompiles"] for m in steps] == [0, 0, 0]  # the first step's compiles are the compile
    assert [m["perf/compile_s"] for m in steps[1:]] == [0, 0]
    assert packed_attention.PATHS["grouped"] > before
    eager = build_trainer_side(load_config(), plan_run(load_config(), "cpu"), model=tiny_lm(),
                               tok=SimpleNamespace(pad_token_id=0))
    assert isinstance(eager, PPOTrainer) and not is_compiled(eager.actor.model)
    assert "perf/compile_s" not in eager.train(spread_groups(), {})


def test_layers_compiled_before_fully_shard_keep_fsdp_hooks_and_checkpointing(tmp_path):
    """Compile, then FSDP2 (the actor's order, torchtitan's): `fully_shard` swaps each layer's
    class and hooks it; the compiled forward runs the swapped class's checkpointed forward. On a
    one-rank gloo group, so the gradients are the eager sharded model's up to float32 reordering."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        batch, grads = build_batch(spread_groups(), pad_id=0), []
        for compiled in (False, True):
            model = tiny_lm().train()
            use_packed_attention(model, "auto")
            enable_gradient_checkpointing(model)
            fsdp.shard(compile_layers(model, compiled))
            response_logits(model, batch, pack=True).log_probs(1.0).sum().backward()
            grads.append(torch.cat([p.grad.full_tensor().flatten() for p in model.parameters()]))
        assert type(model.model.layers[0]).__name__.startswith("FSDP") and layer_compiled()
        terms = int(batch.response_mask.sum())
        assert_within(grads[1], grads[0], sum_error(torch.float32, terms, float(grads[0].abs().max())), "gradients")
    finally:
        dist.destroy_process_group()


def test_the_watch_reports_compile_time_and_later_compiles_as_recompiles():
    double = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    model = compile_layers(tiny_lm(), True)
    double(torch.ones(2))
    first = compile_metrics(model)
    assert first["perf/compile_s"] > 0 and first["perf/recompiles"] == 0
    double(torch.ones(2))  # cached: nothing compiled
    assert compile_metrics(model) == {"perf/compile_s": 0.0, "perf/recompiles": 0.0}
    double(torch.ones(3, dtype=torch.float64))  # new guards: compiled again
    later = compile_metrics(model)
    assert later["perf/compile_s"] > 0 and later["perf/recompiles"] >= 1
    assert compile_metrics(tiny_lm()) == {}  # an eager model reports nothing


def test_the_key_maps_from_verl():
    assert load_config(overrides=["actor_rollout_ref.actor.use_torch_compile=false"]).actor.use_torch_compile is False
    assert load_config(overrides=["actor_rollout_ref.ref.use_torch_compile=true"]).actor.use_torch_compile is True
    both = ["actor_rollout_ref.ref.use_torch_compile=true", "actor_rollout_ref.actor.use_torch_compile=false"]
    assert load_config(overrides=both).actor.use_torch_compile is False  # the actor's wins
    assert load_config().actor.use_torch_compile is None
