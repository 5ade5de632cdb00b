"""The cost model: seconds for each modelled piece of work, from a `Profile`. Pure functions.

Rollout (one engine of `tp` devices; roofline terms summed, a smooth stand-in for their max):
the memory-bound terms (weights read once per step, every cached token read once) carry the
fitted `decode_step_s` and `mem_bw_eff`, which the colocated rows constrain (their generation
is dominated by the long tail: few sequences, long contexts); the compute-bound per-sequence
term carries `decode_mfu`, a physical prior (large-batch GEMMs on the device, ~0.5), not fitted,
so a decoupled pool running ~1000 sequences reaches the throughput the hardware allows.

    decode step  = a + b * running_seqs + c * context_tokens
      a = decode_step_s + weight_bytes / (speed * bw)        read every weight once per step
      b = 2 * params / (speed * flops * decode_mfu)           per-sequence matmul FLOPs
      c = kv_bytes_per_token / (speed * bw)                   read every cached token once
    speed = tp * tp_efficiency ** log2(tp),  bw = mem_bw * mem_bw_eff
    prefill      = tokens * 2 * params / (speed * flops * prefill_mfu)
    KV capacity  = (tp * device_mem * gpu_memory_utilization - weight_bytes) / kv_bytes_per_token

A share of an engine (the TP planner, `asyncrl.sim.topology.engine_shape`): a server whose
devices are a fraction `share` of one engine of `tp` devices (share < 1: TP grew past the
server's devices; share > 1: the server holds 1/share engines) is modelled as that fraction of
the engine's batch: `a` stays, `b`, `c` and prefill divide by `share`, KV capacity and
max_num_seqs multiply by it. With the load spread evenly this is exact: k = 1/share servers
each running B/k sequences step as fast as one engine running B.

Training (`devices` GPUs, data-parallel ranks of `sequence_parallel` devices each): a sequence
of length l costs 2*params*l + 2*layers*hidden*l^2 forward FLOPs (the second term: causal
attention). Sequences are balanced over ranks longest-first (snake order, as verl's
seqlen balancing does); a pass takes as long as its busiest rank, plus `micro_batch_s` for
every micro-batch of `micro_tokens` tokens that rank runs (ranks run at `dp_efficiency` per
doubling of their number in an update, fitted from the update times; forward passes have no
gradient reduction and scale linearly). `micro_tokens` is verl's
`ppo_max_token_len_per_gpu` (dynamic batch size): a rank's micro-batches hold at most
`micro_tokens x sequence_parallel` tokens. FSDP communication (`fsdp_comm_seconds`, when the
profile sets `network_gb_s`): every micro-batch all-gathers the parameters in its shard group
(`sim.fsdp_size`, verl's fsdp_size; twice with a backward, which also reduce-scatters
gradients and all-reduces them across replicas), over NVLink when the group fits in a node and
over the network otherwise; the time a GPU spends on it hardly shrinks with more GPUs, which is
why colocated updates sharded across nodes scale sublinearly while a decoupled trainer sharded
within a node (the fully async recipes' fsdp_size 8) does not. A colocated log-prob pass adds `logprob_pass_s`
(reloading the trainer state offloaded for generation; decoupled trainers do not pay it); the
update costs 3x the forward FLOPs per PPO epoch plus `optimizer_step_s`
per mini-batch.

Worked example (h20-qwen2.5-7b, tp=4): a = 4.4 ms, b = 0.12 ms, c = 5.9 ns; a decode step of
256 sequences holding 512K cached tokens takes 4.4 + 31 + 3.0 = 38 ms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from asyncrl.sim.profile import Profile


def engine_speed(p: Profile, tp: int) -> float:
    """Devices' worth of throughput an engine of `tp` devices delivers."""
    return tp * p.tp_efficiency ** math.log2(max(tp, 1))


