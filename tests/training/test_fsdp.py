"""FSDP2 data parallelism: an actor on 2 CPU ranks (gloo) trains, computes log-probs, streams
gradients and checkpoints exactly as the single-process actor does on the same batch, with
padded or packed (`use_remove_padding`) micro-batches; and under `model.mixed_precision=param_dtype`
(FSDP2's `MixedPrecisionPolicy`) the layers compute in bf16 over float32 shards, within bf16
rounding of the single-process bf16-parameter step.

The ranks run in spawned processes; rank 0 writes what it sees to a file, the test compares it
with a single-process actor here, which follows the ranks step by step (each of its steps starts
from their weights and AdamW state, tests/tolerances.py's `Lockstep`). A rank that fails, or
ranks that wait on each other, end the test (gloo timeout, then a deadline on the whole group)
instead of hanging it.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from asyncrl.algorithms import compute_advantage
from asyncrl.config.schema import ActorConfig
from asyncrl.training import fsdp
from asyncrl.training.actor import Actor
from asyncrl.training.batch import TrainBatch, build_batch, micro_batches, split_rows
from asyncrl.training.logits import response_log_probs
from asyncrl.training.lora import apply_lora
from tests.tolerances import (
    Lockstep,
    StepRecord,
    adamw_weight_bound,
    assert_same_steps,
    assert_within,
    clip_error,
    eps_of,
    full,
    state_dicts,
)
from tests.training.helpers import gradient_terms, make_ragged_groups, tiny_lm

WORLD = 2
BUDGET = 30  # tokens per micro-batch: 1 to 4 rows of the ragged batch, so shares are uneven or empty
CONFIGS = {  # no clipping / clipping, entropy and KL losses
    "token-mean": dict(loss_agg_mode="token-mean", grad_clip=1e9),
    "seq-mean-token-sum-norm": dict(loss_agg_mode="seq-mean-token-sum-norm", grad_clip=0.05,
                                    use_kl_loss=True, kl_loss_coef=0.1),
}


LR = 1e-2


def actor_config(name: str) -> ActorConfig:
    return ActorConfig(ppo_micro_batch_tokens=BUDGET, log_prob_micro_batch_tokens=BUDGET, lr=LR, warmup_steps=0,
                       weight_decay=0.01, entropy_coeff=0.01, **CONFIGS[name])


def make_actor(name: str, pack: bool = False) -> Actor:
    return Actor(tiny_lm(), actor_config(name), temperature=1.0, norm_length=4, use_remove_padding=pack)


def prepared_batch() -> TrainBatch:
    groups = make_ragged_groups()
    batch = build_batch(groups, pad_id=0)
    with torch.no_grad():
        log_probs = response_log_probs(tiny_lm(), batch, 1.0) * batch.response_mask
    batch.old_log_probs = log_probs - 0.05 * batch.response_mask  # ratios != 1: clipping matters
    batch.ref_log_probs = log_probs + 0.1 * batch.response_mask
    batch.advantages, _ = compute_advantage("grpo", batch.token_level_scores, batch.response_mask, batch.index)
    return batch


def halves(batch: TrainBatch) -> list[TrainBatch]:
    return [batch.select(rows) for rows in split_rows(batch.size, 2)]


def copied(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: w.clone() for name, w in weights.items()}  # one process: views of the live weights


def lockstep(actor: Actor, key: str, out: dict[str, Any], leaders: dict[str, Lockstep] | None, offset: int = 0) -> None:
    """The ranks lead, recording each step in full; the single process follows them, each step
    from the ranks' weights and AdamW state (tests/tolerances.py), in `out["locks"][key]`."""
    lock = Lockstep() if leaders is None else Lockstep(leader=leaders[key], offset=offset)
    lock.attach(actor.model, actor.optimizer, save=fsdp.full_state_dicts if actor.sharded else state_dicts)
    out.setdefault("locks", {})[key] = lock


