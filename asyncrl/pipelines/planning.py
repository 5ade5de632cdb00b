"""The parallelism planner in a run (SPEC §4, RollPacker): after each batch, the rollout
tensor-parallel size for the next one, from the batch's KV-cache preemptions.

    planner = Planner.from_config(ctx.cfg, ctx.log)      # None unless tp_planner.enable
    ...                                                   # a batch is made; nothing is in flight
    if planner is not None:
        await planner.after_step(ctx.rollout, metrics)    # adds rollout/tp_size, rollout/preemptions_step

The rollout side reports a cumulative `rollouter/preemptions` (summed over the router's
workers); the planner takes the step's difference, feeds the pure policy
(`asyncrl.scheduling.tp_planner.TPPlanner`), logs `rollout/preemptions_step` and
`rollout/tp_size` (the TP planned for the next step), and applies a new size to every rollout
worker whose class defines `set_tensor_parallel(tp)`: the simulator's modelled engines
(`SimRolloutServer`, see `asyncrl.sim.topology` for how a TP change is modelled), and a real
engine with tensor parallelism once it has one. The CPU torch engine cannot change TP: there the
planner only reports the planned size, and says so once in the log.

Not here: when it is called (`batch_source.BatchSource.next`, as it hands out each batch, when
nothing is in flight), the policy itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from asyncrl.config.schema import Config
from asyncrl.scheduling.tp_planner import TPPlanner

PREEMPTIONS = "rollouter/preemptions"


class RolloutStats(Protocol):
    """What the planner reads from the rollout side (a `RolloutRouter` or one server)."""

    async def stats(self) -> dict[str, float]: ...


class Resizable(Protocol):
    """A rollout worker that can change its engines' tensor-parallel size between steps."""

    async def set_tensor_parallel(self, tp: int) -> None: ...


class Planner:
    """The TP planner's glue: one `after_step` per finished step."""

    def __init__(self, policy: TPPlanner, log: Callable[[str], None] = print) -> None:
        self.policy = policy
        self.log = log
        self.seen = 0
        """The cumulative preemption count at the last step (workers start at 0)."""
        self._told_fixed = False

    @classmethod
    def from_config(cls, cfg: Config, log: Callable[[str], None] = print) -> Planner | None:
        """The run's planner, or None when tp_planner.enable is off. A node is the rollout
        node (rollout.n_gpus_per_node), or the trainer's in the colocated pipeline, whose engines
        live on the training GPUs; 0 (CPU) means no node limit."""
        c = cfg.tp_planner
        if not c.enable:
            return None
        node = cfg.trainer.n_gpus_per_node if cfg.pipeline == "colocated" else cfg.rollout.n_gpus_per_node
        tp = cfg.rollout.tensor_model_parallel_size
        return cls(TPPlanner(tp, c.growth, c.calm_steps, c.max_tp, node, min_tp=tp), log)

    async def after_step(self, rollout: RolloutStats, metrics: dict[str, float]) -> int:
        """Plan from this step's preemptions (the step's `rollouter/preemptions`, or the rollout
        side's stats if the metrics lack it); log the plan into `metrics`; apply a change where
        the workers can. Returns the TP for the next step."""
        total = metrics.get(PREEMPTIONS)
        if total is None:
            total = (await rollout.stats()).get(PREEMPTIONS, 0.0)
        step = max(int(total) - self.seen, 0)  # a restarted worker counts from 0 again
        self.seen = int(total)
        before = self.policy.tp
        tp = self.policy.step(step)
        metrics["rollout/preemptions_step"] = float(step)
        metrics["rollout/tp_size"] = float(tp)
        await self._apply(rollout, before, tp)
        return tp

    async def _apply(self, rollout: RolloutStats, before: int, tp: int) -> None:
        workers = _resizable(rollout)
        if workers is None:
            if not self._told_fixed:
                self.log("tp_planner: these rollout engines cannot change tensor parallelism (the CPU torch "
                         "engine runs with 1); rollout/tp_size reports the planned size only")
                self._told_fixed = True
            return
        if tp != before:
            await asyncio.gather(*(w.set_tensor_parallel(tp) for w in workers))
            self.log(f"tp_planner: rollout tensor parallelism {before} -> {tp}")


def _resizable(rollout: object) -> list[Resizable] | None:
    """The rollout workers if every one's class defines `set_tensor_parallel`, else None. The class
    is asked, not the object: a Ray proxy answers every attribute."""
    workers: Sequence[object] = getattr(rollout, "workers", None) or [rollout]
    if all(callable(getattr(type(w), "set_tensor_parallel", None)) for w in workers):
        return [cast(Resizable, w) for w in workers]
    return None
