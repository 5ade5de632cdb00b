"""Torch's packed-row kernels called as each release takes them: a stand-in `varlen_attn` with
each released signature (torch 2.10, 2.11, 2.12+) receives the arguments that release documents
and, computing what the docs say it computes, gives causal attention within each row; SDPA over
nested jagged tensors, which has no causal CPU kernel, runs here through a stand-in SDPA that
computes each nested row alone (the CUDA kernels run in tests/gpu)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from asyncrl.errors import ConfigError
from asyncrl.training import attention_kernels as kernels

# float64 attention of the same rows in another grouping: a softmax over <= 9 keys and a
# weighted sum of 9 values, each within a few eps of 1: far inside these.
F64 = dict(rtol=1e-12, atol=1e-12)


def reference_varlen(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None, window_size=(-1, -1),
                     enable_gqa=False):
    """What varlen_attn computes (torch.nn.attention.varlen's docs): each row's queries over its
    keys, key j visible to query i when i - left <= j <= i + right for window (left, right), -1
    unbounded; is_causal = right 0; grouped KV heads only with enable_gqa."""
    assert enable_gqa or q.shape[1] == k.shape[1], "heads differ without enable_gqa"
    left, right = window_size
    right = 0 if is_causal else right
    out = []
    for a, b in itertools.pairwise(cu_seq_q.tolist()):
        i, j = torch.arange(b - a)[:, None], torch.arange(b - a)[None]
        seen = (j <= i + right if right >= 0 else j >= 0) & (j >= i - left if left >= 0 else j >= 0)
        qi, ki, vi = (x[a:b].transpose(0, 1) for x in (q, k, v))  # (H, L, D)
        out.append(F.scaled_dot_product_attention(qi, ki, vi, attn_mask=seen, scale=scale,
                                                  enable_gqa=enable_gqa).transpose(0, 1))
    return torch.cat(out)


def released(calls: list[dict[str, Any]]) -> dict[str, Callable[..., torch.Tensor]]:
    """A stand-in varlen_attn per released signature, recording each call's keyword arguments and heads."""
    def varlen_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        calls.append(dict(is_causal=is_causal, kv_heads=key.shape[1]))
        return reference_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=is_causal)

    def varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1)):
        calls.append(dict(scale=scale, window_size=window_size, kv_heads=key.shape[1]))
        return reference_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                                window_size=window_size)

    def varlen_2_12(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
        calls.append(dict(scale=scale, window_size=window_size, enable_gqa=enable_gqa, kv_heads=key.shape[1]))
        return reference_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                                window_size=window_size, enable_gqa=enable_gqa)

    return {"torch-2.10": varlen_2_10, "torch-2.11": varlen_2_11, "torch-2.12+": varlen_2_12}


RELEASES = list(released([]))
LENGTHS = (4, 1, 9, 6)


def packed_qkv(heads: int = 4, kv_heads: int = 2, dim: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    n = sum(LENGTHS)
    return tuple(torch.randn(n, h, dim, generator=g, dtype=torch.float64) for h in (heads, kv_heads, kv_heads))


def bounds() -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(LENGTHS)], dtype=torch.int32)


