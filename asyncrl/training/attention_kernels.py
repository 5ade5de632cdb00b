"""Torch's own kernels for causal attention over packed rows, called the way the installed torch
takes them: the one place that knows torch versions (`packed_attention` picks among them).

`torch.nn.attention.varlen.varlen_attn` (FlashAttention over variable-length rows) has had a
different signature in each release since it appeared:
- up to 2.9: no `torch.nn.attention.varlen`.
- 2.10: `varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False,
  return_aux=None)`: causal by a flag, no scale, no window (docs.pytorch.org/docs/stable/
  nn.attention.varlen.html while 2.10 was stable; the API from pytorch/pytorch#164502, Oct 2025).
- 2.11: `varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
  scale=None, window_size=(-1, -1))`: causal is the window (-1, 0), a sliding window of W keys
  (W - 1, 0) (docs.pytorch.org/docs/main/nn.attention.varlen.html before the 2.11 branch; the
  2.11 release notes: no `enable_gqa`).
- 2.12 and main (2.13.0 on this machine, `inspect.signature`): `..., *, return_aux=None,
  scale=None, window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None,
  num_splits=None)`: fewer KV heads than query heads with `enable_gqa=True`
  (docs.pytorch.org/docs/2.12/nn.attention.varlen.html; pytorch/pytorch#179468, Apr 2026).
`varlen_call(fn)` reads the signature once per function and builds the call from it: causal by
window or flag, `scale` where taken (else the query scaled by the ratio to the kernel's own
1/sqrt(D)), grouped KV heads repeated to the query heads where `enable_gqa` is missing (aten's
flash kernel may take them anyway; only 2.12+ promises it), and a sliding window where taken:
the `sliding_window` transformers passes each layer (Mistral-family models: the config's
`sliding_window`), W keys back as transformers counts them, so `window_size=(W - 1, 0)`.

For torches without varlen (2.4-2.9), `jagged_attention`: SDPA over nested jagged tensors
(`torch.nested`, layout torch.jagged), differentiable through torch's flash or memory-efficient
kernels on CUDA. It has no CPU kernel for causal attention (torch 2.13: the math backend refuses
nested tensors with is_causal=True), so on a CPU it is tested through a stand-in SDPA.

Not here: which path a call takes (`packed_attention.choose`) or the grouped sdpa fallback.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from asyncrl.errors import ConfigError

KEY = "model.packed_attention"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VarlenCall:
    """How to call one `varlen_attn`: which of the arguments the packed path needs it takes."""

    fn: Callable[..., Any]
    window: bool  # takes window_size (causal = (-1, 0)); else is_causal
    scale: bool
    gqa: bool  # takes enable_gqa

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, bounds: Tensor, longest: int, scaling: float | None,
                 sliding_window: int | None = None) -> Tensor:
        """Causal attention of packed rows: (N, H, D) query, (N, H_kv, D) key and value, `bounds`
        (rows + 1,) int32 on their device -> (N, H, D)."""
        kwargs: dict[str, Any] = {}
        if scaling is not None and not math.isclose(scaling, q.shape[-1] ** -0.5):
            if self.scale:
                kwargs["scale"] = scaling
            else:  # the kernel divides by sqrt(D)
                q = q * (scaling * q.shape[-1] ** 0.5)
        if q.shape[1] != k.shape[1]:
            if self.gqa:
                kwargs["enable_gqa"] = True
            else:
                k, v = repeat_heads(k, q.shape[1]), repeat_heads(v, q.shape[1])
        if self.window:
            left = sliding_window - 1 if sliding_window is not None and longest > sliding_window else -1
            kwargs["window_size"] = (left, 0)
        else:
            kwargs["is_causal"] = True
        return cast(Tensor, self.fn(q, k, v, bounds, bounds, longest, longest, **kwargs))


@functools.cache
def varlen_call(fn: Callable[..., Any]) -> VarlenCall | None:
    """The call for `fn`, a `varlen_attn`, from its signature; None if it cannot be made causal."""
    params = inspect.signature(fn).parameters
    if "window_size" not in params and "is_causal" not in params:
        return None
    return VarlenCall(fn, window="window_size" in params, scale="scale" in params, gqa="enable_gqa" in params)


@functools.cache
def _varlen_module() -> ModuleType | None:
    try:
        import torch.nn.attention.varlen as varlen
    except ImportError:
        return None
    return varlen


def varlen_kernel() -> VarlenCall | None:
    """The installed torch's `varlen_attn` as a `VarlenCall` (looked up each time, built once per
    function), or None where torch has none."""
    module = _varlen_module()
    fn = getattr(module, "varlen_attn", None)
    return None if fn is None else varlen_call(fn)


@functools.cache
def jagged_kernel() -> bool:
    """Whether this torch has nested jagged tensors (torch 2.4+'s `nested_tensor_from_jagged`)."""
    return hasattr(torch, "jagged") and hasattr(torch.nested, "nested_tensor_from_jagged")


@functools.cache
def _seqlen_hints() -> bool:
    """Whether `nested_tensor_from_jagged` takes the rows' min and max lengths (else SDPA reads
    them back from the device)."""
    return "max_seqlen" in inspect.signature(torch.nested.nested_tensor_from_jagged).parameters


def jagged_attention(q: Tensor, k: Tensor, v: Tensor, bounds: Tensor, lengths: tuple[int, ...],
                     scaling: float | None, dropout: float = 0.0) -> Tensor:
    """Causal attention of packed rows through SDPA over nested jagged tensors: (N, H, D) query,
    (N, H_kv, D) key and value, `bounds` (rows + 1,) on their device -> (N, H, D)."""
    if q.shape[1] != k.shape[1]:  # the fused nested kernels take no grouped heads in training
        k, v = repeat_heads(k, q.shape[1]), repeat_heads(v, q.shape[1])
    offsets = bounds.to(torch.int64)  # one tensor for all three: they share the ragged dimension
    hints: dict[str, Any] = dict(min_seqlen=min(lengths), max_seqlen=max(lengths)) if _seqlen_hints() else {}
    q, k, v = (torch.nested.nested_tensor_from_jagged(x, offsets, **hints).transpose(1, 2) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling)
    return out.transpose(1, 2).values()


def repeat_heads(x: Tensor, heads: int) -> Tensor:
    """(N, H_kv, D) -> (N, heads, D): each KV head serves heads / H_kv query heads in a row."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def require(path: str) -> None:
    """Raise a ConfigError naming the key when a forced `path` has no kernel in this torch."""
    if path == "varlen" and varlen_kernel() is None:
        raise ConfigError(f"{KEY}=varlen: torch {torch.__version__} has no usable "
                          f"torch.nn.attention.varlen.varlen_attn (torch 2.10+); set {KEY}=auto")
    if path == "jagged" and not jagged_kernel():
        raise ConfigError(f"{KEY}=jagged: torch {torch.__version__} has no nested jagged tensors "
                          f"(torch 2.4+); set {KEY}=auto")


@functools.cache
def note_grouped_on_cuda(version: str) -> None:
    """Say once that packed rows on CUDA fall back to grouped sdpa calls on this torch."""
    log.warning("packed attention: torch %s has neither torch.nn.attention.varlen (2.10+) nor nested jagged "
                "tensors (2.4+); packed rows on CUDA run as grouped sdpa calls", version)
