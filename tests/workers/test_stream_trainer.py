"""Stream trainer: gradients accumulated over chunks of finished groups, then one step, give the
weights, gradients and metrics of the plain `train_groups` step on the same batch; the simulated
trainer charges the chunks' passes now and one optimizer step at apply."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator, Sequence

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.config.schema import ActorConfig, AlgorithmConfig, KLControlConfig
from asyncrl.scheduling.plan import plan_run
from asyncrl.sim.loop import run_virtual
from asyncrl.sim.profile import load_profile
from asyncrl.sim.workers import SimTrainer
from asyncrl.training.actor import Actor, RefWorker
from asyncrl.types import Group
from asyncrl.workers.trainer import PPOTrainer
from tests.tolerances import Lockstep, assert_same_steps
from tests.training.helpers import episode_groups, gradient_terms, make_groups, tiny_lm

LR = 1e-3
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum"]
PLAIN = {"actor": {}, "algorithm": {}}
KL_AND_ENTROPY = {"actor": {"use_kl_loss": True, "kl_loss_coef": 0.1, "entropy_coeff": 0.01},
                  "algorithm": {"use_kl_in_reward": True,
                                "kl_ctrl": KLControlConfig(type="adaptive", kl_coef=0.05, target_kl=0.01, horizon=10)}}


def make_trainer(mode: str, extra: dict[str, dict], micro_tokens: int = 10_000) -> PPOTrainer:
    cfg = ActorConfig(lr=LR, warmup_steps=0, grad_clip=1e9, loss_agg_mode=mode, ppo_mini_batch_size=6,
                      ppo_micro_batch_tokens=micro_tokens, log_prob_micro_batch_tokens=micro_tokens, **extra["actor"])
    actor = Actor(tiny_lm(), cfg, temperature=1.0, norm_length=8)
    algorithm = AlgorithmConfig(**extra["algorithm"])
    use_ref = cfg.use_kl_loss or algorithm.use_kl_in_reward
    ref = RefWorker(tiny_lm(seed=1), 1.0, 10_000) if use_ref else None
    return PPOTrainer(actor, algorithm, pad_id=0, ref=ref)


def ragged_groups() -> list[Group]:
    """Six prompts of 4 responses, 1-4 tokens each, prompts of 2-7 tokens; rewards 0/1 per group."""
    return make_groups(n_prompts=6, n=4, seed=3)


def chunks_of(groups: list[Group]) -> list[list[Group]]:
    """Finish order: not the batch order, chunks of 1-3 groups with different padded widths."""
    return [[groups[3]], [groups[0], groups[5]], [groups[1], groups[4], groups[2]]]


def streamed(trainer: PPOTrainer, chunks: Sequence[Sequence[Group]]) -> dict[str, float]:
    async def run() -> dict[str, float]:
        for chunk in chunks:
            await trainer.accumulate_groups(chunk)
        return await trainer.apply_update()
    return asyncio.run(run())


def weights(trainer: PPOTrainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in trainer.actor.model.parameters()])


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """Torch's intra-op threads for the test (another reduction order in the kernels), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def tokens_of(groups: Sequence[Group]) -> int:
    return sum(len(t.response_ids) for g in groups for t in g.trajectories)


def lockstep(plain: PPOTrainer, stream: PPOTrainer) -> tuple[Lockstep, Lockstep]:
    """Attach before training: the plain trainer leads; the stream trainer, run after it, takes
    its weights and AdamW state after each step (tests/tolerances.py)."""
    lead = Lockstep()
    lead.attach(plain.actor.model, plain.actor.optimizer)
    follow = Lockstep(leader=lead)
    follow.attach(stream.actor.model, stream.actor.optimizer)
    return lead, follow


