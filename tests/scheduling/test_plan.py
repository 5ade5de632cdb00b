"""The run plan: the derived numbers every pipeline, the factory and the simulator read, against
hand-computed values; and where PPO's old log-probs come from."""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.scheduling.old_log_probs import old_log_prob_source
from asyncrl.scheduling.plan import RunPlan, plan_run
from asyncrl.scheduling.precision_path import describe


def test_colocated_defaults():
    plan = plan_run(load_config(None, []))
    assert plan == RunPlan("colocated", prompts_per_update=32, total_prompts=1920, updates=60, mini_batches=2,
                           optimizer_steps=120, updates_per_sync=1, prompts_per_version=32, old_log_probs="rollout",
                           micro_batch_tokens=8192, log_prob_micro_batch_tokens=16384, micro_batch_basis="default",
                           torch_compile=False, precision="float32")
    assert plan.line() == ("plan: colocated, 1920 prompts = 60 updates x 32, 2 mini-batch(es) per update, "
                           "120 optimizer steps, old log-probs: rollout, micro-batches of 8192 tokens (default), "
                           "16384 forward-only, precision float32, layers eager")


@pytest.mark.parametrize(("overrides", "device", "path"), [
    ([], "cuda", "float32"),
    (["model.dtype=bfloat16"], "cuda", "param_dtype"),  # auto: FSDP2's policy
    (["model.dtype=bfloat16"], "cpu", "param_dtype"),  # auto on the CPU too: measured no slower
    (["model.dtype=bfloat16", "model.mixed_precision=autocast"], "cpu", "autocast"),
    (["model.dtype=bfloat16", "model.mixed_precision=autocast"], "cuda", "autocast"),
])
def test_the_precision_path_is_resolved_once_and_named_in_the_start_line(overrides, device, path):
    plan = plan_run(load_config(None, overrides), device)
    assert plan.precision == path
    assert f"forward-only, precision {describe(path)}, layers" in plan.line()


@pytest.mark.parametrize(("key", "device", "compiled"), [(None, "cpu", False), (None, "cuda", False),
                                                        (True, "cpu", True), (False, "cuda", False)])
def test_torch_compile_is_off_unless_set_on_every_device_until_a_gpu_measurement(key, device, compiled):
    overrides = [] if key is None else [f"actor.use_torch_compile={str(key).lower()}"]
    plan = plan_run(load_config(None, overrides), device)
    assert plan.torch_compile is compiled
    assert plan.line().endswith("layers compiled" if compiled else "layers eager")


def test_epochs_and_stream_trainer_steps():
    assert plan_run(load_config(None, ["actor.ppo_epochs=3"])).optimizer_steps == 60 * 2 * 3
    stream = plan_run(load_config(None, ["stream_trainer.enable=true", "actor.ppo_mini_batch_size=32"]))
    assert (stream.mini_batches, stream.optimizer_steps) == (1, 60)  # one step per batch


def test_fully_async_counts_prompts_updates_and_the_staleness_budget():
    cfg = load_config(None, ["pipeline=fully_async", "rollout.total_rollout_steps=100",
                             "async_training.require_batches=2", "actor.ppo_mini_batch_size=8",
                             "async_training.trigger_parameter_sync_step=3",
                             "async_training.staleness_threshold=0.5"])
    plan = plan_run(cfg)
    # R = 2 x 8 = 16 prompts per update; ceil(100 / 16) = 7 updates; 16 / 8 = 2 mini-batches;
    # per version floor(1.5 x 16 x 3) = 72 prompts
    assert (plan.prompts_per_update, plan.total_prompts, plan.updates) == (16, 100, 7)
    assert (plan.mini_batches, plan.optimizer_steps, plan.updates_per_sync) == (2, 14, 3)
    assert plan.prompts_per_version == 72
    assert "sync every 3 updates, at most 72 prompts started per version" in plan.line()
    unset = plan_run(load_config(None, ["pipeline=fully_async"]))
    assert unset.total_prompts == 32 * 60  # total_rollout_steps 0: train_batch_size x total_training_steps


@pytest.mark.parametrize("overrides, device, source", [
    (["actor.ppo_mini_batch_size=32"], "cpu", "update"),  # one optimizer step per batch
    (["actor.ppo_mini_batch_size=32"], "cuda", "update"),
    (["actor.ppo_mini_batch_size=32", "algorithm.use_kl_in_reward=true"], "cpu", "rollout"),  # needed first
    (["actor.ppo_mini_batch_size=32", "actor.ppo_epochs=2"], "cuda", "recompute"),
    ([], "cpu", "rollout"),  # two mini-batches, float32 on CPU: the engine's log-probs are exact
    ([], "cuda", "recompute"),  # two mini-batches, GPU kernels differ from the trainer's
    (["model.dtype=bfloat16"], "cpu", "recompute"),
    (["actor.old_log_probs=recompute", "actor.ppo_mini_batch_size=32"], "cpu", "recompute"),
    (["actor.old_log_probs=rollout"], "cuda", "rollout"),
    (["pipeline=one_step_off"], "cpu", "rollout"),
    (["pipeline=one_step_off", "async_training.use_rollout_log_probs=false"], "cpu", "recompute"),
    (["pipeline=fully_async", "async_training.use_rollout_log_probs=false", "actor.off_policy_correction=token"],
     "cpu", "proximal"),
])
def test_old_log_prob_source(overrides, device, source):
    plan = plan_run(load_config(None, overrides), device)
    assert plan.old_log_probs == source
    assert plan.old_log_prob_pass == (source in ("recompute", "proximal"))


def test_old_log_prob_source_without_a_config():
    kwargs = dict(one_step=False, kl_in_reward=False, exact_rollout=True, use_rollout_log_probs=True,
                  off_policy_correction="none")
    assert old_log_prob_source("auto", colocated=True, **kwargs) == "rollout"
    assert old_log_prob_source("auto", colocated=False, **kwargs) == "rollout"