def row_by_row(q, k, v, scale=None, window=None) -> torch.Tensor:
    """Causal attention of each row alone, grouped KV heads repeated; `window` keys at most."""
    out = []
    for a, b in itertools.pairwise(bounds().tolist()):
        i, j = torch.arange(b - a)[:, None], torch.arange(b - a)[None]
        seen = (j <= i) & (j > i - window if window else j >= 0)
        qi, ki, vi = (x[a:b].transpose(0, 1).repeat_interleave(q.shape[1] // x.shape[1], 0) for x in (q, k, v))
        out.append(F.scaled_dot_product_attention(qi, ki, vi, attn_mask=seen, scale=scale).transpose(0, 1))
    return torch.cat(out)


EXPECTED = {  # release -> (keyword arguments the call passes for a causal GQA call at scale 0.3, KV heads given)
    "torch-2.10": (dict(is_causal=True), 4),
    "torch-2.11": (dict(scale=0.3, window_size=(-1, 0)), 4),
    "torch-2.12+": (dict(scale=0.3, window_size=(-1, 0), enable_gqa=True), 2),
}


@pytest.mark.parametrize("release", RELEASES)
def test_each_released_varlen_signature_gets_a_causal_grouped_call(release):
    calls: list[dict[str, Any]] = []
    call = kernels.varlen_call(released(calls)[release])
    q, k, v = packed_qkv()
    out = call(q, k, v, bounds(), max(LENGTHS), 0.3)
    kwargs, kv_heads = EXPECTED[release]
    assert calls == [{**kwargs, "kv_heads": kv_heads}]
    torch.testing.assert_close(out, row_by_row(q, k, v, scale=0.3), **F64)


@pytest.mark.parametrize("release", RELEASES)
def test_the_kernels_own_scale_is_not_passed(release):
    calls: list[dict[str, Any]] = []
    q, k, v = packed_qkv()
    out = kernels.varlen_call(released(calls)[release])(q, k, v, bounds(), max(LENGTHS), q.shape[-1] ** -0.5)
    assert calls[0].get("scale") is None
    torch.testing.assert_close(out, row_by_row(q, k, v), **F64)


@pytest.mark.parametrize(("release", "window", "passed"), [
    ("torch-2.11", 3, (2, 0)),  # rows up to 9 tokens: a 3-key window matters, (W - 1, 0) keeps W keys
    ("torch-2.12+", 3, (2, 0)),
    ("torch-2.11", 9, (-1, 0)),  # no row is wider than the window: plain causal
], ids=["2.11-window-3", "2.12-window-3", "2.11-window-9-wider-than-every-row"])
def test_a_sliding_window_is_passed_as_w_minus_1_keys_back(release, window, passed):
    calls: list[dict[str, Any]] = []
    call = kernels.varlen_call(released(calls)[release])
    assert call.window
    q, k, v = packed_qkv()
    out = call(q, k, v, bounds(), max(LENGTHS), None, window)
    assert calls[0]["window_size"] == passed
    torch.testing.assert_close(out, row_by_row(q, k, v, window=window), **F64)


def test_torch_2_10_takes_no_window_and_a_signature_is_read_once(monkeypatch):
    reads = []
    signature = kernels.inspect.signature

    def counting(fn):
        reads.append(fn)
        return signature(fn)

    monkeypatch.setattr(kernels.inspect, "signature", counting)
    fn = released([])["torch-2.10"]
    assert not kernels.varlen_call(fn).window
    assert kernels.varlen_call(fn) is kernels.varlen_call(fn)
    assert reads == [fn]


def test_a_varlen_that_cannot_be_made_causal_is_not_used():
    def bare(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
        raise AssertionError("not called")

    assert kernels.varlen_call(bare) is None


def test_the_installed_torch_has_a_varlen_call():
    call = kernels.varlen_kernel()
    assert call is not None and call.window  # torch >= 2.11 here


def nested_rows_alone(calls: list[str]):
    """A stand-in SDPA for nested jagged inputs: each row's causal attention alone (through the
    SDPA of when it was made, so it may replace torch's)."""
    dense = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        assert q.is_nested and q.layout == torch.jagged and is_causal and not enable_gqa
        calls.append("nested")
        rows = [dense(*(x.transpose(0, 1) for x in row), is_causal=True, scale=scale)
                for row in zip(*(x.transpose(1, 2).unbind() for x in (q, k, v)), strict=True)]  # (H, L, D)
        return torch.nested.as_nested_tensor([r.transpose(0, 1) for r in rows], layout=torch.jagged).transpose(1, 2)
    return sdpa


def test_jagged_attention_builds_nested_rows_that_attend_within_themselves(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(F, "scaled_dot_product_attention", nested_rows_alone(calls))
    q, k, v = (x.requires_grad_() for x in packed_qkv())
    out = kernels.jagged_attention(q, k, v, bounds(), LENGTHS, 0.3)
    assert calls == ["nested"] and out.shape == q.shape
    monkeypatch.undo()
    want = row_by_row(q, k, v, scale=0.3)
    torch.testing.assert_close(out, want, **F64)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    for got, expected in zip(grads, torch.autograd.grad(want.square().sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(got, expected, **F64)


@pytest.mark.parametrize("path", ["varlen", "jagged"])
def test_a_forced_path_this_torch_lacks_is_a_config_error_naming_the_key(monkeypatch, path):
    monkeypatch.setattr(kernels, "varlen_kernel", lambda: None)
    monkeypatch.setattr(kernels, "jagged_kernel", lambda: False)
    with pytest.raises(ConfigError, match=f"model.packed_attention={path}: torch .* set model.packed_attention=auto"):
        kernels.require(path)
    kernels.require("grouped")
    kernels.require("auto")
