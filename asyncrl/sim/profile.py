"""A hardware + model profile: what the simulator's cost model knows about a cluster and a model.

The physical part (peak FLOP/s, memory and bandwidth per device, the model's shape) comes from
data sheets; the efficiency part (MFUs, fixed per-step and per-micro-batch costs) is fitted to
measured steps (`asyncrl sim --fit`, `asyncrl.sim.fit`). Built-in profiles live next to this
module as YAML (`h20-qwen2.5-7b`: SPEC §6's DAPO runs; `cpu-tiny`: this repository's tiny model
on a 2-core laptop; `h800-qwen2.5-7b`, `-14b`, `-32b`: RollPacker's settings, H800 data-sheet
numbers with the H20 profile's efficiencies carried over, unmeasured, as their comments say).
A profile says nothing about the workload or the pipeline: those come from the run's config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from asyncrl.errors import ConfigError

PROFILE_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True)
class Profile:
    name: str
    """Short name (the YAML file's stem for built-ins)."""
    description: str
    """Where the numbers come from."""
    device: str
    """'gpu': devices are rollout.n_gpus_per_node x nnodes GPUs; 'cpu': devices are cores (num_cpus)."""
    device_tflops: float
    """Dense peak TFLOP/s of one device at the training dtype."""
    device_mem_gb: float
    """Memory of one device (KV cache capacity is derived from it)."""
    mem_bw_gb_s: float
    """Memory bandwidth of one device."""
    params_b: float
    """Model parameters, billions."""
    n_layers: int
    """Transformer layers (attention FLOPs grow with layers x hidden x length^2)."""
    hidden: int
    """Hidden size."""
    kv_bytes_per_token: float
    """KV-cache bytes per token (2 x layers x kv_heads x head_dim x dtype bytes)."""
    bytes_per_param: float
    """Bytes per parameter in the rollout engine and in weight sync (2 for bf16)."""
    decode_step_s: float
    """Fitted: fixed cost of one decode step (kernel launches, scheduling, TP all-reduce latency)."""
    decode_mfu: float
    """Fitted: fraction of peak FLOP/s reached by the per-sequence decode compute."""
    mem_bw_eff: float
    """Fitted: fraction of memory bandwidth reached reading weights and KV cache."""
    prefill_mfu: float
    """Fitted: fraction of peak FLOP/s reached by prefill (and recompute after preemption)."""
    tp_efficiency: float
    """Fitted: speed kept per doubling of the devices of one engine (1.0 = perfect TP scaling)."""
    gpu_memory_utilization: float
    """Fraction of device memory the engine may use for weights + KV cache (vLLM's knob)."""
    train_mfu: float
    """Fitted: MFU of the actor update (forward + backward, 3x forward FLOPs)."""
    logprob_mfu: float
    """Fitted: MFU of old/ref log-prob forward passes."""
    micro_batch_s: float
    """Fitted: fixed cost per micro-batch per pass (FSDP all-gather / reduce-scatter, launches)."""
    logprob_pass_s: float
    """Fitted: fixed cost per log-prob pass (e.g. reloading offloaded parameters after generation)."""
    optimizer_step_s: float
    """Fitted: fixed cost per optimizer step (grad clip, AdamW, FSDP reduce)."""
    sequence_parallel: int = 1
    """Ulysses sequence-parallel degree of the trainer: devices per data-parallel rank."""
    dp_efficiency: float = 1.0
    """Fitted: training speed kept per doubling of data-parallel ranks (1.0 = linear; CPU threads less)."""
    rollout_wake_s: float = 0.0
    """Colocated only: each generation phase first wakes the engines (weights resharded from the
    trainer into them, KV cache allocated again) and ends by putting them to sleep; measured as
    a colocated run's `gen` minus its `generate_sequences`."""
    network_gb_s: float = 0.0
    """Fitted: inter-node bandwidth per GPU reached by the trainer's FSDP collectives, GB/s
    (0 = FSDP communication not modelled; `costs.fsdp_comm_seconds`)."""
    nvlink_gb_s: float = 0.0
    """Intra-node bandwidth per GPU of those collectives (data sheet, NCCL bus bandwidth), GB/s."""
    gpus_per_node: int = 8
    """GPUs a node holds: an FSDP group within one node communicates over NVLink."""
    sync_gb_s: float = 10.0
    """Weight-sync bandwidth, GB/s (trainer to all engines)."""
    sync_s: float = 0.5
    """Fixed cost per weight sync (pause, resharding, resume)."""
    reward_s: float = 0.001
    """Seconds to score one response, per reward worker."""
    checkpoint_gb_s: float = 1.0
    """Checkpoint write bandwidth (weights + optimizer state, 8x the bf16 weights)."""

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_param


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a YAML file written by `asyncrl sim --fit`."""
    builtin = PROFILE_DIR / f"{name_or_path}.yaml"
    path = builtin if builtin.exists() else Path(name_or_path)
    if not path.exists():
        raise ConfigError(f"sim.profile: no profile {name_or_path!r}; built-ins: {', '.join(builtin_profiles())} "
                          "or a YAML file from `asyncrl sim --fit`")
    raw = yaml.safe_load(path.read_text()) or {}
    known = {f.name for f in dataclasses.fields(Profile)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown profile keys {unknown}; valid keys: {sorted(known)}")
    try:
        return Profile(**raw)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def save_profile(profile: Profile, path: Path) -> None:
    path.write_text(yaml.safe_dump(dataclasses.asdict(profile), sort_keys=False))


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
