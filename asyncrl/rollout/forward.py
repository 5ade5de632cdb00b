"""The fast path: batched prefill and decode for HF Llama (incl. 3.x) / Qwen2 / Qwen3 models,
with a slot KV cache.

It reuses the HF modules for everything position-independent (embedding, RMSNorm, q/k/v/o
projections with their biases, Qwen3's per-head q/k RMSNorms, the SiLU MLP, final norm, lm_head
or tied embeddings) and the model's own rotary module for cos/sin: that module builds `inv_freq`
with transformers' rope init function for the config's `rope_parameters`, so Llama 3's "llama3"
scaling (and "linear", "yarn", ...) come for free and logits match the HF forward to float
rounding. Only attention is reimplemented: it reads/writes `SlotKVCache` and masks each row.
With `fused_decode=True` (`rollout.fused_decode`, CUDA's default) the decode step instead runs merged
q/k/v and gate/up matmuls (`asyncrl.rollout.merged`) and Triton kernels for residual add +
RMSNorm, q/k norm + rotary + the K/V write, and SiLU-multiply (`asyncrl.rollout.kernels`),
rounding as the HF modules do; prefill keeps the HF modules (whose weights are then the merged
buffers' rows).

Not here (`fast_path_problem` says why, and the engine takes `asyncrl.rollout.generic`
instead): other architectures, sliding-window layers, non-SiLU MLPs, rope types whose
frequencies depend on the sequence length ("dynamic", "longrope": HF recomputes them from the
batch's longest position, which a mixed batch would get wrong). A prefill after a prefix-cache
hit (`prefill_after`) runs eagerly, one attention call per row.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from asyncrl.errors import RolloutError
from asyncrl.rollout.attention import DecodeAttentionPath, StepAttention
from asyncrl.rollout.kv_cache import SlotKVCache
from asyncrl.rollout.merged import MergedLayer, merge_layer
from asyncrl.rollout.prefill import PackedPrompts, PrefillPath, cached_attention, causal_attention, packed_attention
from asyncrl.scheduling.micro_budget import ModelShape

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


# The parts of an HF Llama / Qwen2 causal LM used here. nn.Module types every submodule attribute
# as `Tensor | Module`, so a model that passed `check_supported` is cast to these once.
class _RMSNorm(Protocol):
    weight: torch.Tensor
    variance_epsilon: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class _Attention(Protocol):
    q_proj: nn.Module
    k_proj: nn.Module
    v_proj: nn.Module
    o_proj: nn.Module
    scaling: float
    # Qwen3 only: RMSNorm over head_dim of each query / key head, before rotary.
    q_norm: _RMSNorm
    k_norm: _RMSNorm


class _MLP(Protocol):
    gate_proj: nn.Module
    up_proj: nn.Module
    down_proj: nn.Module


class _DecoderLayer(Protocol):
    self_attn: _Attention
    mlp: nn.Module
    input_layernorm: _RMSNorm
    post_attention_layernorm: _RMSNorm


class _Body(Protocol):
    """LlamaModel / Qwen2Model."""

    embed_tokens: nn.Embedding
    rotary_emb: nn.Module
    norm: _RMSNorm
    layers: nn.ModuleList


class _CausalLM(Protocol):
    config: Any  # a PretrainedConfig: its per-architecture fields are set at runtime
    model: _Body
    lm_head: nn.Module


def fast_path_problem(model: nn.Module) -> str | None:
    """Why `BatchedForward` cannot reproduce `model` exactly, or None when it can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return f"sliding-window layers {layer_types}"
    hidden_act = getattr(config, "hidden_act", "silu")
    if hidden_act != "silu":
        return f"hidden_act={hidden_act!r} (fast path: 'silu' only)"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in LENGTH_DEPENDENT_ROPE:
        return f"rope_type {rope_type!r} depends on the sequence length"
    attn = cast(_CausalLM, model).model.layers[0].self_attn
    if hasattr(attn, "q_norm") != hasattr(attn, "k_norm"):
        return "a q norm without a k norm (or the reverse)"
    return None