def decode_coefficients(p: Profile, tp: int) -> tuple[float, float, float]:
    """(a, b, c) of `step_s = a + b * running + c * context_tokens`."""
    speed = engine_speed(p, tp)
    bw = p.mem_bw_gb_s * 1e9 * p.mem_bw_eff * speed
    flops = p.device_tflops * 1e12 * speed
    a = p.decode_step_s + p.weight_bytes / bw
    b = 2 * p.params_b * 1e9 / (flops * p.decode_mfu)
    c = p.kv_bytes_per_token / bw
    return a, b, c


def prefill_s_per_token(p: Profile, tp: int) -> float:
    return 2 * p.params_b * 1e9 / (engine_speed(p, tp) * p.device_tflops * 1e12 * p.prefill_mfu)


def kv_capacity_tokens(p: Profile, tp: int) -> int:
    free = tp * p.device_mem_gb * 1e9 * p.gpu_memory_utilization - p.weight_bytes
    return max(int(free / p.kv_bytes_per_token), 0)


def shared_engine(p: Profile, tp: int, share: float, kv_capacity: int, max_seqs: int
                  ) -> tuple[tuple[float, float, float], float, int, int]:
    """(decode coefficients, prefill s/token, KV capacity, max seqs) of `share` of an engine of
    `tp` devices whose whole KV capacity is `kv_capacity` (module docstring).

    Example: h20-qwen2.5-7b, a 4-GPU server as half of a TP-8 engine: b and c double, the
    capacity is half the TP-8 engine's."""
    a, b, c = decode_coefficients(p, tp)
    prefill = prefill_s_per_token(p, tp)
    return (a, b / share, c / share), prefill / share, int(kv_capacity * share), max(1, round(max_seqs * share))


def forward_flops(p: Profile, lengths: np.ndarray) -> np.ndarray:
    """Forward FLOPs per sequence: dense layers plus causal attention."""
    lengths = lengths.astype(np.float64)
    return 2 * p.params_b * 1e9 * lengths + 2 * p.n_layers * p.hidden * lengths**2


