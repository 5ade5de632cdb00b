"""Mixed precision as FSDP2 does it, in one process (`model.mixed_precision=param_dtype`,
`asyncrl.training.precision`): the linear layers receive bf16 weights and activations in the
forward and bf16 gradients in the backward; masters, their gradients and AdamW's state are
float32; one step tracks the float32 step within bounds derived from bf16 rounding; checkpoints
hold the float32 masters and resume exactly; LoRA, the reference and the critic take the path;
which path runs is what the config resolves. On the CPU (bf16 matmuls run there); tests/gpu
repeats the path choice and the memory on CUDA."""

from __future__ import annotations

import torch
from torch import nn

from asyncrl.config.schema import ActorConfig, CriticConfig
from asyncrl.state_io import load_state
from asyncrl.training.actor import Actor, RefWorker
from asyncrl.training.critic import Critic
from asyncrl.training.lora import apply_lora
from asyncrl.training.precision import MasterWeights
from tests.tolerances import adamw_weight_bound, assert_within, eps_of
from tests.training.helpers import make_groups, tiny_lm
from tests.training.test_actor import prepared_batch

BF16 = torch.bfloat16
CFG = ActorConfig(lr=1e-2, warmup_steps=0, grad_clip=1e9, entropy_coeff=0.01)
# Roundings to bf16 along the tiny model's forward (2 layers): per layer the two norms, q, k, v,
# rotary, attention, o_proj, gate, up, silu x up, down, the two residual adds (14); plus the
# embedding, the final norm and the head. Each rounds to bf16 (relative error <= eps/2) and
# normalised layers pass an error on with a gain of about 1, so an output of size s is within
# STAGES x eps x s of the float32 one (the backward's matmuls round as many times).
STAGES = 2 * 14 + 3


def bf16_actor(model: nn.Module) -> Actor:
    return Actor(model, CFG, temperature=1.0, norm_length=4, compute_dtype=BF16, mixed_precision="param_dtype")


def test_the_linear_layers_run_bf16_forward_and_backward_over_float32_masters():
    model = tiny_lm()
    actor = bf16_actor(model)
    assert actor.precision.path == "param_dtype" and isinstance(actor.weights, MasterWeights)
    seen: set[tuple[str, torch.dtype]] = set()
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.register_forward_pre_hook(lambda mod, args: seen.update({("weight", mod.weight.dtype),
                                                                       ("input", args[0].dtype)}))
            m.register_full_backward_hook(lambda mod, g_in, g_out: seen.add(("grad", g_out[0].dtype)))
    batch = prepared_batch(model, make_groups(), actor)
    assert seen == {("weight", BF16), ("input", BF16)}  # the log-prob pass
    actor.train_step(batch, num_mini_batches=1)
    assert seen == {("weight", BF16), ("input", BF16), ("grad", BF16)}
    masters = actor.weights.masters
    assert all(m.dtype == torch.float32 for m in masters) and all(p.dtype == BF16 for p in model.parameters())
    assert all(m.grad is not None and m.grad.dtype == torch.float32 for m in actor.weights.trainable())
    assert all(p.grad is None for p in model.parameters())  # folded into the masters as they came
    state = [s for s in actor.optimizer.state.values() if "exp_avg" in s]
    assert len(state) == len(masters) and all(s["exp_avg_sq"].dtype == torch.float32 for s in state)
    for p, m in zip(actor.weights.params, masters, strict=True):  # the working copy is the masters rounded
        assert torch.equal(p, m.to(BF16))
    assert not any(b.dtype == BF16 for b in model.buffers())  # buffers (rotary frequencies) stay float32


def test_auto_is_param_dtype_on_the_cpu_and_float32_has_no_path():
    assert Actor(tiny_lm(), CFG, temperature=1.0, norm_length=4, compute_dtype=BF16).precision.path == "param_dtype"
    assert Actor(tiny_lm(), CFG, temperature=1.0, norm_length=4, compute_dtype=BF16,
                 mixed_precision="autocast").precision.path == "autocast"
    assert Actor(tiny_lm(), CFG, temperature=1.0, norm_length=4, mixed_precision="param_dtype").precision.path == \
        "float32"
    ref = RefWorker(tiny_lm(), 1.0, 1000, compute_dtype=BF16)
    assert ref.precision.path == "param_dtype" and all(p.dtype == BF16 for p in ref.model.parameters())