def run_actor(batch: TrainBatch, ckpt: Path, leaders: dict[str, Lockstep] | None = None) -> dict[str, Any]:
    """Everything compared, on any number of ranks (collective calls on all of them); `leaders`:
    the ranks' steps, which a single process follows."""
    out: dict[str, Any] = {}
    for name in CONFIGS:
        actor = make_actor(name)
        lockstep(actor, name, out, leaders)
        metrics = actor.train_step(batch, num_mini_batches=2)
        out[name] = {"weights": copied(actor.named_weights()), "log_probs": actor.compute_log_probs(batch),
                     "metrics": metrics}
    packed = make_actor("token-mean", pack=True)
    lockstep(packed, "packed", out, leaders)
    out["packed"] = {"log_probs_before": packed.compute_log_probs(batch),
                     "metrics": packed.train_step(batch, num_mini_batches=2)}
    out["packed"] |= {"weights": copied(packed.named_weights()), "log_probs": packed.compute_log_probs(batch)}
    for chunk in halves(batch):
        packed.accumulate(chunk)
    out["packed"] |= {"stream_metrics": packed.apply_update(), "stream_weights": copied(packed.named_weights())}
    stream = make_actor("token-mean")
    lockstep(stream, "stream", out, leaders)
    for chunk in halves(batch):
        stream.accumulate(chunk)
    metrics = stream.apply_update()
    out["stream"] = {"weights": copied(stream.named_weights()), "metrics": metrics}
    stream.save(ckpt)
    stream.train_step(batch, num_mini_batches=2)  # a step from the saved state, to compare a resume with
    out["after_save"] = copied(stream.named_weights())
    return out


def _rank_main(rank: int, port: int, batch: TrainBatch, tmp: Path) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        out = run_actor(batch, tmp / "sharded")
        resumed = make_actor("token-mean")
        resumed.load(tmp / "sharded")
        out["loaded"] = copied(resumed.named_weights())
        resumed.train_step(batch, num_mini_batches=2)
        out["resumed"] = resumed.named_weights()
        out["bf16"] = bf16_step(batch)
        with pytest.raises(AssertionError, match="LoRA with FSDP"):
            Actor(apply_lora(tiny_lm(), 4, 8, ("q_proj",)), ActorConfig(), temperature=1.0, norm_length=4)
        if rank == 0:
            torch.save(out, tmp / "rank0.pt")
    finally:
        dist.destroy_process_group()