@pytest.mark.parametrize("order", ["finish", "reversed"])
@pytest.mark.parametrize("extra", [PLAIN, KL_AND_ENTROPY], ids=["plain", "kl-entropy"])
@pytest.mark.parametrize("mode", MODES)
def test_streamed_step_equals_plain_step(mode: str, extra: dict[str, dict], order: str, threads: int) -> None:
    groups = ragged_groups()
    plain, stream = make_trainer(mode, extra), make_trainer(mode, extra, micro_tokens=16)
    lead, follow = lockstep(plain, stream)
    before = weights(plain)
    want = asyncio.run(plain.train_groups(groups))
    chunks = chunks_of(groups)
    got = streamed(stream, chunks if order == "finish" else chunks[::-1])
    assert (weights(plain) - before).abs().max() > 1e-4  # the step moved the weights: the comparison means something
    # Gradients within their float32 summation bound: one term per response token and loss, in
    # other micro-batches and chunks. Weights within what AdamW makes of it (tests/tolerances.py):
    # an element whose gradient is within the bound of 0 may differ by up to lr, one far above it
    # by ~lr x adam_eps x bound / g^2; plus the rounding of the update and the weight.
    assert_same_steps(lead.steps, follow.steps, [gradient_terms(plain.actor.cfg, tokens_of(groups))], LR)
    assert set(got) == set(want)
    for key in want:
        if not key.startswith(("timing_s/", "perf/")):  # times and memory vary run to run
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    assert stream.actor.version == plain.actor.version == 1
    assert stream.kl_ctrl.value == pytest.approx(plain.kl_ctrl.value, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_streamed_episodes_equal_the_plain_step(mode: str) -> None:
    """Multi-turn episodes (tool text between turns): the chunks' counts are model tokens, as the
    plain step's, so the streamed step and its metrics are the plain one's."""
    groups = episode_groups(n_prompts=6)
    plain, stream = make_trainer(mode, KL_AND_ENTROPY), make_trainer(mode, KL_AND_ENTROPY, micro_tokens=16)
    lead, follow = lockstep(plain, stream)
    want = asyncio.run(plain.train_groups(groups))
    got = streamed(stream, chunks_of(groups))
    assert_same_steps(lead.steps, follow.steps, [gradient_terms(plain.actor.cfg, tokens_of(groups))], LR)
    assert set(got) == set(want) and "response_length/model_tokens/mean" in want
    for key in want:
        if not key.startswith(("timing_s/", "perf/")):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key


def test_accumulate_does_not_change_weights_and_a_second_batch_starts_afresh() -> None:
    """Two batches, each step compared from the same weights and AdamW state (`Lockstep`: after
    each step the stream trainer takes the plain one's), so the second step's gradients show
    whether the first batch's were carried over."""
    groups = ragged_groups()
    batches = [groups[:2], groups[2:]]
    plain, stream = make_trainer("token-mean", PLAIN), make_trainer("token-mean", PLAIN)
    lead, follow = lockstep(plain, stream)
    for batch in batches:
        asyncio.run(plain.train_groups(batch))
    first = weights(stream)
    asyncio.run(stream.accumulate_groups(batches[0]))
    torch.testing.assert_close(weights(stream), first, rtol=0, atol=0)
    asyncio.run(stream.apply_update())
    streamed(stream, [groups[2:4], groups[4:]])
    assert_same_steps(lead.steps, follow.steps, [gradient_terms(plain.actor.cfg, tokens_of(b)) for b in batches], LR)


def test_apply_update_without_accumulate_is_an_error() -> None:
    trainer = make_trainer("token-mean", PLAIN)
    with pytest.raises(AssertionError, match="without accumulate"):
        asyncio.run(trainer.apply_update())
    with pytest.raises(AssertionError, match="without accumulate"):
        trainer.actor.apply_update()


def test_plain_step_between_accumulate_and_apply_is_an_error() -> None:
    trainer = make_trainer("token-mean", PLAIN)
    groups = ragged_groups()
    asyncio.run(trainer.accumulate_groups(groups[:2]))
    with pytest.raises(AssertionError, match="between accumulate"):
        asyncio.run(trainer.train_groups(groups[2:]))


def test_chunk_metrics_name_the_same_stages() -> None:
    trainer = make_trainer("token-mean", KL_AND_ENTROPY)
    groups = ragged_groups()
    chunk = asyncio.run(trainer.accumulate_groups(groups[:3]))
    final = asyncio.run(trainer.apply_update())
    stages = {"timing_s/old_log_prob", "timing_s/ref", "timing_s/adv", "timing_s/update_actor"}
    assert stages <= set(chunk) and stages <= set(final)
    assert final["timing_s/update_actor"] > chunk["timing_s/update_actor"]


def test_gspo_with_an_entropy_term_under_another_agg_mode_is_refused() -> None:
    trainer = make_trainer("token-mean", {"actor": {"policy_loss": "gspo", "entropy_coeff": 0.01}, "algorithm": {}})
    with pytest.raises(AssertionError, match="actor.loss_agg_mode=seq-mean-token-mean"):
        asyncio.run(trainer.accumulate_groups(ragged_groups()[:2]))


def test_simulated_stream_costs_the_chunks_now_and_one_step_at_apply() -> None:
    """One chunk holding the whole batch costs what `train_groups` does (update_seconds of one
    mini-batch and epoch = its 3x-forward pass + optimizer_step_s); the step comes at apply."""
    cfg = load_config(None, ["actor.ppo_mini_batch_size=6", "data.train_batch_size=6"])
    profile = load_profile("h20-qwen2.5-7b")
    plan = dataclasses.replace(plan_run(cfg), old_log_probs="recompute")
    groups = ragged_groups()

    async def main() -> tuple[dict[str, float], dict[str, float], dict[str, float], SimTrainer]:
        plain = await SimTrainer(cfg, profile, 8, plan).train_groups(groups)
        stream = SimTrainer(cfg, profile, 8, plan)
        chunk = await stream.accumulate_groups(groups)
        return plain, chunk, await stream.apply_update(), stream

    (plain, chunk, applied, stream), _ = run_virtual(main())
    assert set(applied) == set(plain) and stream.updates == 1
    for key, seconds in plain.items():
        assert applied[key] == pytest.approx(seconds, rel=1e-9, abs=1e-12), key
    step = applied["timing_s/update_actor"] - chunk["timing_s/update_actor"]
    assert step == pytest.approx(profile.optimizer_step_s, rel=1e-6, abs=1e-9)
    with pytest.raises(AssertionError, match="without accumulate"):
        run_virtual(stream.apply_update())