def test_one_step_tracks_the_float32_step_within_bf16_rounding():
    groups = make_groups(2, 4)
    ref_model, model = tiny_lm(), tiny_lm()
    ref = Actor(ref_model, CFG, temperature=1.0, norm_length=4)
    actor = bf16_actor(model)
    batch = prepared_batch(ref_model, groups, ref)
    got_lp, want_lp = actor.compute_log_probs(batch), batch.old_log_probs
    logits = ref_model(input_ids=batch.input_ids).logits
    # log p_y = z_y - lse(z): twice the logits' error
    assert_within(got_lp, want_lp, 2 * STAGES * eps_of(BF16) * float(logits.abs().max()), "log-probs")
    assert not torch.equal(got_lp, want_lp)
    before = [p.detach().clone() for p in ref_model.parameters()]
    ref.train_step(batch, num_mini_batches=1)
    actor.train_step(batch, num_mini_batches=1)
    for w0, p, m in zip(before, ref_model.parameters(), actor.weights.masters, strict=True):
        assert p.grad is not None and m.grad is not None
        grad_error = 2 * STAGES * eps_of(BF16) * float(p.grad.abs().max())
        assert_within(m.grad, p.grad, grad_error, "gradients")
        assert_within(m.detach(), p.detach(), adamw_weight_bound(w0, p.grad, grad_error, CFG.lr), "weights")


def test_checkpoints_hold_the_float32_masters_and_resume_exactly(tmp_path):
    from transformers import AutoModelForCausalLM

    groups = make_groups()
    actor = bf16_actor(tiny_lm())
    batch = prepared_batch(actor.model, groups, actor)
    actor.train_step(batch, num_mini_batches=1)
    actor.save(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    for (name, p), m in zip(loaded.named_parameters(), actor.weights.masters, strict=True):
        assert torch.equal(p, m), name
    resumed = bf16_actor(tiny_lm(seed=1))
    resumed.load(tmp_path)
    for a in (actor, resumed):
        a.train_step(batch, num_mini_batches=1)
    for p, q in zip(actor.weights.masters + actor.weights.params, resumed.weights.masters + resumed.weights.params,
                    strict=True):
        assert torch.equal(p, q)
    # the engines get the masters cast once, as on the autocast path
    exported = actor.named_weights()
    assert all(t.dtype == BF16 for t in exported.values())
    assert torch.equal(exported["model.embed_tokens.weight"], actor.weights.masters[0].to(BF16))


def test_lora_trains_its_adapters_and_exports_what_autocast_would(tmp_path):
    base = tiny_lm()
    actor = bf16_actor(apply_lora(tiny_lm(), 4, 8, ("all-linear",)))
    frozen = {id(m): m.detach().clone() for m in actor.weights.masters if not m.requires_grad}
    assert frozen and len(actor.weights.trainable()) < len(actor.weights.masters)
    batch = prepared_batch(base, make_groups(), actor)
    for _ in range(2):
        actor.train_step(batch, num_mini_batches=1)
    assert all(torch.equal(m, frozen[id(m)]) for m in actor.weights.masters if not m.requires_grad)
    actor.save(tmp_path)
    autocast = Actor(apply_lora(tiny_lm(), 4, 8, ("all-linear",)), CFG, temperature=1.0, norm_length=4,
                     compute_dtype=BF16, mixed_precision="autocast")
    autocast.load(tmp_path)  # the same float32 adapters, from the bf16 path's checkpoint
    got, want = actor.named_weights(), autocast.named_weights()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


def test_the_critic_trains_bf16_over_float32_masters_and_checkpoints_them(tmp_path):
    groups = make_groups()
    critic = Critic(tiny_lm(), CriticConfig(), micro_batch_tokens=1000, forward_micro_batch_tokens=1000,
                    loss_agg_mode="token-mean", compute_dtype=BF16, mixed_precision="param_dtype")
    assert all(p.dtype == BF16 for p in critic.model.parameters())
    batch = prepared_batch(tiny_lm(), groups, Actor(tiny_lm(), CFG, temperature=1.0, norm_length=4))
    batch.values = critic.compute_values(batch)
    assert batch.values.dtype == torch.float32
    batch.returns = batch.values + batch.response_mask
    critic.train_step(batch, num_mini_batches=1)
    critic.save(tmp_path)
    saved = load_state(tmp_path / "critic_state.json")["model"]
    assert all(t.dtype == torch.float32 for t in saved.values())
    masters = critic.weights.masters
    assert torch.equal(saved["head.weight"], masters[-2]) and masters[-2].abs().sum() > 0


def test_micro_batch_gradients_accumulate_in_float32():
    """Two backwards into a bf16 layer: the master's gradient is the float32 sum of the two bf16
    gradients, exactly (a bf16 accumulation would round the sum to 8 bits)."""
    layer = nn.Linear(4, 1, bias=False)
    weights = MasterWeights(layer, BF16)
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0]], dtype=BF16)
    grads = []
    for scale in (1.0, 2.0**-9):  # the second is below the first's bf16 resolution
        (layer(x * scale).sum()).backward()
        grads.append(torch.full((1, 4), scale))
    (master,) = weights.trainable()
    assert master.grad is not None and torch.equal(master.grad, grads[0] + grads[1])
    assert torch.equal((grads[0] + grads[1]).to(BF16), grads[0].to(BF16))  # what bf16 would have kept
