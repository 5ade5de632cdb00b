"""Tests for asyncrl.algorithms.logprobs: values and gradients against torch, and memory frugality."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.algorithms.logprobs import entropy_from_logits, logprobs_from_logits

from ._util import close

TINY = dict(rtol=1e-10, atol=1e-12)  # float64 comparisons


def reference_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def reference_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.distributions.Categorical(logits=logits / temperature).entropy()


def test_hand_examples() -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    close(logprobs_from_logits(logits, torch.tensor([[1]])), [[math.log(0.75)]])
    close(logprobs_from_logits(logits, torch.tensor([[1]]), temperature=2.0), [[-0.45574639]])
    close(entropy_from_logits(logits), [[0.25 * math.log(4.0) + 0.75 * math.log(4.0 / 3.0)]])


@pytest.mark.parametrize("chunk_rows", [1, 4, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_log_softmax_values_and_gradients(chunk_rows: int, temperature: float) -> None:
    gen = torch.Generator().manual_seed(chunk_rows)
    logits = (3 * torch.randn(3, 5, 11, generator=gen, dtype=torch.float64)).requires_grad_(True)
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    upstream = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    ours = logprobs_from_logits(logits, labels, temperature, chunk_rows=chunk_rows)
    (ours_grad,) = torch.autograd.grad((ours * upstream).sum(), logits)
    ref = reference_logprobs(logits, labels, temperature)
    (ref_grad,) = torch.autograd.grad((ref * upstream).sum(), logits)
    torch.testing.assert_close(ours, ref, **TINY)
    torch.testing.assert_close(ours_grad, ref_grad, **TINY)


@pytest.mark.parametrize("chunk_rows", [1, 4, 1024])
@pytest.mark.parametrize("temperature", [1.0, 1.3])
def test_entropy_matches_categorical_values_and_gradients(chunk_rows: int, temperature: float) -> None:
    gen = torch.Generator().manual_seed(7 + chunk_rows)
    logits = (3 * torch.randn(2, 6, 9, generator=gen, dtype=torch.float64)).requires_grad_(True)
    upstream = torch.randn(2, 6, generator=gen, dtype=torch.float64)
    ours = entropy_from_logits(logits, temperature, chunk_rows=chunk_rows)
    (ours_grad,) = torch.autograd.grad((ours * upstream).sum(), logits)
    ref = reference_entropy(logits, temperature)
    (ref_grad,) = torch.autograd.grad((ref * upstream).sum(), logits)
    torch.testing.assert_close(ours, ref, **TINY)
    torch.testing.assert_close(ours_grad, ref_grad, **TINY)


def test_bfloat16_logits_compute_in_float32() -> None:
    gen = torch.Generator().manual_seed(0)
    logits32 = torch.randn(2, 4, 16, generator=gen)
    logits = logits32.to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 16, (2, 4), generator=gen)
    out = logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    close(out, reference_logprobs(logits.detach().float(), labels, 1.0))
    out.sum().backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16


def test_arbitrary_leading_shape() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 5, (2, 3, 4), generator=gen)
    torch.testing.assert_close(logprobs_from_logits(logits, labels), reference_logprobs(logits, labels, 1.0), **TINY)
    torch.testing.assert_close(entropy_from_logits(logits), reference_entropy(logits, 1.0), **TINY)


def test_two_dim_and_empty_inputs() -> None:
    logits = torch.randn(4, 6, dtype=torch.float64)
    labels = torch.tensor([0, 5, 2, 1])
    torch.testing.assert_close(logprobs_from_logits(logits, labels), reference_logprobs(logits, labels, 1.0), **TINY)
    assert logprobs_from_logits(torch.zeros(2, 0, 6), torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0)


def _saved_numel(fn: object) -> int:
    """Total elements autograd keeps for backward while running `fn()`."""
    sizes: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()  # type: ignore[operator]
    return sum(sizes)


def test_keeps_only_the_logits_for_backward() -> None:
    batch, length, vocab = 2, 8, 64
    logits = torch.randn(batch, length, vocab, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, length))
    small = 3 * batch * length  # labels, logsumexp (and entropy) per row
    for run in (lambda: logprobs_from_logits(logits, labels, 0.7, chunk_rows=4),
                lambda: entropy_from_logits(logits, 0.7, chunk_rows=4)):
        # The logits themselves (no copy, no log-softmax) plus per-row statistics.
        assert logits.numel() <= _saved_numel(run) <= logits.numel() + small


def test_non_contiguous_slice_is_used_in_place() -> None:
    full = torch.randn(2, 10, 32, requires_grad=True)  # model output over prompt + response
    logits = full[:, 3:8]  # response part: a non-contiguous view
    labels = torch.randint(0, 32, (2, 5))
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = logprobs_from_logits(logits, labels, chunk_rows=3)
    big = [t for t in saved if t.numel() >= logits.numel()]
    assert len(big) == 1 and big[0].untyped_storage().data_ptr() == full.untyped_storage().data_ptr()
    (grad,) = torch.autograd.grad(out.sum(), full)
    (ref_grad,) = torch.autograd.grad(reference_logprobs(full[:, 3:8], labels, 1.0).sum(), full)
    close(grad, ref_grad)
