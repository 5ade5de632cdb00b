"""tests/tolerances.py: each bound holds against the computation it bounds (sums in other orders,
torch's AdamW on perturbed gradients) and is reached where it says so; `Lockstep` hands the
leader's state to the follower after every step."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.tolerances import (
    Lockstep,
    adam_ratio_bound,
    adamw_rounding,
    adamw_step_error,
    assert_within,
    clip_error,
    first_step_error,
    sum_error,
)


def test_sum_error_covers_float32_sums_in_any_order():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * torch.rand(4096, generator=gen) ** 4  # magnitudes over decades
    exact = x.double().sum()
    bound = sum_error(torch.float32, x.numel(), float(x.double().abs().sum()))
    assert sum_error(torch.float32, 60, 0.3) == pytest.approx(60 * 2**-23 * 0.3, rel=1e-12, abs=0)
    for seed in range(5):
        perm = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(seed))
        y = x[perm]
        sequential = torch.zeros((), dtype=torch.float32)
        for v in y[:512]:  # one term at a time: the longest chain of roundings
            sequential = sequential + v
        groupings = (y.view(64, 64).sum(0).sum(), y.view(8, 512).sum(1).flip(0).sum(), sequential + y[512:].sum())
        for total in (y.sum(), *groupings):
            assert abs(float(total) - float(exact)) <= bound


def test_clip_error_covers_two_runs_clip_factors():
    gen = torch.Generator().manual_seed(1)
    n, terms = 20_000, 100
    g = torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 3
    error = sum_error(torch.float32, terms, float(g.abs().max()))
    other = g + (torch.rand(n, generator=gen) * 2 - 1) * error  # another run's gradient, within its bound

    def factor(x: torch.Tensor, chunks: int) -> torch.Tensor:  # max_norm / (||x|| + 1e-6), summed in chunks
        squares = torch.stack([(c * c).sum() for c in x.chunk(chunks)]).sum()
        return 0.05 / (squares.sqrt() + 1e-6)

    one_run = factor(g, 1)
    bound = clip_error(torch.float32, n, terms) * float(one_run)
    for another_run in (factor(g, 64), factor(other, 7), 0.05 / (torch.linalg.vector_norm(other) + 1e-6)):
        assert abs(float(another_run) - float(one_run)) <= bound


def adamw_after_one_step(weight: torch.Tensor, grad: torch.Tensor, lr: float,
                         state: dict | None = None) -> torch.Tensor:
    p = nn.Parameter(weight.clone())
    opt = torch.optim.AdamW([p], lr=lr, weight_decay=0.0, foreach=False)
    if state is not None:
        opt.load_state_dict({"state": {0: copy.deepcopy(state)}, "param_groups": opt.state_dict()["param_groups"]})
    p.grad = grad.clone()
    opt.step()
    return p.detach()


def test_first_step_error_is_the_largest_change_over_the_interval_and_is_reached():
    lr, err = 1e-3, 1e-6
    g = torch.tensor([0.0, 3e-9, -2e-8, 5e-7, 2e-6, -1e-4, 0.1], dtype=torch.float64)
    w = torch.zeros_like(g)
    bound = first_step_error(g, err, lr)
    base = adamw_after_one_step(w, g, lr)
    worst = torch.zeros_like(g)
    for delta in torch.linspace(-err, err, 41, dtype=torch.float64):
        worst = torch.maximum(worst, (adamw_after_one_step(w, g + delta, lr) - base).abs())
    assert (worst <= bound * (1 + 1e-9)).all()
    torch.testing.assert_close(worst, bound, rtol=1e-6, atol=1e-18)  # reached at an end of the interval
    assert bound[0] == pytest.approx(lr * err / (err + 1e-8), rel=1e-9)  # g = 0: about a full step
    assert bound[-1] < 1e-14  # |g| far above the error: the step hardly changes


@pytest.mark.parametrize("step", [2, 3, 5])
def test_adamw_step_error_from_a_state_covers_torchs_step(step):
    gen = torch.Generator().manual_seed(step)
    lr, err, n = 1e-2, 1e-6, 256
    g = torch.randn(n, generator=gen, dtype=torch.float64) * 10 ** -torch.randint(0, 9, (n,), generator=gen)
    state = {"step": torch.tensor(float(step - 1), dtype=torch.float64),
             "exp_avg": torch.randn(n, generator=gen, dtype=torch.float64) * 1e-4,
             "exp_avg_sq": torch.rand(n, generator=gen, dtype=torch.float64) * 1e-8}
    w = torch.zeros(n, dtype=torch.float64)
    bound = adamw_step_error(g, err, lr, step, state["exp_avg"], state["exp_avg_sq"])
    base = adamw_after_one_step(w, g, lr, state)
    for _ in range(20):
        delta = (torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1) * err
        delta[::7] = err * torch.sign(delta[::7])  # ends of the interval too
        assert_within(adamw_after_one_step(w, g + delta, lr, state), base, bound * (1 + 1e-9), f"step {step}")
    assert (bound <= 2 * lr * adam_ratio_bound(step) + 1e-15).all()


def test_adam_ratio_bound_is_one_at_step_one_and_reached_by_its_worst_gradients():
    b1, b2 = 0.9, 0.999
    assert adam_ratio_bound(1) == pytest.approx(1.0, rel=1e-12)
    # Cauchy-Schwarz is tight for g_k proportional to a_k / b_k: run torch's AdamW on those.
    t = 3
    g = [(1 - b1) * b1 ** (t - k) / (1 - b2) / b2 ** (t - k) for k in range(1, t + 1)]
    p = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.AdamW([p], lr=1.0, betas=(b1, b2), eps=0.0, weight_decay=0.0, foreach=False)
    for k in range(t):
        before = p.detach().clone()
        p.grad = torch.tensor([g[k]], dtype=torch.float64)
        opt.step()
    assert float((before - p.detach()).abs()) == pytest.approx(adam_ratio_bound(t), rel=1e-9)


def test_adamw_rounding_is_an_ulp_of_the_weight_plus_the_updates_roundings():
    w = torch.tensor([1.0, -0.03125, 0.0])
    got = adamw_rounding(w, lr=1e-2)
    eps = 2.0**-23
    torch.testing.assert_close(got, torch.tensor([1.0, 0.03125, 0.0], dtype=torch.float64) * eps + 10 * eps * 1e-2,
                               rtol=1e-12, atol=0)


def test_assert_within_names_the_worst_element():
    assert_within(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]), torch.tensor([0.0, 0.5]), "ok")
    message = r"weights: 1 of 3 elements over the bound; worst at 2: \|3 - 3.5\| = 0.5 > 0.1"
    with pytest.raises(AssertionError, match=message):
        assert_within(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.05, 3.5]), 0.1, "weights")


def test_lockstep_hands_the_leaders_state_to_the_follower_after_every_step():
    def run(lockstep: Lockstep, grad_scale: float, steps: int = 3) -> nn.Module:
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        lockstep.attach(model, opt)
        for k in range(steps):
            opt.zero_grad()
            (model(torch.full((1, 3), float(k + 1))).sum() * grad_scale).backward()
            opt.step()
        return model

    lead = Lockstep()
    leader = run(lead, 1.0)
    follow = Lockstep(leader=lead)
    follower = run(follow, -1.0)  # the opposite gradient: its own step, then the leader's state
    assert [s.step for s in follow.steps] == [1, 2, 3]
    assert lead.steps[0].exp_avg is None and follow.steps[1].exp_avg is not None
    for mine, theirs in zip(follow.steps, lead.steps, strict=True):
        torch.testing.assert_close(mine.grad, -theirs.grad, rtol=0, atol=0)  # same weights before each step
        assert not torch.equal(mine.weights, theirs.weights)
        if theirs.exp_avg is not None:
            torch.testing.assert_close(mine.exp_avg, theirs.exp_avg, rtol=0, atol=0)
    for a, b in zip(follower.parameters(), leader.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    late = Lockstep(leader=lead, offset=1)  # after its first step it takes the leader's second
    run(late, 1.0, steps=2)
    assert [s.step for s in late.steps] == [1, 3]  # the step count comes with the leader's state
    torch.testing.assert_close(late.steps[1].exp_avg, lead.steps[2].exp_avg, rtol=0, atol=0)
