"""Metric sinks: console (progress bar), JSONL, TensorBoard, Weights & Biases.

`make_tracker(names, output_dir, ...)` returns one object whose `log(metrics, step)` fans out
to every configured sink. Keys are flat with slashes (verl's names). W&B is optional: it is
imported only when asked for, and honours WANDB_MODE=offline.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

CONSOLE_KEYS = ("critic/score/mean", "val/score/mean", "response_length/mean", "actor/pg_loss",
                "timing_s/step", "trainer/idle_ratio")


class Sink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    def __init__(self, path: Path) -> None:
        self.file = path.open("a")

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None)
                 for k, v in metrics.items()}
        self.file.write(json.dumps({"step": step, **clean}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class TensorBoardSink:
    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(logdir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, project: str, name: str, config: dict[str, Any], output_dir: Path) -> None:
        import wandb

        self.run = wandb.init(project=project, name=name, config=config, dir=str(output_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class ConsoleSink:
    """A progress bar over steps with the key metrics in its postfix."""

    def __init__(self, total_steps: int, initial: int = 0) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total_steps, initial=initial, desc="train", file=sys.stderr,
                        dynamic_ncols=True)
        self.step = initial

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = {k.split("/", 1)[-1] if k.count("/") == 1 else k: f"{metrics[k]:.3g}"
                 for k in CONSOLE_KEYS if k in metrics}
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(max(step - self.step, 0))
        self.step = max(self.step, step)
        if any(k.startswith("val/") for k in metrics):
            val = {k: round(v, 3) for k, v in metrics.items() if k.startswith("val/") and "/score/" in k}
            self.bar.write(f"step {step}: {val}")

    def close(self) -> None:
        self.bar.close()


class Tracker:
    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def make_tracker(names: Sequence[str], output_dir: Path, *, total_steps: int, initial_step: int,
                 project: str, experiment: str, config: dict[str, Any]) -> Tracker:
    sinks: list[Sink] = []
    for name in names:
        if name == "console":
            sinks.append(ConsoleSink(total_steps, initial_step))
        elif name == "jsonl":
            sinks.append(JsonlSink(output_dir / "metrics.jsonl"))
        elif name == "tensorboard":
            sinks.append(TensorBoardSink(output_dir / "tensorboard"))
        elif name == "wandb":
            sinks.append(WandbSink(project, experiment, config, output_dir))
    return Tracker(sinks)
