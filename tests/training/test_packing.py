"""Padding-free packing (`model.use_remove_padding`): a micro-batch's rows as one sequence give
the padded path's log-probs, entropies, values, gradients and updates; micro-batches are planned
by real tokens; a model whose rows leak into each other is refused naming the key.

Equalities run the tiny Llama in float64 (sdpa), so the tolerances are tight; rows of 1 to 60
response tokens make the padded and packed layouts very different. Weights after optimizer steps
are compared step by step from the same state, within tests/tolerances.py's AdamW bound."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from asyncrl.algorithms import compute_advantage
from asyncrl.algorithms.logprobs import entropy_from_logits, logprobs_from_logits
from asyncrl.config.schema import ActorConfig, CriticConfig, ModelConfig
from asyncrl.errors import ConfigError
from asyncrl.training.actor import Actor, RefWorker
from asyncrl.training.batch import (
    TrainBatch,
    build_batch,
    fill_micro_batches,
    micro_batches,
    plan_micro_batches,
    row_spans,
    split_rows,
)
from asyncrl.training.critic import Critic
from asyncrl.training.logits import response_log_probs, response_logits
from asyncrl.training.lora import apply_lora
from asyncrl.training.memory import enable_gradient_checkpointing
from asyncrl.training.packed_attention import NAME
from asyncrl.training.packing import check_packing, pack, packing_tolerance, unpack
from asyncrl.types import Group
from tests.tolerances import Lockstep, assert_same_steps
from tests.training.helpers import episode_groups, gradient_terms, groups_of_lengths, make_ragged_groups, tiny_lm

TIGHT = dict(rtol=1e-10, atol=1e-12)  # float64
LR = 1e-2


def spread_groups(seed: int = 0) -> list[Group]:
    """Prompts of 1 to 9 tokens x responses of 0 to 60 (one empty): very different lengths."""
    return groups_of_lengths([1, 9, 4], [[60, 1, 0, 3], [2, 35, 1, 17], [9, 4, 48, 1]], seed)


def tail_groups(seed: int = 0) -> list[Group]:
    """One row of ~150 tokens among short ones: packed attention runs it alone, the rest together."""
    return groups_of_lengths([2, 5], [[150, 3, 1, 4], [2, 6, 1, 3]], seed)


def lm64(seed: int = 0) -> nn.Module:
    return tiny_lm(seed).double()


def train_batch(groups: list[Group]) -> TrainBatch:
    batch = build_batch(groups, pad_id=0)
    batch.advantages, _ = compute_advantage("grpo", batch.token_level_scores, batch.response_mask, batch.index)
    return batch


def test_pack_lays_rows_end_to_end_with_restarting_positions():
    # The docstring example: P = 2, T = 2, rows [pad, a | b, pad] and [c, d | e, f].
    a, b, c, d, e, f = 5, 6, 7, 8, 9, 10
    batch = TrainBatch(
        input_ids=torch.tensor([[0, a, b, 0], [c, d, e, f]]), attention_mask=torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]]),
        position_ids=torch.tensor([[0, 0, 1, 1], [0, 1, 2, 3]]), responses=torch.tensor([[b, 0], [e, f]]),
        response_mask=torch.tensor([[1.0, 0.0], [1.0, 1.0]]), loss_mask=torch.tensor([[1.0, 0.0], [1.0, 1.0]]),
        rollout_log_probs=torch.zeros(2, 2),
        token_level_scores=torch.zeros(2, 2), versions=torch.zeros(2, 2, dtype=torch.long), index=["x", "y"],
        prompt_width=2)
    p = pack(batch)
    assert p.input_ids.tolist() == [[a, b, c, d, e, f]]
    assert p.position_ids.tolist() == [[0, 1, 0, 1, 2, 3]]
    assert p.predicts.tolist() == [0, 3, 4] and p.labels.tolist() == [b, e, f]
    assert unpack(torch.tensor([1.0, 2.0, 3.0]), p).tolist() == [[1.0, 0.0], [2.0, 3.0]]


def test_a_masked_middle_segment_is_packed_attended_and_still_masked():
    """Tool text between two model turns: packed, every token is in the sequence and predicted
    like the model's, the loss mask comes back exactly, and the second turn, which reads the tool
    text, gets the padded path's log-probs; other tool tokens change them, in both layouts."""
    batch = build_batch(episode_groups(), pad_id=0)
    tool = (batch.response_mask - batch.loss_mask).bool()
    p = pack(batch)
    assert p.input_ids.shape[1] == int(batch.attention_mask.sum()) and len(p.real) == int(batch.response_mask.sum())
    assert torch.equal(unpack(p.labels, p), batch.responses * batch.response_mask.long())
    assert torch.equal(unpack(batch.loss_mask.reshape(-1).index_select(0, p.real), p), batch.loss_mask)
    model, mask = lm64(), batch.response_mask.bool()
    before = {rows: response_log_probs(model, batch, 1.0, pack=rows) for rows in (False, True)}
    torch.testing.assert_close(before[True][mask], before[False][mask], **TIGHT)
    P = batch.prompt_width
    batch.input_ids[:, P:] = torch.where(tool, 3 + (batch.input_ids[:, P:] - 2) % 29, batch.input_ids[:, P:])
    after_tool = (tool.cumsum(-1) > 0) & batch.loss_mask.bool()  # model tokens that read tool text
    assert after_tool.sum() >= 6
    for rows in (False, True):
        after = response_log_probs(model, batch, 1.0, pack=rows)
        first_turn = mask & ~(tool.cumsum(-1) > 0)
        torch.testing.assert_close(after[first_turn], before[rows][first_turn], **TIGHT)
        assert ((after - before[rows])[after_tool].abs() > 1e-6).all()


