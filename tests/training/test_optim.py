"""AdamW: the fused kernel where torch has one, same steps as the for-loop implementation, and
checkpoints loadable either way."""

from __future__ import annotations

import copy

import torch

from asyncrl.training.optim import LRSchedule, make_optimizer
from tests.training.helpers import tiny_lm


def steps(opt: torch.optim.Optimizer, model: torch.nn.Module, n: int) -> None:
    for k in range(n):
        for i, p in enumerate(model.parameters()):
            p.grad = torch.sin(torch.arange(p.numel(), dtype=p.dtype) + i + k).reshape(p.shape)
        opt.step()


def test_fused_adamw_steps_like_the_for_loop_one_and_loads_its_checkpoint():
    fused_model, plain_model = tiny_lm(), tiny_lm()
    fused, _ = make_optimizer(fused_model, 1e-2, 0.1, (0.9, 0.99), LRSchedule())
    assert fused.defaults["fused"]  # CPU has the fused kernel since torch 2.4
    plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99),
                              foreach=False)
    steps(fused, fused_model, 3)
    steps(plain, plain_model, 3)
    for a, b in zip(fused_model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert fused.state_dict()["state"].keys() == plain.state_dict()["state"].keys()
    assert fused.state_dict()["state"][0].keys() == plain.state_dict()["state"][0].keys()
    resumed_model = tiny_lm(seed=1)
    resumed_model.load_state_dict(plain_model.state_dict())
    resumed, _ = make_optimizer(resumed_model, 1e-2, 0.1, (0.9, 0.99), LRSchedule())
    resumed.load_state_dict(copy.deepcopy(plain.state_dict()))  # as from a file: no shared step tensors
    steps(resumed, resumed_model, 2)
    steps(plain, plain_model, 2)
    for a, b in zip(resumed_model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