def balance(work: np.ndarray, tokens: np.ndarray, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank (work, tokens) after assigning sequences longest-first in snake order.

    Example: work [5, 4, 3, 2, 1] on 2 ranks: order 5,4 | 3,2 | 1 → ranks get 5+2+1 and 4+3."""
    order = np.argsort(-work, kind="stable")
    i = np.arange(len(order))
    lap, pos = np.divmod(i, ranks)
    rank = np.where(lap % 2 == 0, pos, ranks - 1 - pos)
    per_work, per_tokens = np.zeros(ranks), np.zeros(ranks)
    np.add.at(per_work, rank, work[order])
    np.add.at(per_tokens, rank, tokens[order])
    return per_work, per_tokens


def fsdp_comm_seconds(p: Profile, devices: int, fsdp_size: int, backward: bool) -> float:
    """FSDP's collectives for one micro-batch on each GPU (module docstring): the forward
    all-gathers the bf16 parameters within the shard group; a backward all-gathers them again,
    reduce-scatters fp32 gradients there and all-reduces each shard across the replicas (HSDP).
    A group within one node runs at `nvlink_gb_s`, one spanning nodes at `network_gb_s`.

    Example: 7.62B parameters, 128 GPUs sharded over 32 (4 replicas), 8 GPUs a node, 20 GB/s
    between nodes: a backward moves 31/32 x (2 x 15.2 + 30.5) GB = 59.0 GB in the group and
    2 x 3/4 x 30.5 / 32 GB = 1.43 GB across replicas: 3.02 s; with a shard group of 8 on
    360 GB/s NVLink (16 replicas) it is 53.3 / 360 + 7.14 / 20 = 0.51 s."""
    if p.network_gb_s <= 0:
        return 0.0
    shard = devices if fsdp_size <= 0 else max(1, min(fsdp_size, devices))
    replicas = max(1, devices // shard)
    params = p.params_b * 1e9
    in_group = (shard - 1) / shard * (2 * params * (2 if backward else 1) + (4 * params if backward else 0))
    across = 2 * (replicas - 1) / replicas * 4 * params / shard if backward else 0.0

    def seconds(nbytes: float, span: int) -> float:
        within_node = span <= p.gpus_per_node and p.nvlink_gb_s > 0
        return nbytes / ((p.nvlink_gb_s if within_node else p.network_gb_s) * 1e9)

    return seconds(in_group, shard) + seconds(across, devices)


def pass_seconds(p: Profile, lengths: np.ndarray, devices: int, micro_tokens: int,
                 flops_factor: float, mfu: float, dp_efficiency: float = 1.0, comm_s: float = 0.0) -> float:
    """One pass (forward, or forward+backward with flops_factor 3) over these sequences; ranks
    keep `dp_efficiency` of their speed per doubling of their number (a profile without FSDP
    communication: updates only, forward passes scale linearly); each micro-batch costs
    `micro_batch_s` plus `comm_s` (`fsdp_comm_seconds`)."""
    if len(lengths) == 0:
        return 0.0
    sp = max(1, min(p.sequence_parallel, devices))
    ranks = max(1, devices // sp)
    work, tokens = balance(flops_factor * forward_flops(p, lengths), lengths.astype(np.float64), ranks)
    compute = work / (sp * p.device_tflops * 1e12 * mfu * dp_efficiency ** math.log2(ranks))
    micro = np.ceil(tokens / (max(micro_tokens, 1) * sp)) * (p.micro_batch_s + comm_s)
    return float(np.max(compute + micro))


def logprob_seconds(p: Profile, lengths: np.ndarray, devices: int, micro_tokens: int,
                    colocated: bool = True, fsdp_size: int = -1) -> float:
    """Old or reference log-probs of a batch: one forward pass, plus the colocated pipeline's
    reload of the offloaded trainer state after generation (`logprob_pass_s`; a decoupled
    trainer keeps its weights resident and does not pay it)."""
    fixed = p.logprob_pass_s if colocated else 0.0
    comm = fsdp_comm_seconds(p, devices, fsdp_size, backward=False)
    return fixed + pass_seconds(p, lengths, devices, micro_tokens, 1.0, p.logprob_mfu, comm_s=comm)


def update_seconds(p: Profile, mini_batches: Sequence[np.ndarray], devices: int, micro_tokens: int,
                   epochs: int, fsdp_size: int = -1) -> float:
    """The actor (or critic) update: per epoch, forward+backward of each mini-batch, then a step."""
    comm = fsdp_comm_seconds(p, devices, fsdp_size, backward=True)
    per_epoch = sum(pass_seconds(p, mb, devices, micro_tokens, 3.0, p.train_mfu, p.dp_efficiency, comm)
                    + p.optimizer_step_s
                    for mb in mini_batches)
    return epochs * per_epoch


def sync_seconds(p: Profile) -> float:
    return p.sync_s + p.weight_bytes / (p.sync_gb_s * 1e9)


def checkpoint_seconds(p: Profile) -> float:
    """Weights + fp32 master weights + Adam moments: ~8x the bf16 weight bytes."""
    return 8 * p.weight_bytes / (p.checkpoint_gb_s * 1e9)


def reward_model_seconds(p: Profile, lengths: np.ndarray, devices: int, micro_tokens: int) -> float:
    """A learned reward model (`reward.model_path`) scoring these prompt + response sequences: one
    forward pass on the rollout engine's `devices`, the reward model taken as the policy's size
    (the profile's; recipes pair a policy with a reward model of its family), micro-batches of
    `micro_tokens` (reward.model_batch_size sequences of the longest length).

    Example: like `logprob_seconds` of a decoupled trainer on those devices (no reload)."""
    return pass_seconds(p, lengths, devices, micro_tokens, 1.0, p.logprob_mfu)
