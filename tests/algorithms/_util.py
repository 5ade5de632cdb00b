"""Shared helpers for the algorithm tests: tight comparisons and masked-position scrambling."""

from __future__ import annotations

import torch
from torch import Tensor

RTOL, ATOL = 1e-5, 1e-6


def close(actual: Tensor | float, expected: Tensor | float | list, rtol: float = RTOL, atol: float = ATOL) -> None:
    """assert_close with both tolerances pinned small; lists/floats become float32 tensors."""
    actual_t = torch.as_tensor(actual)
    expected_t = torch.as_tensor(expected, dtype=actual_t.dtype)
    torch.testing.assert_close(actual_t, expected_t, rtol=rtol, atol=atol)


def random_mask(gen: torch.Generator, batch: int, length: int, allow_empty_rows: bool = False) -> Tensor:
    """A right-padded 0/1 float mask (B, T) with random lengths (>= 1 unless allowed)."""
    low = 0 if allow_empty_rows else 1
    lengths = torch.randint(low, length + 1, (batch,), generator=gen)
    return (torch.arange(length)[None, :] < lengths[:, None]).float()


def scramble(x: Tensor, mask: Tensor, fill: float | None = None, seed: int = 0) -> Tensor:
    """Copy of `x` whose masked positions hold `fill` (or large random values when None)."""
    gen = torch.Generator().manual_seed(seed)
    junk = torch.full_like(x, fill) if fill is not None else 1e3 * torch.randn(x.shape, generator=gen, dtype=x.dtype)
    return torch.where(mask.bool(), x, junk)