def bf16_step(batch: TrainBatch) -> dict[str, Any]:
    """One step of a "param_dtype" actor (sharded or not): the dtypes its linear layers saw, of
    its parameters and AdamW state, and its float32 weights and gradients before and after."""
    model = tiny_lm()
    actor = Actor(model, actor_config("token-mean"), temperature=1.0, norm_length=4, compute_dtype=torch.bfloat16,
                  mixed_precision="param_dtype")
    seen: set[torch.dtype] = set()
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_pre_hook(lambda mod, args: seen.update({mod.weight.dtype, args[0].dtype}))
    masters = actor._trainable()  # the optimizer's: FSDP2 may leave the root's gathered bf16 ones in place
    before = [full(p).detach().clone() for p in masters]
    actor.train_step(batch, num_mini_batches=1)
    state = {s["exp_avg"].dtype for s in actor.optimizer.state.values()}
    return {"seen": seen, "masters": {p.dtype for p in masters}, "state": state, "before": before,
            "grads": [full(p.grad) for p in masters], "after": [full(p).detach() for p in masters]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(batch: TrainBatch, tmp: Path, deadline_s: float = 240.0) -> dict[str, Any]:
    group = mp.spawn(_rank_main, args=(free_port(), batch, tmp), nprocs=WORLD, join=False)
    end = time.monotonic() + deadline_s
    while not group.join(timeout=1):  # raises if a rank failed
        if time.monotonic() > end:
            for proc in group.processes:
                proc.kill()
            pytest.fail(f"FSDP ranks still running after {deadline_s} s")
    return torch.load(tmp / "rank0.pt", weights_only=False)


def mini_batch_tokens(batch: TrainBatch) -> list[int]:
    """Response tokens of each of `train_step`'s 2 mini-batches."""
    return [int(batch.response_mask[rows].sum()) for rows in split_rows(batch.size, 2)]


def assert_same_steps_as_ranks(sharded: list[StepRecord], single: list[StepRecord], name: str,
                               tokens_S: list[int]) -> None:
    """Each step from the same weights and state: gradients summed over the ranks within their
    float32 summation bound (any grouping of the same tokens), the clip factor's rounding where
    the clip is on; weights within what AdamW makes of that (tests/tolerances.py)."""
    cfg = actor_config(name)
    terms_S = [gradient_terms(cfg, n) for n in tokens_S]
    relative = clip_error(torch.float32, sharded[0].grad.numel(), max(terms_S)) if cfg.grad_clip < 1e9 else 0.0
    assert_same_steps(sharded, single, terms_S, LR, relative)


def assert_equal_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Bit for bit: a load, or the same computation on the same ranks from the same state."""
    assert list(got) == list(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)


def assert_same_metrics(got: dict[str, float], want: dict[str, float]) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """(2 ranks, 1 process) on the same batch; the directory with both checkpoints."""
    tmp = tmp_path_factory.mktemp("fsdp")
    batch = prepared_batch()
    sharded = run_ranks(batch, tmp)
    return sharded, run_actor(batch, tmp / "single", leaders=sharded["locks"]), tmp


def test_the_batch_gives_ranks_uneven_and_empty_shares():
    batch = prepared_batch()
    sizes = [len(rows) for half in halves(batch) for rows, _ in micro_batches(half, BUDGET)]
    assert 1 in sizes and any(n > WORLD and n % WORLD for n in sizes), sizes


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sharded_train_step_equals_single_process(runs, name):
    sharded, single, _ = runs
    assert_same_steps_as_ranks(sharded["locks"][name].steps, single["locks"][name].steps, name,
                               mini_batch_tokens(prepared_batch()))
    torch.testing.assert_close(sharded[name]["log_probs"], single[name]["log_probs"], rtol=1e-5, atol=1e-6)
    assert_same_metrics(sharded[name]["metrics"], single[name]["metrics"])
    assert single[name]["weights"]["model.norm.weight"].ne(1).any()  # it trained
    if name == "seq-mean-token-sum-norm":
        assert single[name]["metrics"]["actor/grad_norm"] > 0.05  # the clip is active


def test_sharded_packed_steps_equal_single_process(runs):
    """Packed rows on 2 ranks: log-probs, a train step and a stream update as in one process;
    and packed log-probs equal the padded ones."""
    sharded, single, _ = runs
    for key in ("log_probs_before", "log_probs"):
        torch.testing.assert_close(sharded["packed"][key], single["packed"][key], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(single["packed"]["log_probs_before"], prepared_batch().old_log_probs + 0.05 *
                               prepared_batch().response_mask, rtol=1e-5, atol=1e-6)
    batch = prepared_batch()
    tokens_S = [*mini_batch_tokens(batch), int(batch.response_mask.sum())]  # train_step's 2, the stream's 1
    assert_same_steps_as_ranks(sharded["locks"]["packed"].steps, single["locks"]["packed"].steps, "token-mean",
                               tokens_S)
    for key in ("metrics", "stream_metrics"):
        assert_same_metrics(sharded["packed"][key], single["packed"][key])


def test_sharded_stream_update_equals_single_process(runs):
    sharded, single, _ = runs
    tokens = int(prepared_batch().response_mask.sum())
    assert_same_steps_as_ranks(sharded["locks"]["stream"].steps[:1], single["locks"]["stream"].steps[:1],
                               "token-mean", [tokens])
    assert_same_metrics(sharded["stream"]["metrics"], single["stream"]["metrics"])


def test_sharded_checkpoint_round_trips(runs):
    """Sharded save -> sharded load resumes exactly (weights and optimizer: the next step is the
    same), and a single-process actor loads the same checkpoint."""
    sharded, single, tmp = runs
    assert_equal_weights(sharded["loaded"], sharded["stream"]["weights"])
    assert_equal_weights(sharded["resumed"], sharded["after_save"])
    lead, tokens_S = sharded["locks"]["stream"].steps[1:], mini_batch_tokens(prepared_batch())
    assert_same_steps_as_ranks(lead, single["locks"]["stream"].steps[1:], "token-mean", tokens_S)
    actor = make_actor("token-mean")
    actor.load(tmp / "sharded")
    assert_equal_weights(actor.named_weights(), sharded["stream"]["weights"])
    loaded: dict[str, Any] = {}
    lockstep(actor, "stream", loaded, sharded["locks"], offset=1)  # the ranks' steps after the save
    actor.train_step(prepared_batch(), num_mini_batches=2)
    assert_same_steps_as_ranks(lead, loaded["locks"]["stream"].steps, "token-mean", tokens_S)


def test_sharded_bf16_parameters_step_within_bf16_rounding_of_one_process(runs):
    """FSDP2's policy: bf16 layers over float32 shards and AdamW state; the step within the
    bf16 rounding bound of tests/training/test_mixed_precision.py of the one-process path."""
    from tests.training.test_mixed_precision import STAGES

    sharded, single = runs[0]["bf16"], bf16_step(prepared_batch())
    assert sharded["seen"] == {torch.bfloat16} and sharded["masters"] == sharded["state"] == {torch.float32}
    for w0, g, w, got_g, got_w in zip(single["before"], single["grads"], single["after"], sharded["grads"],
                                      sharded["after"], strict=True):
        error = 2 * STAGES * eps_of(torch.bfloat16) * float(g.abs().max())
        assert_within(got_g, g, error, "gradients")
        assert_within(got_w, w, adamw_weight_bound(w0, g, error, LR), "weights")
