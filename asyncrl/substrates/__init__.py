"""Substrates: where a run's workers live. Each one builds a run's data and workers its own way
and hands back the same things, so one context builder (`asyncrl.pipelines.setup.build_context`)
and every pipeline run on all of them unchanged:

- local (`LocalSubstrate`): workers are objects in this process (blocking work on their own
  threads); one model load shared by every worker; weights move in process;
- processes (`ProcessSubstrate`): the trainer and each rollout worker in a spawned process on
  this machine, each building its own model; weights move through one shared buffer (CUDA IPC
  on a GPU): how a decoupled run shares one GPU without Ray;
- ray (`RaySubstrate`): each worker is a Ray actor placed on its resource pool (a placement
  group per pool), building its own model; weights move through the object store or a
  torch.distributed broadcast;
- sim (`asyncrl.sim.substrate.SimSubstrate`): modelled workers on a virtual clock.

`registry.substrate_for(cfg)` picks the one `backend=` names. Not here: what workers do
(`asyncrl.workers`), when to sync (pipelines).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from asyncrl.config.schema import Config
from asyncrl.roles import RolloutSide, TrainerSide
from asyncrl.scheduling.plan import RunPlan
from asyncrl.sync.transports import Transport
from asyncrl.types import PromptRow

if TYPE_CHECKING:  # the simulator builds runs without transformers
    from transformers import PreTrainedTokenizerBase

Log = Callable[[str], None]


@dataclass
class RunData:
    """What the driver holds: the tokenizer (None in the simulator) and the prompt rows."""

    tokenizer: PreTrainedTokenizerBase | None
    train_rows: list[PromptRow]
    val_rows: list[PromptRow]
    model_config: Any = None
    """The model's Hugging Face config (None in the simulator): its shape sizes the micro-batches on CUDA."""


@dataclass
class Workers:
    """A run's workers as their roles, the transport between them, and how to stop them all."""

    trainer: TrainerSide
    rollouts: list[RolloutSide]
    transport: Transport
    close: Callable[[], None]


class Substrate(Protocol):
    trace_max_events: int
    """Spans a run's trace keeps (the simulator bounds it; real runs keep all of them)."""
    device: str | None
    """The device the run plan is made for: None = trainer.device (the simulator: its profile's)."""

    def load_data(self, cfg: Config, log: Log) -> RunData:
        """Tokenizer and prompt rows (a real substrate loads the model first, once)."""
        ...

    def build_workers(self, cfg: Config, plan: RunPlan, log: Log) -> Workers:
        """The trainer and `rollout.num_engines` rollout workers, placed and connected."""
        ...

