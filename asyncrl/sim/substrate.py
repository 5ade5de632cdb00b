"""The simulator's substrate: modelled workers on the virtual clock, built from the config.

Each side gets the devices `topology.devices` assigns it (the same keys a real run reads); each
rollout server is one modelled engine of its devices. Workers are plain objects on the loop (no
threads, no processes); the weight transfer is modelled time (`SimTransport`).
"""

from __future__ import annotations

from pathlib import Path

from asyncrl.config.schema import Config
from asyncrl.roles import RolloutSide, TrainerSide
from asyncrl.scheduling.plan import RunPlan
from asyncrl.sim import costs
from asyncrl.sim.profile import Profile
from asyncrl.sim.topology import devices, with_memory_utilization
from asyncrl.sim.workers import SimRolloutServer, SimTrainer, SimTransport
from asyncrl.sim.workload import Workload, sim_rows
from asyncrl.substrates import Log, RunData, Workers


class SimSubstrate:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.trace_max_events = 0
        self.device: str | None = profile.device

    def load_data(self, cfg: Config, log: Log) -> RunData:
        """The run's prompt rows (no tokenizer); a simulated run starts fresh."""
        self.trace_max_events = cfg.sim.trace_max_events
        (Path(cfg.trainer.output_dir) / "metrics.jsonl").unlink(missing_ok=True)
        return RunData(None, *sim_rows(cfg))

    def build_workers(self, cfg: Config, plan: RunPlan, log: Log) -> Workers:
        self.profile = with_memory_utilization(self.profile, cfg.sim.gpu_memory_utilization)
        d = devices(cfg, self.profile)
        workload = Workload(cfg, cfg.seed)
        rollouts: list[RolloutSide] = [SimRolloutServer(cfg, self.profile, d.per_engine, workload)
                                       for _ in range(d.engines)]
        trainer: TrainerSide = SimTrainer(cfg, self.profile, d.trainer, plan)
        transport = SimTransport(rollouts, costs.sync_seconds(self.profile))
        return Workers(trainer, rollouts, transport, close=lambda: None)
