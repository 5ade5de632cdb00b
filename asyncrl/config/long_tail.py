"""The schema of the long-tail remedies' sections (SPEC §4) and of the sandbox that code rewards
run in: one frozen dataclass each, declared as in `schema.py` (type, default, range, docstring).
`schema.Config` holds them; this module only splits the schema to keep each file short.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.config.fields import knob
from asyncrl.config.names import SandboxBackend


@dataclass(frozen=True)
class TailBatchingConfig:
    enable: bool = False
    """Tail batching (RollPacker): short rounds defer the longest prompts; costs accuracy if length is learned."""
    prompt_speculation: float = knob(1.25, ">= 1")
    """Short rounds launch ceil(this x train_batch_size) prompts; the first train_batch_size done are trained."""
    response_speculation: float = knob(1.25, ">= 1")
    """Short rounds sample ceil(this x rollout.n) responses per prompt; the first rollout.n to finish are kept."""


@dataclass(frozen=True)
class RewardSchedulerConfig:
    enable: bool = False
    """Score each response as soon as it finishes, while generation goes on, with adaptive per-test code timeouts."""
    timeout_lambda: float = knob(1.5, "> 0")
    """Adaptive code timeout of a test case: this x the longest run of a correct answer to it so far (T_anchor)."""
    min_timeout_s: float = knob(2.0, "> 0")
    """Lower clamp of the adaptive code timeout."""
    max_timeout_s: float = knob(30.0, "> 0")
    """Upper clamp of the adaptive code timeout; a test case with no correct run yet gets this."""


@dataclass(frozen=True)
class SandboxConfig:
    backend: SandboxBackend = "auto"
    """Where model-written code runs: auto = bwrap if installed, else rlimit with a warning."""
    url: str = ""
    """http backend: SandboxFusion's run_code endpoint, e.g. http://sandbox:8080/run_code."""
    memory_mb: int = knob(1024, ">= 1")
    """Memory limit of one program run (address space)."""
    tmp_mb: int = knob(64, ">= 1")
    """Size of the program's private writable tmp (bwrap: a tmpfs; rlimit: the file-size limit)."""
    max_output_kb: int = knob(1024, ">= 1")
    """Captured stdout/stderr per run; past it the run is killed and fails."""
    max_processes: int = knob(64, ">= 1")
    """Processes one run may have (bwrap: counted inside its own PID namespace)."""


@dataclass(frozen=True)
class StreamTrainerConfig:
    enable: bool = False
    """Colocated: gradients of finished groups while the rest generate; one optimizer step per batch."""
    min_done: float = knob(0.2, "in (0, 1]")
    """The trigger is checked once this fraction of the batch's prompts is done ..."""
    max_done: float = knob(0.5, "in (0, 1]")
    """... and at the latest fires when this fraction is done."""
    check_every: float = knob(0.05, "in (0, 1]")
    """Between min_done and max_done, check at every such step of the done fraction."""


@dataclass(frozen=True)
class TPPlannerConfig:
    enable: bool = False
    """Per step, pick the rollout tensor-parallel size from KV-cache preemptions (RollPacker's planner)."""
    growth: float = knob(1.05, "> 1")
    """Double TP when a step's preemptions exceed this x the previous step's."""
    calm_steps: int = knob(4, ">= 1")
    """Halve TP after this many steps in a row without preemptions (never below rollout.tensor_model_parallel_size)."""
    max_tp: int = knob(8, ">= 1")
    """Largest TP size (a TP group never crosses a node: also capped by rollout.n_gpus_per_node)."""
