"""What a running pipeline holds (`RunContext`) and how a run says things (`log_line`).

Not here: building a context from the config (`setup.build_context`), routing groups to the
rollout workers (`router.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config.schema import Config
from asyncrl.data import PromptIterator
from asyncrl.pipelines.ledger import SampleLedger
from asyncrl.pipelines.router import RolloutRouter
from asyncrl.pipelines.slow_rewards import SlowRewards
from asyncrl.pipelines.stopping import StopControl
from asyncrl.roles import TrainerSide
from asyncrl.scheduling.plan import RunPlan
from asyncrl.sync import ParameterSynchronizer
from asyncrl.telemetry.loggers import Tracker
from asyncrl.telemetry.trace import Trace
from asyncrl.types import PromptRow

if TYPE_CHECKING:  # the simulator builds contexts without transformers
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger("asyncrl.run")
"""What a run says as it goes (resumes, restarts, stops, dropped rows); `asyncrl --log-level` filters it."""


def log_line(message: str) -> None:
    """A run's message to `logger`: at WARNING when it says so ("warning: ..."), else INFO."""
    (logger.warning if message.lstrip().lower().startswith("warning") else logger.info)(message)


@dataclass
class RunContext:
    """Everything a pipeline's loop reads and updates, built once by `setup.build_context`."""

    cfg: Config
    plan: RunPlan
    """The run's derived numbers (updates, prompts per update, ...): read these, never re-derive them."""
    output_dir: Path
    tokenizer: PreTrainedTokenizerBase | None
    train_rows: list[PromptRow]
    val_rows: list[PromptRow]
    prompts: PromptIterator
    rollout: RolloutRouter
    trainer: TrainerSide
    synchronizer: ParameterSynchronizer
    trace: Trace
    ledger: SampleLedger
    stop: StopControl
    close: Callable[[], None]
    log: Callable[[str], None] = log_line
    tracker: Tracker | None = None
    step: int = 0
    """Policy updates finished (and recorded in the prompt stream and the ledger)."""
    trained: int = 0
    """Groups trained by those updates."""
    training: bool = False
    """An update is running: its weights and its prompts do not agree until it ends."""
    resume_from: Path | None = None
    """The checkpoint this run starts from (`trainer.resume_mode`): never rewritten."""
    pipeline_state: Callable[[], dict[str, Any]] | None = None
    """The pipeline's own part of a checkpoint, taken at one instant (see `checkpoint.snapshot`)."""
    slow_rewards: SlowRewards = field(default_factory=SlowRewards)
    """`reward/timeout_time_share` per step, and the run's one warning when timeouts dominate."""
    tool_calls: float = 0.0
    """Multi-turn: the tool calls per episode summed over the steps logged (`common.check_tool_calls`)."""