@pytest.mark.parametrize("groups", [make_ragged_groups(), spread_groups()], ids=["ragged", "spread"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_log_probs_and_entropies_equal_padded(groups, temperature):
    model, batch = lm64(), build_batch(groups, pad_id=0)
    got = {}
    for pack_rows in (False, True):
        out = response_logits(model, batch, pack=pack_rows)
        got[pack_rows] = [out.to_rows(logprobs_from_logits(out.logits, out.labels, temperature)),
                          out.to_rows(entropy_from_logits(out.logits, temperature))]
    mask = batch.response_mask.bool()
    assert got[True][0].dtype == torch.float64 and (got[True][0][~mask] == 0).all()
    for padded, packed in zip(got[False], got[True], strict=True):
        torch.testing.assert_close(packed[mask], padded[mask], **TIGHT)


@pytest.mark.parametrize("groups", [spread_groups(), tail_groups()], ids=["spread", "tail"])
def test_packed_gradients_equal_padded(groups):
    batch = build_batch(groups, pad_id=0)
    weights = torch.randn(batch.responses.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads = []
    for pack_rows in (False, True):
        model = lm64()
        out = response_logits(model, batch, pack=pack_rows)
        log_prob = out.to_rows(logprobs_from_logits(out.logits, out.labels))
        entropy = out.to_rows(entropy_from_logits(out.logits))
        ((log_prob + 0.1 * entropy) * weights * batch.response_mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0], **TIGHT)


def make_actor(pack_rows: bool, budget: int, **cfg) -> Actor:
    config = ActorConfig(ppo_micro_batch_tokens=budget, log_prob_micro_batch_tokens=budget, lr=LR, warmup_steps=0,
                         grad_clip=1e9, entropy_coeff=0.01, **cfg)
    return Actor(lm64(), config, temperature=0.8, norm_length=8, use_remove_padding=pack_rows)


@pytest.mark.parametrize("budget", [10_000, 80])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm"])
def test_packed_train_step_equals_padded(mode, budget):
    """Weights and metrics after one step (2 mini-batches, clipping, entropy and KL losses), at
    a budget that fits a mini-batch or not. Packed and padded plans differ (packed needs fewer
    micro-batches), and with them the metrics averaged per micro-batch (clip fraction, ppo_kl);
    the others are sums over micro-batches and equal."""
    batch = train_batch(spread_groups())
    batch.old_log_probs = make_actor(False, 10_000).compute_log_probs(batch) - 0.05 * batch.response_mask
    batch.ref_log_probs = batch.old_log_probs + 0.1 * batch.response_mask
    steps = []
    lead = Lockstep()  # the packed run starts each step from the padded one's weights and AdamW state
    for lock in (lead, Lockstep(leader=lead)):
        actor = make_actor(lock is not lead, budget, loss_agg_mode=mode, use_kl_loss=True, kl_loss_coef=0.1)
        lock.attach(actor.model, actor.optimizer)
        metrics = actor.train_step(batch, num_mini_batches=2)
        steps.append((dict(actor.model.named_parameters()), metrics, lock))
    (padded, padded_metrics, _), (_, packed_metrics, follow) = steps
    assert padded["model.norm.weight"].ne(1).any() and padded_metrics["actor/pg_clipfrac"] > 0  # it trained, clipped
    tokens = [int(batch.response_mask[rows].sum()) for rows in split_rows(batch.size, 2)]
    assert_same_steps(lead.steps, follow.steps, [gradient_terms(actor.cfg, n) for n in tokens], LR)  # float64 sums
    assert sorted(packed_metrics) == sorted(padded_metrics)
    for key, value in padded_metrics.items():
        if key not in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"):
            assert packed_metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_packed_lora_and_checkpointed_steps_equal_padded():
    """Packed rows through peft's LoRA wrapper, and through checkpointed layers (the backward
    recomputes each layer with the rows' boundaries)."""
    batch = train_batch(spread_groups())
    cfg = ActorConfig(ppo_micro_batch_tokens=80, lr=LR, warmup_steps=0, grad_clip=1e9)
    for prepare in (lambda m: apply_lora(m, 4, 8, ("q_proj", "v_proj")), prepared_for_checkpointing):
        lead = Lockstep()
        for lock in (lead, Lockstep(leader=lead)):
            actor = Actor(prepare(lm64()), cfg, temperature=1.0, norm_length=8, use_remove_padding=lock is not lead)
            lock.attach(actor.model, actor.optimizer)
            actor.train_step(batch, num_mini_batches=1)
        assert_same_steps(lead.steps, lock.steps, [gradient_terms(actor.cfg, int(batch.response_mask.sum()))], LR)


def prepared_for_checkpointing(model: nn.Module) -> nn.Module:
    enable_gradient_checkpointing(model)
    return model


def test_packed_old_and_ref_log_probs_equal_padded():
    batch = build_batch(spread_groups(), pad_id=0)
    want = make_actor(False, 10_000).compute_log_probs(batch)
    for budget in (10_000, 40):  # one micro-batch, or many (rows come back in order)
        torch.testing.assert_close(make_actor(True, budget).compute_log_probs(batch), want, **TIGHT)
        ref = RefWorker(lm64(), 0.8, budget, use_remove_padding=True)
        torch.testing.assert_close(ref.compute_log_probs(batch), want, **TIGHT)


def test_packed_stream_update_equals_padded():
    batch = train_batch(spread_groups())
    lead = Lockstep()
    for lock in (lead, Lockstep(leader=lead)):
        actor = make_actor(lock is not lead, 60)
        lock.attach(actor.model, actor.optimizer)
        for rows in ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11]):
            actor.accumulate(batch.select(rows))
        actor.apply_update()
    assert_same_steps(lead.steps, lock.steps, [gradient_terms(actor.cfg, int(batch.response_mask.sum()))], LR)


