"""Modelled workers playing the real roles (`asyncrl.roles`): the simulator's rollout server,
trainer and weight transport, called directly on the virtual-clock loop.

Each method does what the real one does to the run's state (versions, counts, groups,
metrics) and `await`s the modelled time of its work instead of doing it. Token ids and
log-probs are not modelled: a response carries `RunLength` placeholders of the right length
and its per-token versions as runs. `mypy` checks both classes against their protocols
(`asyncrl.sim.substrate` assigns them to `RolloutSide` / `TrainerSide`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncrl.config.schema import Config
from asyncrl.errors import ConfigError
from asyncrl.roles import PauseMode, WeightSink
from asyncrl.scheduling.batching import num_mini_batches
from asyncrl.scheduling.old_log_probs import PASS_SOURCES
from asyncrl.scheduling.plan import RunPlan
from asyncrl.sim import costs, episodes
from asyncrl.sim.engine import EngineModel, Finished, GroupSpec, Runs, SimEngine, extend_runs
from asyncrl.sim.profile import Profile
from asyncrl.sim.topology import engine_shape, kv_capacity
from asyncrl.sim.workload import Workload
from asyncrl.telemetry.metrics import timer
from asyncrl.types import FinishReason, Group, Mode, PromptRow, RunLength, Trajectory, WeightMeta


class SimRolloutServer:
    """One modelled engine of `tp` devices plus its reward workers (`RolloutServer`'s methods)."""

    def __init__(self, cfg: Config, profile: Profile, tp: int, workload: Workload) -> None:
        self.cfg, self.profile, self.workload = cfg, profile, workload
        # rollout.admit_min_free_slots 0 models 1: the profiles were fitted to engines that admit
        # whenever a slot frees (vLLM on the GPU profiles), and the model has no per-step prefill cost
        multi_turn = cfg.rollout.multi_turn
        if multi_turn.enable and cfg.tail_batching.enable:
            raise ConfigError("sim: tail_batching.enable=true with rollout.multi_turn.enable=true is not modelled; "
                              "set one of them false")
        model = EngineModel(costs.decode_coefficients(profile, tp), costs.prefill_s_per_token(profile, tp),
                            kv_capacity(cfg, profile, tp), cfg.rollout.max_num_seqs,
                            min_free_slots=cfg.rollout.admit_min_free_slots or 1,
                            prefix_caching=cfg.sim.prefix_caching, keep_slot=multi_turn.keep_slot == "keep")
        self.multi_turn = multi_turn.enable  # responses are episodes (asyncrl.sim.episodes)
        self.engine = SimEngine(model)
        self.partial_continuations = 0
        self._groups = 0
        self._in_flight: dict[str, GroupSpec] = {}  # uid -> its group, for `abort`
        self._reward_s = profile.reward_s / max(cfg.reward.num_workers, 1)
        self._tp = tp  # where a reward model runs: beside the engine
        self._placeholders = Placeholders()

    @property
    def version(self) -> int:
        return self.engine.model.version

    async def generate_scored(self, row: PromptRow, n: int, uid: str, mode: Mode = "train",
                              score: bool = True, partials: Sequence[Trajectory] = (),
                              keep: int = 0) -> Group:
        assert not (keep and partials), "tail batching never continues a stopped run's responses"
        self._groups += 1
        plans = self.workload.episodes(row, self.version, n) if self.multi_turn else None
        lengths = self.workload.response_lengths(row, self.version, n) if plans is None else \
            [episodes.response_tokens(p) for p in plans]
        cut = _cut_by_keep(lengths, keep)
        kept, todo, lengths = _continue_partials(partials, lengths)
        offsets = {i: len(before.response_ids) if before is not None else 0 for i, before in todo}
        turns = None
        if plans is not None:  # each episode from where it is (a stopped one continues from there)
            shaped = [episodes.engine_turns(plans[i], offsets[i]) for i, _ in todo]
            lengths, turns = [n for n, _ in shaped], tuple(t for _, t in shaped)
        spec = GroupSpec(self._groups, len(row.prompt_ids), self.cfg.data.max_response_length,
                         asyncio.get_running_loop().time(), turns)
        self._in_flight[uid] = spec
        try:
            finished = await self.engine.generate(spec, lengths) if lengths else ()
        finally:
            del self._in_flight[uid]
        if partials:  # the engine numbered the responses still to generate: back to their group indices
            finished = tuple((*f[:3], todo[f[3]][0], f[4]) for f in finished)
        trajectories = self._trajectories(finished, spec, uid, row)
        if plans is not None:
            for t in trajectories:
                episodes.fill(t, plans[_index(t)], offsets[_index(t)])
        if partials:  # a stopped run's responses: the finished ones, then the aborted ones continued
            before = dict(todo)
            trajectories = kept + [_after(before[_index(t)], t) for t in trajectories]
            self.partial_continuations += sum(1 for b in before.values() if b is not None)
        if cut:
            trajectories = _keep_first(trajectories, cut)
        group = Group(uid=uid, row=row, trajectories=trajectories)
        done = group.unaborted()
        if score and done.trajectories:
            await (self._score_streamed(done) if self.cfg.reward_scheduler.enable else self.score([done]))
        return group

    async def _score_streamed(self, group: Group) -> None:
        """Reward scheduler: each response was scored as it finished, hidden behind the others'
        generation; only the last one's reward is still to wait for."""
        await asyncio.sleep(self._reward_s + self._reward_model_s(group.trajectories[-1:]))
        end = asyncio.get_running_loop().time()
        for t, reward in zip(group.trajectories, self.workload.rewards(len(group.trajectories))):
            t.reward = reward
            t.timings["reward_start"] = t.timings["gen_end"]
            t.timings["reward_end"] = min(t.timings["gen_end"] + self._reward_s, end)

    def _trajectories(self, finished: Sequence[Finished], spec: GroupSpec, uid: str,
                      row: PromptRow | None) -> list[Trajectory]:
        """The `Trajectory` of each finished or aborted response (3M in a long run: one loop, no
        call per response)."""
        self._placeholders.of_version(self.version)
        tokens, versions = self._placeholders.tokens, self._placeholders.runs
        prompt = row.prompt_ids if row is not None else RunLength(((0, spec.prompt_len),))
        out = []
        for n, runs, end, index, aborted in finished:
            shared = tokens.get(n) or self._placeholders.add_tokens(n)
            runs_of = versions.get(runs) or self._placeholders.add_runs(runs, n)
            reason: FinishReason = "aborted" if aborted else "length" if n >= spec.max_tokens else "stop"
            out.append(Trajectory(f"{uid}/{index}", prompt, shared[0], shared[1], runs_of, reason,  # positional: fast
                                  0.0, {}, "aborted" if aborted else "", {"gen_start": spec.submitted, "gen_end": end}))
        return out

    async def score(self, groups: list[Group]) -> list[Group]:
        trajectories = [t for g in groups for t in g.trajectories]
        start = asyncio.get_running_loop().time()
        await asyncio.sleep(len(trajectories) * self._reward_s + self._reward_model_s(trajectories))
        end = asyncio.get_running_loop().time()
        for t, reward in zip(trajectories, self.workload.rewards(len(trajectories))):
            t.reward = reward
            t.timings["reward_start"], t.timings["reward_end"] = start, end
        return groups

    def _reward_model_s(self, trajectories: Sequence[Trajectory]) -> float:
        """The reward model's forward over these responses (none without reward.model_path)."""
        r, d = self.cfg.reward, self.cfg.data
        if not r.model_path or not trajectories:
            return 0.0
        lengths = np.array([len(t.prompt_ids) + len(t.response_ids) for t in trajectories])
        micro = r.model_batch_size * (d.max_prompt_length + d.max_response_length)
        return costs.reward_model_seconds(self.profile, lengths, self._tp, micro)

    async def abort(self, request_ids: Sequence[str]) -> list[Trajectory]:
        """Stop these responses (`{uid}/{i}`) where they are; ids not in flight here are skipped."""
        by_uid: dict[str, set[int]] = {}
        for rid in request_ids:
            uid, _, index = rid.rpartition("/")
            if uid in self._in_flight and index.isdigit():
                by_uid.setdefault(uid, set()).add(int(index))
        partials = []
        for uid, indices in by_uid.items():
            spec = self._in_flight[uid]
            partials += self._trajectories(self.engine.abort(spec.group, indices), spec, uid, None)
        return partials

    async def pause(self, mode: PauseMode = "keep") -> None:
        self.partial_continuations += self.engine.pause(mode == "abort")

    async def resume(self) -> None:
        self.engine.resume()

    async def load_weights(self, named_tensors: Any, version: int) -> None:
        self._new_weights(version)

    async def receive_weights(self, group_name: str, meta: Sequence[WeightMeta], version: int,
                              bucket_mb: float) -> None:
        self._new_weights(version)  # the transfer's time is the trainer's broadcast

    def _new_weights(self, version: int) -> None:
        """A colocated engine then wakes up for the next generation phase (`rollout_wake_s`)."""
        self.engine.set_version(version)
        if self.cfg.pipeline == "colocated" and self.profile.rollout_wake_s > 0:
            self.engine.busy_for(self.profile.rollout_wake_s)

    async def weights_checksum(self) -> str:
        return f"v{self.version}"

    async def stats(self) -> dict[str, float]:
        m = self.engine.model
        return {"rollouter/running": len(m.running), "rollouter/waiting": len(m.waiting),
                "rollouter/preemptions": m.preemptions, "sim/generated_tokens": m.generated,
                "sim/prefilled_tokens": m.prefilled,
                "fully_async/partial/continuations": self.partial_continuations}

    async def set_tensor_parallel(self, tp: int) -> None:
        """Rollout TP `tp` from now on (the TP planner, `asyncrl.pipelines.planning`): this
        server's devices become a share of an engine of `tp` devices, or hold several such
        engines (`asyncrl.sim.topology.engine_shape`)."""
        self.engine.retune(*engine_shape(self.cfg, self.profile, tp))


class Placeholders:
    """The token ids, log-probs and versions of modelled responses: immutable `RunLength`s
    shared by the responses of one policy version with the same length (ids, log-probs: zeros)
    and the same version runs. The caches restart at each new version, so they never grow with
    the run (runs name their versions: a run-long cache would keep every distinct response)."""

    def __init__(self) -> None:
        self.tokens: dict[int, tuple[RunLength[int], RunLength[float]]] = {}
        self.runs: dict[Runs, RunLength[int]] = {}
        self.version = -1

    def of_version(self, version: int) -> None:
        if version != self.version:
            self.tokens, self.runs, self.version = {}, {}, version

    def add_tokens(self, n: int) -> tuple[RunLength[int], RunLength[float]]:
        shared = self.tokens[n] = (RunLength(((0, n),), n), RunLength(((0.0, n),), n))
        return shared

    def add_runs(self, runs: Runs, n: int) -> RunLength[int]:
        shared = self.runs[runs] = RunLength(runs, n)
        return shared


def _cut_by_keep(lengths: list[int], keep: int) -> set[int]:
    """Tail batching's `keep`: the responses past the first `keep` to finish (shortest first;
    they decode in lockstep). Each is cut to the last kept one's length, where it is aborted."""
    if not keep or keep >= len(lengths):
        return set()
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    last = lengths[order[keep - 1]]
    cut = set(order[keep:])
    for i in cut:
        lengths[i] = last
    return cut


def _keep_first(trajectories: list[Trajectory], cut: set[int]) -> list[Trajectory]:
    kept = [t for t in trajectories if _index(t) not in cut]
    dropped = sorted((t for t in trajectories if _index(t) in cut), key=_index)
    return kept + [dataclasses.replace(t, finish_reason="aborted", reward_status="aborted") for t in dropped]


def _index(t: Trajectory) -> int:
    return int(t.request_id.rpartition("/")[2])


def _continue_partials(partials: Sequence[Trajectory], lengths: list[int]
                       ) -> tuple[list[Trajectory], list[tuple[int, Trajectory | None]], list[int]]:
    """Which responses of a group to generate: (finished ones kept as they are, (index, the
    aborted response it continues or None) per response to generate, their remaining lengths)."""
    if not partials:
        return [], [(i, None) for i in range(len(lengths))], lengths
    earlier = {_index(t): t for t in partials}
    kept = [t for t in partials if t.finish_reason != "aborted"]
    todo = [(i, earlier.get(i)) for i in range(len(lengths))
            if i not in earlier or earlier[i].finish_reason == "aborted"]
    left = [max(lengths[i] - (len(before.response_ids) if before is not None else 0), 1) for i, before in todo]
    return kept, todo, left


def _after(before: Trajectory | None, rest: Trajectory) -> Trajectory:
    """`rest` continuing `before` (a response aborted by a stopped run): one response whose
    version runs are both parts'."""
    if before is None:
        return rest
    runs = _runs(before.versions)
    for version, count in _runs(rest.versions):
        runs = extend_runs(runs, version, count)
    ids, logprobs, versions = _placeholders(runs)
    if rest.loss_mask:  # an episode: its mask and counters joined too
        mask, counters = episodes.join(before, rest)
        return dataclasses.replace(rest, response_ids=ids, logprobs=logprobs, versions=versions,
                                   loss_mask=mask, episode=counters)
    return dataclasses.replace(rest, response_ids=ids, logprobs=logprobs, versions=versions)


def _runs(versions: Sequence[int]) -> Runs:
    if isinstance(versions, RunLength):
        return versions.runs
    return tuple((v, len(list(g))) for v, g in itertools.groupby(versions))


def _placeholders(runs: tuple[tuple[int, int], ...]) -> tuple[RunLength[int], RunLength[float], RunLength[int]]:
    """(token ids, log-probs, versions) of a response with these version runs: zeros of the
    right length and the runs themselves, immutable and shared by every such response."""
    n = sum(count for _, count in runs)
    return RunLength(((0, n),), n), RunLength(((0.0, n),), n), RunLength(runs, n)


class SimTrainer:
    """`PPOTrainer`'s methods on modelled time: the same stages, timed under the same names.
    The stream trainer's chunk costs its log-prob passes and 3x-forward gradient pass now
    (`accumulate_groups`); `apply_update` costs one `optimizer_step_s`. Old log-probs are always
    recomputed there (the stream trainer runs colocated). The run plan says where old log-probs
    come from and the micro-batch budgets (training; forward-only for the log-prob passes)."""

    def __init__(self, cfg: Config, profile: Profile, devices: int, plan: RunPlan) -> None:
        self.cfg, self.profile, self.devices = cfg, profile, devices
        self.old_log_prob_source = plan.old_log_probs
        self.micro, self.forward_micro = plan.micro_batch_tokens, plan.log_prob_micro_batch_tokens
        self.colocated = cfg.pipeline == "colocated"  # only it reloads offloaded state after generation
        self.use_ref = cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
        self.use_critic = cfg.algorithm.adv_estimator == "gae"
        self.fsdp_size = cfg.sim.fsdp_size
        self.updates = 0
        self._streamed: dict[str, float] = {}  # stage timings and tokens of the chunks not yet stepped

    async def train_groups(self, groups: Sequence[Group]) -> dict[str, float]:
        p, micro = self.profile, self.micro
        lengths = np.array([len(t.prompt_ids) + len(t.response_ids) for g in groups for t in g.trajectories])
        logprob = costs.logprob_seconds(p, lengths, self.devices, self.forward_micro, self.colocated, self.fsdp_size)
        count = num_mini_batches(len(groups), self.cfg.actor.ppo_mini_batch_size)
        minis = [m for m in np.array_split(lengths, count) if len(m)]
        metrics: dict[str, float] = {}
        if self.old_log_prob_source in PASS_SOURCES:
            await self._stage("old_log_prob", logprob, metrics)
        if self.use_ref:
            await self._stage("ref", logprob, metrics)
        if self.use_critic:
            await self._stage("values", logprob, metrics)
        await self._stage("adv", 0.0, metrics)
        if self.use_critic:
            await self._stage("update_critic", costs.update_seconds(
                p, minis, self.devices, micro, self.cfg.critic.ppo_epochs, self.fsdp_size), metrics)
        await self._stage("update_actor", costs.update_seconds(
            p, minis, self.devices, micro, self.cfg.actor.ppo_epochs, self.fsdp_size), metrics)
        self.updates += 1
        metrics["sim/train_tokens"] = float(lengths.sum())
        return metrics

    async def accumulate_groups(self, groups: Sequence[Group]) -> dict[str, float]:
        """Stream trainer: this chunk's log-prob passes and forward+backward now (no step)."""
        p, micro = self.profile, self.micro
        lengths = np.array([len(t.prompt_ids) + len(t.response_ids) for g in groups for t in g.trajectories])
        metrics: dict[str, float] = {}
        # A pass's fixed cost (weights and model set up for log-probs) is paid once per batch, not per chunk.
        logprob = costs.logprob_seconds(p, lengths, self.devices, self.forward_micro,
                                        self.colocated and not self._streamed, self.fsdp_size)
        if self.old_log_prob_source in PASS_SOURCES:
            await self._stage("old_log_prob", logprob, metrics)
        if self.use_ref:
            await self._stage("ref", logprob, metrics)
        await self._stage("adv", 0.0, metrics)
        backward = costs.pass_seconds(p, lengths, self.devices, micro, 3.0, p.train_mfu, p.dp_efficiency,
                                      costs.fsdp_comm_seconds(p, self.devices, self.fsdp_size, backward=True))
        await self._stage("update_actor", backward, metrics)
        for k, v in metrics.items():
            self._streamed[k] = self._streamed.get(k, 0.0) + v
        self._streamed["sim/train_tokens"] = self._streamed.get("sim/train_tokens", 0.0) + float(lengths.sum())
        return metrics

    async def apply_update(self) -> dict[str, float]:
        """Stream trainer: the one optimizer step; the stage timings summed over the chunks."""
        assert self._streamed, "apply_update without accumulate_groups: nothing to apply"
        metrics, self._streamed = self._streamed, {}
        await self._stage("update_actor", self.profile.optimizer_step_s, metrics)
        self.updates += 1
        return metrics

    async def _stage(self, name: str, seconds: float, metrics: dict[str, float]) -> None:
        with timer(name, metrics):
            await asyncio.sleep(seconds)

    async def weight_meta(self) -> list[WeightMeta]:
        dtype = "bfloat16" if self.profile.bytes_per_param == 2 else "float32"
        return [("model", (int(self.profile.params_b * 1e9),), dtype)]

    async def export_weights(self) -> dict[str, torch.Tensor]:
        return {}  # no tensors are modelled; `SimTransport` charges the transfer's time

    async def broadcast_weights(self, group_name: str, bucket_mb: float) -> int:
        await asyncio.sleep(costs.sync_seconds(self.profile))
        return int(self.profile.params_b * 1e9 * self.profile.bytes_per_param)

    async def weights_checksum(self) -> str:
        return f"u{self.updates}"

    async def save(self, path: Path) -> None:
        await asyncio.sleep(costs.checkpoint_seconds(self.profile))
        path.mkdir(parents=True, exist_ok=True)
        (path / "sim_trainer.json").write_text(json.dumps({"updates": self.updates}))

    async def load(self, path: Path) -> None:
        self.updates = json.loads((path / "sim_trainer.json").read_text())["updates"]


class SimTransport:
    """Weight transfer as modelled time: every engine gets the version after `sync_seconds`."""

    def __init__(self, rollouts: Sequence[WeightSink], seconds: float) -> None:
        self.rollouts, self.seconds = list(rollouts), seconds

    async def setup(self, meta: Sequence[WeightMeta]) -> None:
        pass

    async def transfer(self, version: int) -> None:
        await asyncio.sleep(self.seconds)
        for r in self.rollouts:
            await r.load_weights({}, version)

    async def close(self) -> None:
        pass
