"""The roles a run's workers play, as protocols: the whole contract between pipelines, the weight
synchronizer and the workers, whatever substrate they live on.

    pipelines ──▶ RolloutSide (generate_scored, score, abort, stats)             one per rollout host
              ──▶ TrainerSide (train_groups, save, load)                          one per run
    synchronizer ──▶ WeightSource (the trainer's half) ──▶ WeightSink (every rollout host's half)
    RolloutSide ──▶ Engine (generate, abort, pause/resume, load_weights, stats)    inside a host

Every role method is a coroutine: pipelines `await ctx.trainer.train_groups(groups)` on a proxy
that the substrate (in-process, Ray actor, simulator) types as the worker class it hosts, so
`mypy` checks each call against these protocols, and each implementation (the real workers,
the simulator's modelled ones, a new engine) against the protocol it is assigned to.

`Engine` is written so that vLLM's `AsyncLLM` maps onto it one to one (docs/architecture.md):
generate → `generate` (iterate to the final output), abort → `abort(request_ids)`, abort_all →
`abort` of every id in flight, pause → `pause_generation(mode=...)`, resume →
`resume_generation()`, load_weights → the weight-transfer API (`update_weights`, NCCL or CUDA
IPC), stats → its scheduler stats.

Not here: how a call reaches a worker (`asyncrl.workers.handles`, `asyncrl.workers.ray_host`,
`asyncrl.sim.workers`), which substrate builds which worker (`asyncrl.substrates`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from asyncrl.types import EngineStats, GenerationRequest, Group, Mode, PromptRow, Trajectory

if TYPE_CHECKING:
    import torch

    from asyncrl.types import NamedTensors, WeightMeta

PauseMode = Literal["abort", "keep"]
"""What a pause does to requests in flight: "abort" stops them and hands back their partial
trajectories; "keep" freezes them at a step boundary and they continue on resume."""


class Engine(Protocol):
    """One rollout engine: continuous batching over one copy of the policy.

    Many `generate` calls are in flight at once; each resolves when its response finishes, or
    with the partial trajectory (finish_reason "aborted", tokens, log-probs and per-token
    versions so far) when the request is aborted. Tokens sampled after `load_weights(.., v)`
    carry version v.
    """

    async def generate(self, request: GenerationRequest) -> Trajectory:
        """One response to `request`; stop, length, or aborted with what it has."""
        ...

    async def abort(self, request_ids: Iterable[str]) -> list[Trajectory]:
        """Stop these requests (unknown or finished ids are skipped): their partial trajectories.
        Each one's pending `generate` resolves to the same trajectory."""
        ...

    async def abort_all(self) -> list[Trajectory]:
        """`abort` every request in flight or queued."""
        ...

    async def pause(self, mode: PauseMode = "keep") -> list[Trajectory]:
        """Stop stepping; returns once no step is in flight. "abort" also aborts every request
        in flight and returns their partials; "keep" returns [] and keeps them queued."""
        ...

    async def resume(self) -> None:
        """Continue stepping (kept requests first, then new ones)."""
        ...

    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy these tensors into the engine's weights in place, between two steps; later tokens
        carry `version`. Pause first for a clean cut."""
        ...

    def weights_checksum(self) -> str:
        """A digest of the weights the engine holds (compared with the trainer's after a sync)."""
        ...

    def stats(self) -> EngineStats:
        """Running and waiting requests, preemptions, KV usage, tokens/s, version."""
        ...


class WeightSink(Protocol):
    """The rollout side's half of a weight sync (`asyncrl.sync.ParameterSynchronizer`)."""

    async def pause(self, mode: PauseMode = "keep") -> None:
        """Stop generating for a weight load. "abort" is partial rollout: requests in flight are
        interrupted and, after `resume`, continue from prompt + partial response under the new
        weights (one trajectory then spans versions). "keep" only stops at a step boundary."""
        ...

    async def resume(self) -> None:
        ...

    async def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Load into every engine of this host (copying) and set the policy version."""
        ...

    async def receive_weights(self, group_name: str, meta: Sequence[WeightMeta], version: int,
                              bucket_mb: float) -> None:
        """Receive the trainer's broadcast over the collective group, then `load_weights`."""
        ...

    async def weights_checksum(self) -> str:
        ...


class RolloutSide(WeightSink, Protocol):
    """A rollout host: engines + reward workers; turns prompts into scored groups."""

    async def generate_scored(self, row: PromptRow, n: int, uid: str, mode: Mode = "train",
                              score: bool = True, partials: Sequence[Trajectory] = (),
                              keep: int = 0) -> Group:
        """The n responses to `row` (request ids `{uid}/{i}`), scored once the last one is done.
        A response aborted through `abort` comes back with finish_reason "aborted", unscored.
        `partials`: this group's responses from a stopped run (its checkpoint): a finished one
        is kept, an aborted one continues from its tokens, log-probs and versions.
        `keep` > 0 (tail batching): the group is done once `keep` responses finished; the others
        are aborted and come back after the kept ones as "aborted" (a response that finished in
        the same step as the last kept one too), so `unaborted()` is exactly the first `keep`."""
        ...

    async def score(self, groups: list[Group]) -> list[Group]:
        """Rewards for these groups (in the reward process pool; generation keeps running)."""
        ...

    async def abort(self, request_ids: Sequence[str]) -> list[Trajectory]:
        """Stop these requests for good (never continued): their partial trajectories, each with
        its tokens, behaviour log-probs and versions. Ids not in flight here are skipped."""
        ...

    async def stats(self) -> dict[str, float]:
        """Engine and reward metrics (`rollouter/*`, `reward/*`)."""
        ...


class WeightSource(Protocol):
    """The trainer's half of a weight sync."""

    async def weight_meta(self) -> list[WeightMeta]:
        """(name, shape, dtype) of every tensor a sync sends, in send order."""
        ...

    async def export_weights(self) -> dict[str, torch.Tensor]:
        """The actor's tensors by name, uncopied (the receiver copies)."""
        ...

    async def broadcast_weights(self, group_name: str, bucket_mb: float) -> int:
        """Send them over the collective group in buckets; returns the bytes sent."""
        ...

    async def weights_checksum(self) -> str:
        ...


class TrainerSide(WeightSource, Protocol):
    """The actor (+ reference, + critic) and the PPO/GRPO step."""

    async def train_groups(self, groups: Sequence[Group]) -> dict[str, float]:
        """One policy update on these groups (mini-batches of actor.ppo_mini_batch_size prompts);
        returns its stage timings and training metrics."""
        ...

    async def accumulate_groups(self, groups: Sequence[Group]) -> dict[str, float]:
        """Stream trainer: the gradients of these finished groups, kept for `apply_update`; the
        weights do not change. Returns this chunk's stage timings and statistics."""
        ...

    async def apply_update(self) -> dict[str, float]:
        """Stream trainer: one optimizer step on every group accumulated since the last one, with
        the result and metric keys of `train_groups` on them as one batch."""
        ...

    async def save(self, path: Path) -> None:
        """Actor (HF format + optimizer + RNG), critic and controller state under `path`."""
        ...

    async def load(self, path: Path) -> None:
        ...
