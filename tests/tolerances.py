"""Tolerances for two float computations of the same training step, derived from what is compared
(dtype, number of summed terms, their size, what AdamW does to a gradient's rounding error)
rather than tuned on one machine; and `Lockstep`, which replays one run's optimizer state into
another after every step so that each step is compared from the same weights.

Not here: tolerances for sampled statistics (those follow from the sample size), or for
comparisons across dtypes (bf16 against float32 is a different question).

Summation (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., eq. 4.4): a sum of
n terms in any order and grouping is within (n - 1) u sum|x_i| of the exact sum, u = eps / 2.
Two such sums (other micro-batches, chunks, thread count or kernel) differ by less than
n eps sum|x_i|: `sum_error`. For a gradient the tests take max|g| for sum|x_i| (which would take
a backward per term): n eps is the worst case of every rounding going one way, which rounding
errors (growing like sqrt(n)) do not approach, and that slack covers terms that partly cancel.

AdamW (Loshchilov & Hutter 2019) moves a weight by lr m_hat / (sqrt(v_hat) + adam_eps), whose
size is at most lr R_t whatever the gradients (`adam_ratio_bound`). At the first step that is
lr g / (|g| + adam_eps): a gradient element within its rounding error of 0 can come out anywhere
in [-lr, lr], one with |g| far above it moves by lr g / |g| in both runs. `adamw_step_error`
bounds the change of the update over every gradient within the error, per element (exactly at
step 1, by interval arithmetic after); `adamw_rounding` adds the rounding of the update and of
the weight itself.

Over several steps an element that moved differently at step 1 changes every later gradient
through the loss's curvature, which no rounding bound covers: `Lockstep` starts each step of the
follower from the leader's weights and optimizer state, so every step is one bounded step.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which asyncrl.training.optim keeps
BETAS = (0.9, 0.999)
# Roundings in one element's AdamW update (two lerps, square, sqrt, two bias corrections, add
# eps, divide, scale by lr), each <= u = eps / 2 relative; two runs: <= 10 eps of the update.
UPDATE_ROUNDINGS = 10


def eps_of(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def sum_error(dtype: torch.dtype, terms: int, scale: float) -> float:
    """Bound on |a - b| for two evaluations of a sum of `terms` terms whose absolute values sum to
    at most `scale`, in any order or grouping. Example: float32, 60 terms, scale 0.3 ->
    60 x 2^-23 x 0.3 = 2.1e-6."""
    assert terms >= 1 and scale >= 0
    return terms * eps_of(dtype) * scale


def clip_error(dtype: torch.dtype, grad_elements: int, terms: int) -> float:
    """Bound on the relative difference of two runs' clip factor max_norm / (||g|| + 1e-6):
    each run's squared norm sums n positive terms (relative error < n u: eq. 4.4 with
    sum|x_i| = sum x_i), halved by the square root, and 2 u for the add and the divide; and
    the runs' gradients differ by up to `sum_error(dtype, terms, max|g|)` per element, which
    moves ||g|| by at most sqrt(n) times that, < sqrt(n) terms eps relative (||g|| >= max|g|)."""
    eps = eps_of(dtype)
    return grad_elements * eps / 2 + 2 * eps + math.sqrt(grad_elements) * terms * eps


def adam_ratio_bound(step: int, betas: tuple[float, float] = BETAS) -> float:
    """Largest |m_hat| / sqrt(v_hat) after `step` steps over any gradients (Cauchy-Schwarz over
    the bias-corrected weights a_k, b_k of each past gradient: sqrt(sum a_k^2 / b_k)). Step 1: 1."""
    b1, b2 = betas
    total = 0.0
    for k in range(1, step + 1):
        a = (1 - b1) * b1 ** (step - k) / (1 - b1**step)
        b = (1 - b2) * b2 ** (step - k) / (1 - b2**step)
        total += a * a / b
    return math.sqrt(total)


def first_step_error(grad: torch.Tensor, grad_error: float | torch.Tensor, lr: float) -> torch.Tensor:
    """Per element, the most AdamW's first step, lr g / (|g| + adam_eps) (bias correction makes
    m_hat = g and v_hat = g^2), changes over gradients within `grad_error` of `grad`. The step is
    increasing in g, so the extremes are at the ends of the interval.

    Example (lr 1e-3, error 1e-6): g = 0 -> 1e-3 x 1e-6 / (1e-6 + 1e-8) = 0.99e-3, about a full
    step; g = 0.1 -> 1e-3 x 1e-8 x 1e-6 / 0.1^2 = 1e-15."""
    g = grad.double()
    err = torch.as_tensor(grad_error, dtype=torch.float64)

    def step(x: torch.Tensor) -> torch.Tensor:
        return x / (x.abs() + ADAM_EPS)

    return lr * torch.maximum(step(g + err) - step(g), step(g) - step(g - err))


def adamw_step_error(grad: torch.Tensor, grad_error: float | torch.Tensor, lr: float, step: int = 1,
                     exp_avg: torch.Tensor | None = None, exp_avg_sq: torch.Tensor | None = None,
                     betas: tuple[float, float] = BETAS) -> torch.Tensor:
    """Per element, the most AdamW's step `step` (from state `exp_avg`, `exp_avg_sq`; none at
    step 1) can differ between two runs whose gradients differ by at most `grad_error` around
    `grad`. Step 1: exact (see `first_step_error`). Later: m and v over their intervals, the
    ratio over its corners, clipped to +-R_t (interval arithmetic: sound, not tight)."""
    if exp_avg is None or exp_avg_sq is None:
        assert step == 1 and exp_avg is None and exp_avg_sq is None, "AdamW's state is empty only at step 1"
        return first_step_error(grad, grad_error, lr)
    b1, b2 = betas
    g = grad.double()
    m0, v0 = exp_avg.double(), exp_avg_sq.double()
    err = torch.as_tensor(grad_error, dtype=torch.float64)
    c1, c2 = 1 - b1**step, 1 - b2**step
    num = (b1 * m0 + (1 - b1) * g) / c1
    num_err = (1 - b1) * err / c1
    low_g, high_g = (g.abs() - err).clamp(min=0), g.abs() + err
    den = ((b2 * v0 + (1 - b2) * g * g) / c2).sqrt() + ADAM_EPS
    den_lo = ((b2 * v0 + (1 - b2) * low_g * low_g) / c2).sqrt() + ADAM_EPS
    den_hi = ((b2 * v0 + (1 - b2) * high_g * high_g) / c2).sqrt() + ADAM_EPS
    corners = torch.stack([(num + s * num_err) / d for s in (-1, 1) for d in (den_lo, den_hi)])
    r = adam_ratio_bound(step, betas)
    ratio = num / den
    spread = torch.maximum(corners.amax(0).clamp(max=r) - ratio, ratio - corners.amin(0).clamp(min=-r))
    return lr * spread


def adamw_rounding(weights: torch.Tensor, lr: float, step: int = 1, betas: tuple[float, float] = BETAS) -> torch.Tensor:
    """Per element, what rounding alone makes two runs' AdamW step differ by, from the same weights
    and gradients: the update's roundings (`UPDATE_ROUNDINGS` eps of at most lr R_t) and half an
    ulp of the new weight in each run (weight decay's product rounds within the same ulp)."""
    eps = eps_of(weights.dtype)
    return eps * weights.double().abs() + UPDATE_ROUNDINGS * eps * lr * adam_ratio_bound(step, betas)


def adamw_weight_bound(weights: torch.Tensor, grad: torch.Tensor, grad_error: float | torch.Tensor, lr: float,
                       step: int = 1, exp_avg: torch.Tensor | None = None,
                       exp_avg_sq: torch.Tensor | None = None) -> torch.Tensor:
    """Per element, |w_a - w_b| after one AdamW step from the same weights and state with
    gradients within `grad_error` of `grad`: the step's sensitivity plus rounding."""
    return adamw_step_error(grad, grad_error, lr, step, exp_avg, exp_avg_sq) + adamw_rounding(weights, lr, step)


def assert_within(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor | float, what: str) -> None:
    """|actual - expected| <= bound element by element; the message names the worst element."""
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    diff = (actual.double() - expected.double()).abs()
    slack = diff - torch.as_tensor(bound, dtype=torch.float64)
    if diff.numel() and float(slack.max()) > 0:
        i = int(slack.argmax())
        limit = torch.as_tensor(bound, dtype=torch.float64).expand_as(diff).flatten()[i]
        n_over = int((slack > 0).sum())
        raise AssertionError(f"{what}: {n_over} of {diff.numel()} elements over the bound; worst at {i}: "
                             f"|{float(actual.flatten()[i]):.9g} - {float(expected.flatten()[i]):.9g}| = "
                             f"{float(diff.flatten()[i]):.3g} > {float(limit):.3g}")


def flat(tensors: Any) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors])