def check_supported(model: nn.Module) -> None:
    """Raise `RolloutError` unless `model` is a causal LM this forward reproduces exactly."""
    problem = fast_path_problem(model)
    if problem is not None:
        raise RolloutError(f"the fast rollout forward does not support this model: {problem}")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rms_norm(norm: _RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """The HF RMSNorm; in float32 as one fused call (bit-identical there, far fewer ops)."""
    if x.dtype != torch.float32:
        return norm(x)
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, H, D); cos/sin: (B, T, 1, D). Same formula as HF's apply_rotary_pos_emb."""
    return (x * cos) + (_rotate_half(x) * sin)


class BatchedForward:
    """Prefill and decode steps over a batch of sequences living in cache slots."""

    def __init__(self, model: nn.Module, *, fused_decode: bool = False,
                 decode_attention: DecodeAttentionPath = "matmul") -> None:
        check_supported(model)
        lm = cast(_CausalLM, model)
        config = lm.config
        self.base = lm.model
        self.lm_head = lm.lm_head
        self.layers = cast("list[_DecoderLayer]", list(self.base.layers))
        self.num_heads: int = config.num_attention_heads
        self.kv_heads: int = config.num_key_value_heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.groups = self.num_heads // self.kv_heads
        self.scaling = float(self.layers[0].self_attn.scaling)
        self.vocab_size: int = config.vocab_size
        self.hidden_size: int = config.hidden_size
        self.intermediate_size: int = config.intermediate_size
        shape = ModelShape.from_hf(config)
        assert shape is not None, "check_supported admits only configs with every size"
        self.shape: ModelShape = shape
        """The sizes that set the engine's activation memory (`asyncrl.rollout.memory`)."""
        self.qk_norm = hasattr(self.layers[0].self_attn, "q_norm")
        self.decode_attention: DecodeAttentionPath = decode_attention
        """Decode attention: "matmul" to a padded length, "triton" over each row's own (`asyncrl.rollout.attention`)."""
        self.fused_decode = fused_decode
        """Decode through the fused step (merged projections, `asyncrl.rollout.kernels`); False:
        through HF's modules. Prefill takes HF's modules either way (their weights are the merged
        buffers' rows when fused)."""
        self._kernels: ModuleType | None = None
        self._merged: list[MergedLayer] = []
        if fused_decode:  # imported here: @triton.jit reads TRITON_INTERPRET when the module is imported
            self._kernels = importlib.import_module("asyncrl.rollout.kernels.elementwise")
            self._merged = [merge_layer(cast(nn.Module, layer.self_attn), layer.mlp) for layer in self.layers]

    def new_cache(self, max_slots: int, device: torch.device | str) -> SlotKVCache:
        dtype = self.base.embed_tokens.weight.dtype
        return SlotKVCache(
            len(self.layers), self.kv_heads, self.head_dim,
            max_slots=max_slots, dtype=dtype, device=device,
        )

    def _qkv(
        self, layer: _DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projections plus rotary; returns q (B,T,H,D), k and v (B,T,Hkv,D)."""
        attn = layer.self_attn
        b, t, _ = x.shape
        q = attn.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        k = attn.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        v = attn.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = _rms_norm(attn.q_norm, q), _rms_norm(attn.k_norm, k)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def _mlp_residual(self, layer: _DecoderLayer, h: torch.Tensor) -> torch.Tensor:
        return h + layer.mlp(_rms_norm(layer.post_attention_layernorm, h))

    def _logits(self, h_last: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """h_last: (B, hidden) pre-norm hidden state of each row's last position. Into `out`
        (B, V) float32 when given: the cast and the copy are one kernel."""
        return self._head(_rms_norm(self.base.norm, h_last), out)

    def _head(self, normed: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        logits = self.lm_head(normed)
        return logits.float() if out is None else out.copy_(logits)

    # The decode layer body, unfused (HF's modules) or fused (merged projections + kernels). The
    # residual stream is carried as (h, delta): `delta` is what the last sublayer adds to `h`,
    # added by the next norm, which is where the fused kernel does the add.

    def _add_norm(self, norm: _RMSNorm, delta: torch.Tensor | None,
                  h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(h + delta), h + delta), rows of (B, hidden); no delta: norm(h), h."""
        if self._kernels is not None:
            return cast("tuple[torch.Tensor, torch.Tensor]",
                        self._kernels.add_rms_norm(delta, h, norm.weight, norm.variance_epsilon))
        h = h if delta is None else h + delta
        return _rms_norm(norm, h), h

    def _decode_qkv(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: SlotKVCache,
                    rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Layer i's q (B, H, D) after Qwen3's q norm and rotary; its k and v go into the cache
        at (row, positions[row]). x: the normed input (B, hidden); cos/sin: (B, D)."""
        layer = self.layers[i]
        if self._kernels is None:
            q, k, v = self._qkv(layer, x[:, None], cos[:, None, None], sin[:, None, None])
            cache.keys[i][rows, :, positions] = k[:, 0]
            cache.values[i][rows, :, positions] = v[:, 0]
            return q[:, 0]
        merged = self._merged[i]
        attn = layer.self_attn
        norms = (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.variance_epsilon) if self.qk_norm else None
        return cast(torch.Tensor, self._kernels.rope_cache_write(
            F.linear(x, merged.qkv_weight, merged.qkv_bias), cos, sin, cache.keys[i], cache.values[i], positions,
            heads=self.num_heads, kv_heads=self.kv_heads, head_norms=norms))

    def _decode_mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Layer i's MLP of the normed x (B, hidden): down(SiLU(gate x) * up x)."""
        mlp = self.layers[i].mlp
        if self._kernels is None:
            return cast(torch.Tensor, mlp(x))
        act = self._kernels.silu_mul(F.linear(x, self._merged[i].gate_up_weight))
        return cast(torch.Tensor, cast(_MLP, mlp).down_proj(act))

    def decode(
        self, cache: SlotKVCache, token_ids: torch.Tensor, positions: torch.Tensor, length: int | None = None,
        out: torch.Tensor | None = None, lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One token per row; row i lives in slot i and its token sits at `positions[i]`.

        token_ids, positions: (B,) int64. Returns logits (B, V) in float32, written into `out`
        when given. Attention (`self.decode_attention`, see `asyncrl.rollout.attention.StepAttention`):
        matmul reads the first `length` cached positions of every row (default: up to the
        furthest row, read from the device; a length given by the host, as CUDA graphs need,
        keeps every shape static and reads no tensor on the host; every position < `length`
        must lie inside the cache); triton reads `lengths[i]` positions of row i (default:
        positions + 1; 0 for a padding row, which reads nothing), with no host read either way.
        """
        b = token_ids.shape[0]
        attend = StepAttention(self.decode_attention, cache, positions, heads=self.num_heads, scale=self.scaling,
                               lengths=lengths, length=length)
        rows = torch.arange(b, device=token_ids.device)
        h = self.base.embed_tokens(token_ids)  # (B, hidden)
        cos, sin = self.base.rotary_emb(h, positions[:, None])  # (B, 1, D)
        cos, sin = cos[:, 0], sin[:, 0]
        delta: torch.Tensor | None = None
        for i, layer in enumerate(self.layers):
            x, h = self._add_norm(layer.input_layernorm, delta, h)
            q = self._decode_qkv(i, x, cos, sin, cache, rows, positions)
            o = layer.self_attn.o_proj(attend(q, i))
            x, h = self._add_norm(layer.post_attention_layernorm, o, h)
            delta = self._decode_mlp(i, x)
        return self._head(self._add_norm(self.base.norm, delta, h)[0], out)

    def prefill(
        self, cache: SlotKVCache, token_ids: torch.Tensor, lengths: torch.Tensor, first_slot: int
    ) -> torch.Tensor:
        """Right-padded contexts from position 0 into slots first_slot..first_slot+n-1.

        token_ids: (n, T) int64 (padding arbitrary), lengths: (n,). Returns the logits of each
        row's last real token, (n, V) float32. Padding positions are written to the cache too;
        they lie past the row's length, are masked, and are overwritten by later decode steps.
        """
        n, t = token_ids.shape
        device = token_ids.device
        positions = torch.arange(t, device=device)[None].expand(n, t)
        h = self.base.embed_tokens(token_ids)  # (n, T, hidden)
        cos, sin = self.base.rotary_emb(h, positions)
        cos, sin = cos[:, :, None], sin[:, :, None]
        # Rows are right-padded, so causal attention alone keeps every real position off the
        # padding (it only looks back): no (n, T, T) mask. Padded positions compute garbage that
        # is written past each row's length, masked in decode and overwritten.
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, _rms_norm(layer.input_layernorm, h), cos, sin)
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # (n, Hkv, T, D)
            cache.keys[i][first_slot : first_slot + n, :, :t] = k
            cache.values[i][first_slot : first_slot + n, :, :t] = v
            out = causal_attention(q.transpose(1, 2), k, v, self.scaling)  # (n, H, T, D)
            h = h + layer.self_attn.o_proj(out.transpose(1, 2).reshape(n, t, -1))
            h = self._mlp_residual(layer, h)
        last = h[torch.arange(n, device=device), lengths - 1]
        return self._logits(last)

    def prefill_packed(self, cache: SlotKVCache, packed: PackedPrompts, path: PrefillPath,
                       out: torch.Tensor | None = None) -> torch.Tensor:
        """Prompts packed into one row of N tokens (`asyncrl.rollout.prefill`), no padding: each
        token's K/V into its (slot, position), one attention call per layer over the rows
        (`path`: "varlen", "jagged" or "rows"). Returns the logits of each row's last token,
        (R, V) float32, into `out` when given. Every shape is fixed by the layout, and nothing is
        read back to the host: a CUDA graph can capture it.
        """
        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return packed_attention(q, k, v, packed, path, self.scaling)

        return self._logits(self._packed_layers(cache, packed, attend), out)

    def prefill_after(self, cache: SlotKVCache, packed: PackedPrompts, starts: Sequence[int],
                      first_slot: int) -> torch.Tensor:
        """`prefill_packed` for rows whose slots hold their first `starts[r]` positions already
        (prefix-cache hits): the packed tokens sit at positions starts[r].. (`pack_prompts(...,
        starts=)`) and attend the cached positions before them as well as each other. One causal
        attention call per row over its slot (`cached_attention`). Returns (R, V) float32 logits."""
        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return cached_attention(q, cache.keys[i], cache.values[i], packed.lengths, starts, first_slot, self.scaling)

        return self._logits(self._packed_layers(cache, packed, attend))

    def _packed_layers(self, cache: SlotKVCache, packed: PackedPrompts,
                       attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The layers over packed tokens, each token's K/V written to its (slot, position) first;
        `attend(layer, q, k, v)` -> (N, H, D). Returns each row's last token's hidden state (R, hidden)."""
        n = packed.ids.shape[0]
        h = self.base.embed_tokens(packed.ids)[None]  # (1, N, hidden)
        cos, sin = self.base.rotary_emb(h, packed.positions[None])  # (1, N, D)
        cos, sin = cos[:, :, None], sin[:, :, None]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, _rms_norm(layer.input_layernorm, h), cos, sin)  # (1, N, heads, D)
            cache.keys[i][packed.slots, :, packed.positions] = k[0]
            cache.values[i][packed.slots, :, packed.positions] = v[0]
            attended = attend(i, q[0], k[0], v[0])  # (N, H, D)
            h = h + layer.self_attn.o_proj(attended.reshape(1, n, self.num_heads * self.head_dim))
            h = self._mlp_residual(layer, h)
        return h[0].index_select(0, packed.last)
