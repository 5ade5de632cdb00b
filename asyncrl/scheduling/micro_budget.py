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
    """2 for bfloat16 compute (autocast over float32 master weights), 4 for float32."""
    checkpointing: bool = False
    lora_rank: int = 0
    reference: bool = False
    critic: bool = False
    ranks: int = 1
    """FSDP ranks the model states are sharded over."""


def activation_bytes_per_token(shape: ModelShape, *, compute_bytes: int, checkpointing: bool,
                               residual_bytes: int = 4, head_columns: int | None = None) -> int:
    """Bytes one token of a training micro-batch holds on the device at the backward's peak, for
    a Hugging Face Llama/Qwen2-style decoder under autocast (h hidden, I intermediate, q and kv
    the query and key/value widths, c = `compute_bytes`, r = `residual_bytes`: the residual
    stream is float32 over float32 master weights):

    - per RMSNorm, h x (r + 4 + c): its input, the float32 normalised copy, its cast for the
      next matmul; two per layer;
    - attention, c x (4q + 4kv): q, k, v; rotate_half of q and of k; q, k, v as the attention
      kernel saves them; its output;
    - gated MLP, 4 x c x I: gate, up, silu(gate), their product;
    - every layer keeps all of that (`checkpointing`: only its input, h x r), plus one layer's
      worth (two with `checkpointing`: the recomputed layer and its gradients) at the backward;
    - the final norm and the output head: `LOGIT_COPIES` x `head_columns` x c, counted for
      every token (the head runs on response tokens only, and a micro-batch may be all
      response). `head_columns` defaults to the vocabulary: the full logits, an upper bound for
      the head over vocabulary chunks (`training.vocab_chunks`), whose buffers do not grow with
      the tokens (0 counts none).

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
    head = norm + LOGIT_COPIES * c * (s.vocab_size if head_columns is None else head_columns)
    return kept + head


def model_state_bytes(shape: ModelShape, load: TrainerLoad) -> int:
    """The trainer's tensors besides activations: the actor's float32 master weights, gradients
    and AdamW's two moments (16 B per parameter; LoRA: 4 B per base parameter and 16 per
    adapter parameter), a reference's float32 copy (4 B), a critic's (16 B), all sharded over
    `ranks`; plus autocast's per-forward weight casts (c B per parameter, unsharded) below
    float32.

    Example, Qwen2-0.5B (493,961,216 parameters, tied), bf16, no reference, no critic, one
    rank: 16 x P + 2 x P = 8,891,301,888 bytes (8.28 GiB)."""
    p = shape.params
    actor = 4 * p + 16 * shape.lora_params(load.lora_rank) if load.lora_rank else 16 * p
    sharded = actor + (4 * p if load.reference else 0) + (16 * p if load.critic else 0)
    casts = p * load.compute_bytes if load.compute_bytes < 4 else 0
    return sharded // load.ranks + casts


def trainer_bytes(total_bytes: int, engine_share: float) -> int:
    """The device's memory left to the trainer: all of it, less the rollout engine's
    `rollout.gpu_memory_utilization` share when the engine runs on the same device (0 when not)."""
    return int(total_bytes * (1.0 - engine_share))


def cuda_micro_batch_tokens(device: TrainerDevice, engine_share: float, load: TrainerLoad) -> int:
    """The training budget on CUDA: what is left to the trainer less its model states and
    `SLACK_BYTES`, times `ALLOCATOR_SHARE`, over `activation_bytes_per_token`, rounded down to
    a multiple of `ROUND_TOKENS` (at least one).

    Example: 80 GiB (85,899,345,920 B), colocated with rollout.gpu_memory_utilization=0.5, the
    Qwen2-0.5B numbers above: (42,949,672,960 - 8,891,301,888 - 2,147,483,648) x 0.8 =
    25,528,709,939 B over 2,546,176 B per token = 10,026 -> 9,216 tokens; with gradient
    checkpointing (1,136,640 B per token) 22,459 -> 21,504; alone on the device (no engine)
    23,520 -> 22,528.
    """
    left = trainer_bytes(device.total_bytes, engine_share) - model_state_bytes(device.shape, load) - SLACK_BYTES
    per_token = activation_bytes_per_token(device.shape, compute_bytes=load.compute_bytes,
                                           checkpointing=load.checkpointing)
    tokens = int(max(left, 0) * ALLOCATOR_SHARE) // per_token
    return max(tokens // ROUND_TOKENS, 1) * ROUND_TOKENS


def micro_batch_budgets(train_tokens: int, forward_tokens: int, derived: int) -> tuple[int, int]:
    """(training, forward-only) budgets from the two keys (0 = derived): the training key, else
    `derived`; the forward-only key, else `FORWARD_FACTOR` x the training budget.
    Example: keys 0 and 0, derived 9216 -> (9216, 18432); keys 4096 and 0 -> (4096, 8192)."""
    train = train_tokens or derived
    return train, forward_tokens or FORWARD_FACTOR * train
