"""Micro-batch token budgets: how many tokens one training micro-batch (forward + backward) and
one forward-only micro-batch (old log-probs, reference log-probs, critic values) take at once.

`actor.ppo_micro_batch_tokens` and `actor.log_prob_micro_batch_tokens` set them; 0, the default
of both, means derived:
- training, on the CPU: `CPU_MICRO_BATCH_TOKENS` (8192, measured on the 2-core dev machine,
  docs/training.md); on CUDA: from the memory left to the trainer and the model's shape
  (`cuda_micro_batch_tokens`, its memory model in `activation_bytes_per_token`);
- forward-only: twice the training budget (a forward under no_grad keeps no layer's
  activations for a backward, so a token costs far less than in training).
verl's keys arrive as ours (`config.verl` maps `ppo_max_token_len_per_gpu` and
`log_prob_max_token_len_per_gpu` to them, and only where our key is not given), so a budget
comes from our key, else verl's, else the derived value.

Pure: no torch, no devices. The caller (`pipelines.setup.build_context`) reads the device's
total memory and the model's Hugging Face config and passes them in as a `TrainerDevice`; the
run plan (`scheduling.plan`) holds the result. Not here: grouping rows into micro-batches
(`training.batch`), or the rollout engine's own memory (`rollout.memory`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncrl.scheduling.precision_path import PrecisionPath

GiB = 2**30
CPU_MICRO_BATCH_TOKENS = 8192
"""The training budget on the CPU (and on CUDA when the device or the model's shape is unknown)."""
FORWARD_FACTOR = 2
"""Forward-only budget over the training budget, when `actor.log_prob_micro_batch_tokens` is 0."""
SLACK_BYTES = 2 * GiB
"""Device memory outside the model's tensors: the CUDA context (~0.5 GiB), cuBLAS workspaces,
the weights exported to the engine at a sync."""
ALLOCATOR_SHARE = 0.8
"""Share of the rest that activations may plan for: torch's caching allocator fragments over
micro-batches of different sizes, and backward buffers come and go between the counted tensors."""
LOGIT_COPIES = 3
"""(tokens x head columns) tensors of the output head alive at its backward: the logits, their
gradient, and the entropy's gradient added into it."""
ROUND_TOKENS = 1024
"""A derived budget is a multiple of this (at least one)."""
HEAD_BUFFERS = 3
"""(tokens x chunk) buffers the head over vocabulary chunks (`training.vocab_chunks`) holds at
once, counted as float32: the chunk's logits and its probabilities, and in the backward the
matmul-dtype copy of the chunk's gradient."""
HEAD_MAX_SHARE = 8
"""The chunks' buffers never exceed this share of the full float32 logits, whatever the budget."""
HEAD_ALIGN = 128
"""Chunk rows: a multiple of this (matmul tiles), unless the vocabulary is smaller."""
HEAD_CHUNK_BYTES = {"cuda": 512 << 20, "cpu": 16 << 20}
"""The chunked head's buffer budget on each device."""


def chunk_size(tokens: int, vocab: int, budget_bytes: int, itemsize: int = 4) -> int:
    """Head rows per chunk so that the chunk's `HEAD_BUFFERS` (tokens x chunk) buffers of
    `itemsize` bytes fit `budget_bytes` and at most 1/`HEAD_MAX_SHARE` of the full logits; a
    multiple of 128. Example: 512 tokens, vocabulary 151,936, 16 MiB, float32 -> 16 MiB /
    (3 x 512 x 4) = 2730 -> 2688 rows (57 chunks)."""
    per_row = HEAD_BUFFERS * max(tokens, 1) * itemsize
    budget = min(budget_bytes, max(tokens, 1) * vocab * itemsize // HEAD_MAX_SHARE)
    rows = max(budget // per_row, 1)
    if rows >= vocab:
        return vocab
    return max(rows // HEAD_ALIGN * HEAD_ALIGN, min(HEAD_ALIGN, vocab))


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder with a gated MLP that set its training memory and its FLOPs
    (`telemetry.perf`)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool = False

    @classmethod
    def from_hf(cls, config: Any) -> ModelShape | None:
        """From a transformers config (attribute reads only); None when it lacks a size."""
        try:
            heads = config.num_attention_heads
            return cls(config.hidden_size, config.intermediate_size, config.num_hidden_layers, heads,
                       getattr(config, "num_key_value_heads", None) or heads,
                       getattr(config, "head_dim", None) or config.hidden_size // heads, config.vocab_size,
                       bool(getattr(config, "tie_word_embeddings", False)))
        except AttributeError:
            return None

    @property
    def params(self) -> int:
        """Parameters of the linear layers and the embedding (twice when the head is untied);
        norms and biases, under 0.1%, are left out."""
        s = self
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        layer = s.hidden_size * (2 * q + 2 * kv) + 3 * s.hidden_size * s.intermediate_size
        return s.num_layers * layer + s.vocab_size * s.hidden_size * (1 if s.tied_embeddings else 2)

    def lora_params(self, rank: int) -> int:
        """Adapter parameters at `rank` on every linear layer of the body (target all-linear, an
        upper bound for fewer targets): rank x (inputs + outputs) per layer."""
        s = self
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        widths = 2 * (s.hidden_size + q) + 2 * (s.hidden_size + kv) + 3 * (s.hidden_size + s.intermediate_size)
        return rank * s.num_layers * widths


@dataclass(frozen=True)
class TrainerDevice:
    """What the caller reads for a CUDA trainer: the device's memory and the model's shape."""

    total_bytes: int
    shape: ModelShape


@dataclass(frozen=True)
class TrainerLoad:
    """What the trainer holds besides activations, from the config."""

    compute_bytes: int
    """2 for bfloat16 compute, 4 for float32."""
    precision: PrecisionPath = "autocast"
    """The mixed-precision path (`scheduling.precision_path`): "param_dtype" keeps the residual
    stream and a reference model in bf16; "autocast" (and float32) keep them float32."""
    chunked_head: bool = False
    """The output head runs over vocabulary chunks (`training.vocab_chunks.choose_head`, on CUDA)
    instead of building the full logits."""
    checkpointing: bool = False
    lora_rank: int = 0
    reference: bool = False
    critic: bool = False
    ranks: int = 1
    """FSDP ranks the model states are sharded over."""


def activation_bytes_per_token(shape: ModelShape, *, compute_bytes: int, checkpointing: bool,
                               residual_bytes: int = 4, head_columns: int | None = None,
                               head_itemsize: int | None = None) -> int:
    """Bytes one token of a training micro-batch holds on the device at the backward's peak, for
    a Hugging Face Llama/Qwen2-style decoder (h hidden, I intermediate, q and kv the query and
    key/value widths, c = `compute_bytes`, r = `residual_bytes`: the residual stream is float32
    under autocast, c bytes with bf16 parameters):

    - per RMSNorm, h x (r + 4 + c): its input, the float32 normalised copy, its cast for the
      next matmul; two per layer;
    - attention, c x (4q + 4kv): q, k, v; rotate_half of q and of k; q, k, v as the attention
      kernel saves them; its output;
    - gated MLP, 4 x c x I: gate, up, silu(gate), their product;
    - every layer keeps all of that (`checkpointing`: only its input, h x r), plus one layer's
      worth (two with `checkpointing`: the recomputed layer and its gradients) at the backward;
    - the final norm and the output head: `LOGIT_COPIES` x `head_columns` x `head_itemsize`
      (default c), counted for every token (the head runs on response tokens only, and a
      micro-batch may be all response). `head_columns` defaults to the vocabulary: the full
      logits; the head over vocabulary chunks holds `HEAD_BUFFERS` float32 (tokens x chunk)
      buffers instead (`load_bytes_per_token` passes the chunk width and 4 bytes; 0 counts none).

    Example, Qwen2-0.5B (h 896, I 4864, 24 layers, 14 heads and 2 kv heads of 64, vocabulary
    151,936), bf16: norm 896 x 10 = 8,960; attention 2 x (3,584 + 512) = 8,192; MLP 38,912;
    a layer 65,024; 24 kept + 1 = 1,625,600; head 8,960 + 3 x 151,936 x 2 = 920,576: 2,546,176
    bytes (2.43 MiB) per token. With checkpointing: 24 x 896 x 4 + 2 x 65,024 + 920,576 =
    1,136,640.
    """
    s, c, r = shape, compute_bytes, residual_bytes
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    norm = s.hidden_size * (r + 4 + c)
    layer = 2 * norm + c * (4 * q + 4 * kv) + 4 * c * s.intermediate_size
    kept = s.num_layers * s.hidden_size * r + 2 * layer if checkpointing else (s.num_layers + 1) * layer
    columns = s.vocab_size if head_columns is None else head_columns
    head = norm + LOGIT_COPIES * (c if head_itemsize is None else head_itemsize) * columns
    return kept + head


def load_bytes_per_token(shape: ModelShape, load: TrainerLoad, tokens: int | None) -> int:
    """`activation_bytes_per_token` as `load` trains in micro-batches of `tokens`: its precision
    path's residual stream, and its head: the full logits, or over vocabulary chunks the
    `HEAD_BUFFERS` float32 buffers of the chunk width at `tokens` (None: not counted).

    Example, Qwen2-0.5B, "param_dtype", chunked head, 16,543 tokens: chunk 2,688 columns
    (`chunk_size`); norm 896 x (2 + 4 + 2) = 7,168; a layer 2 x 7,168 + 8,192 + 38,912 = 61,440;
    25 x 61,440 + 7,168 + 3 x 4 x 2,688 = 1,575,424 bytes."""
    columns = None
    if load.chunked_head:
        columns = 0 if tokens is None else chunk_size(tokens, shape.vocab_size, HEAD_CHUNK_BYTES["cuda"])
    return activation_bytes_per_token(
        shape, compute_bytes=load.compute_bytes, checkpointing=load.checkpointing,
        residual_bytes=load.compute_bytes if load.precision == "param_dtype" else 4,
        head_columns=columns, head_itemsize=4 if load.chunked_head else None)


def model_state_bytes(shape: ModelShape, load: TrainerLoad) -> int:
    """The trainer's tensors besides activations: the actor's float32 master weights, gradients
    and AdamW's two moments (16 B per parameter; LoRA: 4 B per base parameter and 16 per
    adapter parameter), a reference's copy (4 B float32; c B under "param_dtype", which holds it
    in bf16 alone), a critic's (16 B), all sharded over `ranks`; plus, below float32, the bf16
    weights the forward and backward use (c B per parameter, unsharded): autocast's per-forward
    casts or "param_dtype"'s working copy, the same bytes.

    Example, Qwen2-0.5B (493,961,216 parameters, tied), bf16, no reference, no critic, one
    rank: 16 x P + 2 x P = 8,891,301,888 bytes (8.28 GiB)."""
    p = shape.params
    actor = 4 * p + 16 * shape.lora_params(load.lora_rank) if load.lora_rank else 16 * p
    reference = (load.compute_bytes if load.precision == "param_dtype" else 4) * p if load.reference else 0
    sharded = actor + reference + (16 * p if load.critic else 0)
    casts = p * load.compute_bytes if load.compute_bytes < 4 else 0
    return sharded // load.ranks + casts


def trainer_bytes(total_bytes: int, engine_share: float) -> int:
    """The device's memory left to the trainer: all of it, less the rollout engine's
    `rollout.gpu_memory_utilization` share when the engine runs on the same device (0 when not)."""
    return int(total_bytes * (1.0 - engine_share))


def cuda_micro_batch_tokens(device: TrainerDevice, engine_share: float, load: TrainerLoad) -> int:
    """The training budget on CUDA: what is left to the trainer less its model states and
    `SLACK_BYTES`, times `ALLOCATOR_SHARE`, over `load_bytes_per_token`, rounded down to a
    multiple of `ROUND_TOKENS` (at least one). A chunked head's width depends on the tokens, so
    the tokens are first sized without its buffers, then with the chunk width at that count
    (`HEAD_BUFFERS` x 4 x chunk x tokens stays within `HEAD_CHUNK_BYTES`, so the second pass
    counts at most that).

    Example: 80 GiB (85,899,345,920 B), colocated with rollout.gpu_memory_utilization=0.5, the
    Qwen2-0.5B numbers above, autocast and the full logits: (42,949,672,960 - 8,891,301,888 -
    2,147,483,648) x 0.8 = 25,528,709,939 B over 2,546,176 B per token = 10,026 -> 9,216
    tokens; with gradient checkpointing (1,136,640 B per token) 22,459 -> 21,504; alone on the
    device (no engine) 23,520 -> 22,528. "param_dtype" and the chunked head (CUDA's defaults):
    over 1,543,168 B per token without the head's buffers 16,543 tokens, chunk 2,688, then over
    1,575,424 B 16,204 -> 15,360 tokens.
    """
    left = trainer_bytes(device.total_bytes, engine_share) - model_state_bytes(device.shape, load) - SLACK_BYTES
    usable = int(max(left, 0) * ALLOCATOR_SHARE)
    first = usable // load_bytes_per_token(device.shape, load, None)
    tokens = usable // load_bytes_per_token(device.shape, load, max(first, 1))
    return max(tokens // ROUND_TOKENS, 1) * ROUND_TOKENS


def micro_batch_budgets(train_tokens: int, forward_tokens: int, derived: int) -> tuple[int, int]:
    """(training, forward-only) budgets from the two keys (0 = derived): the training key, else
    `derived`; the forward-only key, else `FORWARD_FACTOR` x the training budget.
    Example: keys 0 and 0, derived 9216 -> (9216, 18432); keys 4096 and 0 -> (4096, 8192)."""
    train = train_tokens or derived
    return train, forward_tokens or FORWARD_FACTOR * train