def test_packed_critic_values_and_update_equal_padded():
    batch = build_batch(spread_groups(), pad_id=0)
    values, grads = [], []
    for pack_rows in (False, True):
        critic = Critic(lm64(), CriticConfig(lr=1e-2), micro_batch_tokens=50, forward_micro_batch_tokens=50,
                        loss_agg_mode="token-mean", use_remove_padding=pack_rows)
        torch.manual_seed(1)
        nn.init.normal_(critic.model.head.weight)  # the zero-initialised head would make every value 0
        critic.model.double()
        batch.values = critic.compute_values(batch)
        batch.returns = batch.values + batch.response_mask * torch.linspace(-1, 1, batch.size)[:, None]
        critic.train_step(batch, num_mini_batches=1)
        values.append(batch.values)
        grads.append(torch.cat([p.grad.flatten() for p in critic.model.parameters()]))
    assert values[0].abs().sum() > 0
    torch.testing.assert_close(values[1], values[0], **TIGHT)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-9)  # the value head's output is float32


def test_bf16_packed_log_probs_track_float32():
    batch = build_batch(spread_groups(), pad_id=0)
    want = Actor(tiny_lm(), ActorConfig(), temperature=1.0, norm_length=8, use_remove_padding=False)
    got = Actor(tiny_lm(), ActorConfig(), temperature=1.0, norm_length=8, compute_dtype=torch.bfloat16,
                use_remove_padding=True)
    torch.testing.assert_close(got.compute_log_probs(batch), want.compute_log_probs(batch), rtol=0.05, atol=0.05)


def test_packed_plan_counts_real_tokens():
    # plan_micro_batches' example: padded, [20 x 3] + [100] (260) beats 4 x 100 + 50 (450); packed,
    # the four rows are 160 real tokens: one micro-batch.
    prompts, responses = [16] * 4, [84, 4, 4, 4]
    assert plan_micro_batches(prompts, responses, 1000, overhead=50) == [[1, 2, 3], [0]]
    assert plan_micro_batches(prompts, responses, 1000, overhead=50, packed=True) == [[0, 1, 2, 3]]
    # Budget 160: padded, 4 x 100 is over it; packed, 160 is not. 159: the last 20 spills over.
    assert plan_micro_batches(prompts, responses, 160, overhead=50) == [[1, 2, 3], [0]]
    assert plan_micro_batches(prompts, responses, 160, packed=True) == [[0, 1, 2, 3]]
    assert plan_micro_batches(prompts, responses, 159, packed=True) == [[0, 1, 2], [3]]


