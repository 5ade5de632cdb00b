"""AdamW: the fused kernel where torch has one, same steps as the for-loop implementation, and
checkpoints loadable either way."""

from __future__ import annotations

import copy

import torch

from asyncrl.training.optim import LRSchedule, make_optimizer
from tests.tolerances import adam_ratio_bound, adamw_rounding, assert_within, eps_of
from tests.training.helpers import tiny_lm

LR, WEIGHT_DECAY, BETAS = 1e-2, 0.1, (0.9, 0.99)


def steps(opt: torch.optim.Optimizer, model: torch.nn.Module, n: int) -> None:
    for k in range(n):
        for i, p in enumerate(model.parameters()):
            p.grad = torch.sin(torch.arange(p.numel(), dtype=p.dtype) + i + k).reshape(p.shape)
        opt.step()


def rounding_bound(weights: torch.Tensor, steps: range) -> torch.Tensor:
    """Two AdamW kernels, the same gradients: per step, the update's and the new weight's rounding
    (`adamw_rounding`), the decay product's in each kernel (eps |w|), and m and v's own roundings
    (about 5 per step each, so <= ~2t eps of the update at step t). Summed over the steps: the
    gradients do not depend on the weights here, so a difference does not compound."""
    eps = eps_of(weights.dtype)
    return sum((adamw_rounding(weights, LR, t, BETAS) + eps * weights.double().abs()
                + 4 * t * eps * LR * adam_ratio_bound(t, BETAS) for t in steps), torch.zeros(()))


def assert_same_weights(got: torch.nn.Module, want: torch.nn.Module, steps: range) -> None:
    for a, b in zip(got.parameters(), want.parameters(), strict=True):
        assert_within(a.detach(), b.detach(), rounding_bound(b.detach(), steps), f"steps {steps}")


def test_fused_adamw_steps_like_the_for_loop_one_and_loads_its_checkpoint():
    fused_model, plain_model = tiny_lm(), tiny_lm()
    fused, _ = make_optimizer(list(fused_model.parameters()), LR, WEIGHT_DECAY, BETAS, LRSchedule())
    assert fused.defaults["fused"]  # CPU has the fused kernel since torch 2.4
    plain = torch.optim.AdamW(plain_model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS, foreach=False)
    steps(fused, fused_model, 3)
    steps(plain, plain_model, 3)
    assert_same_weights(fused_model, plain_model, range(1, 4))
    assert fused.state_dict()["state"].keys() == plain.state_dict()["state"].keys()
    assert fused.state_dict()["state"][0].keys() == plain.state_dict()["state"][0].keys()
    resumed_model = tiny_lm(seed=1)
    resumed_model.load_state_dict(plain_model.state_dict())
    resumed, _ = make_optimizer(list(resumed_model.parameters()), LR, WEIGHT_DECAY, BETAS, LRSchedule())
    resumed.load_state_dict(copy.deepcopy(plain.state_dict()))  # as from a file: no shared step tensors
    steps(resumed, resumed_model, 2)
    steps(plain, plain_model, 2)
    assert_same_weights(resumed_model, plain_model, range(4, 6))  # from the same weights and state
