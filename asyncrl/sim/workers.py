"""Modelled workers with the real workers' methods: the simulator's rollout server, trainer,
weight transport, and the handle that calls them on the virtual-clock loop.

Each method does what the real one does to the run's state (versions, counts, groups,
metrics) and `await`s the modelled time of its work instead of doing it. Token ids and
log-probs are not modelled: a response carries `RunLength` placeholders of the right length
and its per-token versions as runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from asyncrl.config_schema import Config
from asyncrl.sim import costs
from asyncrl.sim.engine import EngineModel, Finished, GroupSpec, SimEngine
from asyncrl.sim.profile import Profile
from asyncrl.sim.workload import Workload
from asyncrl.sync.tensors import WeightMeta
from asyncrl.telemetry.metrics import timer
from asyncrl.types import Group, Mode, PromptRow, RunLength, Trajectory
from asyncrl.workers.validation import summarise


class SimHandle:
    """A worker handle for modelled workers: every call runs on the loop, no threads."""

    def __init__(self, name: str, obj: Any) -> None:
        self.name, self.obj = name, obj

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.obj, method)(*args, **kwargs)
        return await result if isinstance(result, Coroutine) else result

    def close(self) -> None:
        pass


class SimRolloutServer:
    """One modelled engine of `tp` devices plus its reward workers (`RolloutServer`'s methods)."""

    def __init__(self, cfg: Config, profile: Profile, tp: int, workload: Workload) -> None:
        self.cfg, self.profile, self.workload = cfg, profile, workload
        capacity = cfg.rollout.kv_budget_tokens if profile.device == "cpu" else costs.kv_capacity_tokens(profile, tp)
        model = EngineModel(costs.decode_coefficients(profile, tp), costs.prefill_s_per_token(profile, tp),
                            capacity, cfg.rollout.max_num_seqs)
        self.engine = SimEngine(model)
        self.partial_continuations = 0
        self._groups = 0
        self._reward_s = profile.reward_s / max(cfg.reward.num_workers, 1)

    @property
    def version(self) -> int:
        return self.engine.model.version

    async def generate_scored(self, row: PromptRow, n: int, uid: str, mode: Mode = "train",
                              score: bool = True) -> Group:
        self._groups += 1
        spec = GroupSpec(self._groups, len(row.prompt_ids), self.cfg.data.max_response_length,
                         asyncio.get_running_loop().time())
        finished = await self.engine.generate(spec, self.workload.response_lengths(row, self.version, n))
        group = Group(uid=uid, row=row, trajectories=[_trajectory(f, spec, f"{uid}/{i}", row)
                                                      for i, f in enumerate(finished)])
        return (await self.score([group]))[0] if score else group

    async def score(self, groups: list[Group]) -> list[Group]:
        trajectories = [t for g in groups for t in g.trajectories]
        start = asyncio.get_running_loop().time()
        await asyncio.sleep(len(trajectories) * self._reward_s)
        end = asyncio.get_running_loop().time()
        for t, reward in zip(trajectories, self.workload.rewards(len(trajectories))):
            t.reward = reward
            t.timings["reward_start"], t.timings["reward_end"] = start, end
        return groups

    async def pause(self, interrupt: bool = False) -> None:
        self.partial_continuations += self.engine.pause(interrupt)

    async def resume(self) -> None:
        self.engine.resume()

    def load_weights(self, named_tensors: Any, version: int) -> None:
        self.engine.set_version(version)

    def weights_checksum(self) -> str:
        return f"v{self.version}"

    def get_version(self) -> int:
        return self.version

    async def validate(self, rows: list[PromptRow], k: int, tag: str) -> dict[str, float]:
        metrics: dict[str, float] = {}
        with timer("testing", metrics):
            groups = await asyncio.gather(*(self.generate_scored(r, k, f"{r.uid}@val{tag}", "val")
                                            for r in rows))
        return metrics | summarise(list(groups), k)

    def stats(self) -> dict[str, float]:
        m = self.engine.model
        return {"rollouter/running": len(m.running), "rollouter/waiting": len(m.waiting),
                "rollouter/preemptions": m.preemptions, "sim/generated_tokens": m.generated,
                "fully_async/partial/continuations": self.partial_continuations}


_PLACEHOLDERS: dict[tuple[tuple[int, int], ...], tuple[RunLength[int], RunLength[float], RunLength[int]]] = {}
_MAX_PLACEHOLDERS = 100_000  # responses of one version share them; older versions' go


def _placeholders(runs: tuple[tuple[int, int], ...]) -> tuple[RunLength[int], RunLength[float], RunLength[int]]:
    """(token ids, log-probs, versions) of a response with these version runs: zeros of the
    right length and the runs themselves, immutable and shared by every such response."""
    n = sum(count for _, count in runs)
    return RunLength(((0, n),), n), RunLength(((0.0, n),), n), RunLength(runs, n)


def _trajectory(f: Finished, spec: GroupSpec, request_id: str, row: PromptRow) -> Trajectory:
    n, runs, end = f
    shared = _PLACEHOLDERS.get(runs)
    if shared is None:
        if len(_PLACEHOLDERS) >= _MAX_PLACEHOLDERS:
            _PLACEHOLDERS.clear()
        shared = _PLACEHOLDERS[runs] = _placeholders(runs)
    ids, logprobs, versions = shared
    return Trajectory(request_id, row.prompt_ids, ids, logprobs, versions,  # positional: the fast path
                      "length" if n >= spec.max_tokens else "stop", 0.0, {}, "",
                      {"gen_start": spec.submitted, "gen_end": end})


class SimTrainer:
    """`PPOTrainer`'s methods on modelled time: the same stages, timed under the same names."""

    def __init__(self, cfg: Config, profile: Profile, devices: int, old_log_prob_source: str) -> None:
        self.cfg, self.profile, self.devices = cfg, profile, devices
        self.old_log_prob_source = old_log_prob_source
        self.use_ref = cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
        self.use_critic = cfg.algorithm.adv_estimator == "gae"
        self.version = 0

    async def train_groups(self, groups: Sequence[Group], num_mini_batches: int) -> dict[str, float]:
        p, micro = self.profile, self.cfg.actor.ppo_micro_batch_tokens
        lengths = np.array([len(t.prompt_ids) + len(t.response_ids) for g in groups for t in g.trajectories])
        minis = [m for m in np.array_split(lengths, max(num_mini_batches, 1)) if len(m)]
        metrics: dict[str, float] = {}
        if self.old_log_prob_source != "rollout":
            await self._stage("old_log_prob", costs.logprob_seconds(p, lengths, self.devices, micro), metrics)
        if self.use_ref:
            await self._stage("ref", costs.logprob_seconds(p, lengths, self.devices, micro), metrics)
        if self.use_critic:
            await self._stage("values", costs.logprob_seconds(p, lengths, self.devices, micro), metrics)
        await self._stage("adv", 0.0, metrics)
        if self.use_critic:
            await self._stage("update_critic", costs.update_seconds(
                p, minis, self.devices, micro, self.cfg.critic.ppo_epochs), metrics)
        await self._stage("update_actor", costs.update_seconds(
            p, minis, self.devices, micro, self.cfg.actor.ppo_epochs), metrics)
        self.version += 1
        metrics["sim/train_tokens"] = float(lengths.sum())
        return metrics

    async def _stage(self, name: str, seconds: float, metrics: dict[str, float]) -> None:
        with timer(name, metrics):
            await asyncio.sleep(seconds)

    def get_version(self) -> int:
        return self.version

    def weight_meta(self) -> list[WeightMeta]:
        dtype = "bfloat16" if self.profile.bytes_per_param == 2 else "float32"
        return [("model", (int(self.profile.params_b * 1e9),), dtype)]

    def weights_checksum(self) -> str:
        return f"v{self.version}"

    async def save(self, path: Path) -> None:
        await asyncio.sleep(costs.checkpoint_seconds(self.profile))
        path.mkdir(parents=True, exist_ok=True)
        (path / "sim_trainer.json").write_text(json.dumps({"version": self.version}))

    def load(self, path: Path) -> None:
        self.version = json.loads((path / "sim_trainer.json").read_text())["version"]


class SimTransport:
    """Weight transfer as modelled time: every engine gets the version after `sync_seconds`."""

    def __init__(self, rollouts: Sequence[SimHandle], seconds: float) -> None:
        self.rollouts, self.seconds = list(rollouts), seconds

    async def setup(self, meta: Sequence[WeightMeta]) -> None:
        pass

    async def transfer(self, version: int) -> None:
        await asyncio.sleep(self.seconds)
        for r in self.rollouts:
            await r.call("load_weights", None, version)

    async def close(self) -> None:
        pass