def test_fill_micro_batches_is_first_fit_decreasing():
    assert fill_micro_batches([60, 50, 40, 30, 20], 100) == [[0, 2], [1, 3, 4]]  # the docstring example
    # Consecutive runs of the sorted lengths would need 3: [20, 30, 40], [50], [60]; so would
    # first fit in the given order: [20, 60], [30, 50], [40].
    assert fill_micro_batches([20, 60, 30, 50, 40], 100) == [[1, 4], [3, 2, 0]]
    assert fill_micro_batches([300, 10, 10], 100) == [[0], [1, 2]]  # a row over the budget runs alone
    assert fill_micro_batches([], 100) == []


def test_packed_micro_batches_stay_within_the_budget_of_real_tokens():
    batch = build_batch(spread_groups(), pad_id=0)
    lengths = (batch.attention_mask != 0).sum(-1)
    prompt_B, response_B = row_spans(batch)
    assert torch.equal(prompt_B + response_B, lengths + (lengths == prompt_B))  # the empty response counts 1
    padded, packed = list(micro_batches(batch, 80)), list(micro_batches(batch, 80, packed=True))
    assert len(packed) < len(padded)
    for rows, mb in packed:
        assert len(rows) == 1 or int(lengths[rows].sum()) <= 80
        assert mb.attention_mask.sum() == lengths[rows].sum()
    assert sorted(r for rows, _ in packed for r in rows) == list(range(batch.size))


class PositionBlindLM(nn.Module):
    """A causal LM that ignores `position_ids`: packed rows would attend to each other."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = tiny_lm()

    def get_input_embeddings(self) -> nn.Module:
        return self.lm.get_input_embeddings()

    def forward(self, input_ids, position_ids=None, **kwargs):
        return self.lm(input_ids=input_ids, **kwargs)


class NoPositionsLM(PositionBlindLM):
    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache)


@pytest.mark.parametrize("model", [PositionBlindLM, NoPositionsLM])
def test_a_model_that_cannot_pack_is_refused_naming_the_key(model):
    with pytest.raises(ConfigError, match=r"model.use_remove_padding=true: .*; set model.use_remove_padding=false"):
        Actor(model(), ActorConfig(), temperature=1.0, norm_length=4, use_remove_padding=True)
    Actor(model(), ActorConfig(), temperature=1.0, norm_length=4, use_remove_padding=False)
    check_packing(tiny_lm())
    check_packing(tiny_lm().model, logits=False)


class RowDependentRoundingLM(PositionBlindLM):
    """A bf16 LM whose packed call rounds differently from a row alone (one or two bf16 ulps), as
    row-dependent cuBLAS kernels do; it packs correctly."""

    def forward(self, input_ids, position_ids=None, **kwargs):
        out = self.lm(input_ids=input_ids, position_ids=position_ids, **kwargs)
        if len(kwargs.get("cu_seq_lens_q", ())) > 2:  # two rows packed
            out.logits = (out.logits.float() * (1 + 2**-8)).to(out.logits.dtype)
        return out


def test_check_packing_allows_bf16_rounding_and_still_refuses_rows_that_attend_to_each_other():
    assert packing_tolerance(torch.float32) == 1e-3 and packing_tolerance(torch.bfloat16) == 4 * 2**-7
    check_packing(RowDependentRoundingLM().to(torch.bfloat16))
    with pytest.raises(ConfigError, match="lets packed rows attend to each other"):
        check_packing(PositionBlindLM().to(torch.bfloat16))


def test_workers_that_pack_run_packed_attention():
    """Each row's attention alone (tests/training/test_packed_attention.py), not a dense mask."""
    assert make_actor(True, 100).model.config._attn_implementation == NAME
    assert RefWorker(lm64(), 1.0, 100, use_remove_padding=True).model.config._attn_implementation == NAME
    critic = Critic(lm64(), CriticConfig(), micro_batch_tokens=100, forward_micro_batch_tokens=200,
                    loss_agg_mode="token-mean", use_remove_padding=True)
    assert critic.model.body.config._attn_implementation == NAME
    assert make_actor(False, 100).model.config._attn_implementation == "sdpa"


def test_workers_pack_by_default():
    assert ModelConfig().use_remove_padding
    assert Actor(tiny_lm(), ActorConfig(), temperature=1.0, norm_length=4).pack
    assert RefWorker(tiny_lm(), 1.0, 100).pack
    assert Critic(tiny_lm(), CriticConfig(), micro_batch_tokens=100, forward_micro_batch_tokens=200,
                  loss_agg_mode="token-mean").model.pack