@dataclass
class StepRecord:
    """One optimizer step as a run saw it: the gradient going in, AdamW's state before it (flat,
    in parameter order; None at step 1) and the weights coming out."""

    step: int
    grad: torch.Tensor
    exp_avg: torch.Tensor | None
    exp_avg_sq: torch.Tensor | None
    weights: torch.Tensor


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP-sharded) as its full tensor, collectively; any other tensor as it is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    return model.state_dict(), optimizer.state_dict()


SaveState = Callable[[nn.Module, torch.optim.Optimizer], tuple[dict[str, Any], dict[str, Any]]]


@dataclass
class Lockstep:
    """Records every step of a leader run; a follower run records its own and then takes the
    leader's weights and AdamW state of that step (its step k: the leader's k + `offset`), so
    its next gradient is computed at the same weights. Each recorded step then differs only by
    that step's rounding. A leader may be sharded (its records are full tensors; pass
    `save=asyncrl.training.fsdp.full_state_dicts`) and is picklable, for a follower elsewhere.

    Usage: `lead = Lockstep(); lead.attach(model_a, opt_a); <train a>; follow = Lockstep(leader=lead);
    follow.attach(model_b, opt_b); <train b>; assert_same_steps(lead.steps, follow.steps, ...)`."""

    leader: Lockstep | None = None
    offset: int = 0
    steps: list[StepRecord] = field(default_factory=list)
    saved: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer, save: SaveState = state_dicts) -> None:
        pending: dict[str, Any] = {}

        def before(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            # what AdamW steps now, and keeps state for (read at each step: FSDP's first forward may
            # put new parameter objects in the optimizer's groups)
            stepped = [p for group in opt.param_groups for p in group["params"] if p.grad is not None]
            states = [opt.state.get(p, {}) for p in stepped]
            has_state = all("exp_avg" in s for s in states)
            pending["params"] = stepped
            pending["grad"] = flat(full(p.grad) for p in stepped).clone()
            pending["m"] = flat(full(s["exp_avg"]) for s in states).clone() if has_state else None
            pending["v"] = flat(full(s["exp_avg_sq"]) for s in states).clone() if has_state else None

        def after(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            stepped = pending["params"]
            step = int(opt.state[stepped[0]]["step"])
            weights = flat(full(p) for p in stepped).clone()
            self.steps.append(StepRecord(step, pending["grad"], pending["m"], pending["v"], weights))
            if self.leader is None:
                self.saved.append(copy.deepcopy(save(model, opt)))  # state dicts hold live tensors
                return
            model_sd, optim_sd = self.leader.saved[len(self.steps) - 1 + self.offset]
            # not strict: a sharded leader's full state dict leaves out tied weights (they load with their twin)
            assert not model.load_state_dict(model_sd, strict=False).unexpected_keys
            opt.load_state_dict(copy.deepcopy(optim_sd))

        optimizer.register_step_pre_hook(before)
        optimizer.register_step_post_hook(after)


def assert_same_steps(lead: Sequence[StepRecord], follow: Sequence[StepRecord], terms_S: Sequence[int], lr: float,
                      relative: float = 0.0) -> None:
    """Each lockstep step (`terms_S[k]`: the terms summed into each gradient element at step k):
    gradients within `sum_error` of the leader's (max|g| standing in for the terms' sum |x_i|)
    plus `relative` x |g| (e.g. `clip_error`), weights within what AdamW makes of that error
    plus rounding (`adamw_weight_bound`)."""
    assert len(lead) == len(follow) == len(terms_S), (len(lead), len(follow), len(terms_S))
    for want, got, terms in zip(lead, follow, terms_S, strict=True):
        assert got.step == want.step, (got.step, want.step)
        error = sum_error(want.grad.dtype, terms, float(want.grad.abs().max())) + relative * want.grad.double().abs()
        assert_within(got.grad, want.grad, error, f"step {want.step} gradients")
        bound = adamw_weight_bound(want.weights, want.grad, error, lr, want.step, want.exp_avg, want.exp_avg_sq)
        assert_within(got.weights, want.weights, bound, f"step {want.step} weights")
