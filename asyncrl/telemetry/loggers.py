"""Metric sinks: console (progress bar), JSONL, TensorBoard, Weights & Biases, MLflow, SwanLab, and the trace.

`make_tracker(names, output_dir, ...)` returns one object whose `log(metrics, step)` fans out
to every configured sink (and to the run's trace: its phase spans and counter tracks, see
`Trace.log_step`), and whose `log_generations(split, records, step)` writes what the model
generated (`telemetry.generations`) to generations.jsonl (`GenerationsLog`) and, where those
sinks are on, as a TensorBoard text table and a W&B table. The console sink is a tqdm bar with
an ETA on stderr when stderr is a terminal; otherwise, and never above INFO, it logs a line now
and then to the "asyncrl.progress" logger, so `asyncrl --log-level WARNING` silences it. Keys
are flat with slashes (verl's names). W&B, MLflow and SwanLab are optional extras, imported
only when asked for (W&B honours WANDB_MODE=offline); `missing_logger_package` lets preflight
name the extra to install before anything is created.

A run resumed from the checkpoint of step K (`initial_step=K > 0`) continues the same records:
metrics.jsonl and generations.jsonl drop their lines past step K, TensorBoard hides events past
step K (`purge_step`), and W&B reopens the run whose id the first run stored in
`wandb_run_id.txt`. What an interrupted run logged after its last checkpoint is thus replaced
by what the resumed run logs again, except in W&B, which keeps a run's history append-only (it
ignores steps at or below its last one, with a warning). A fresh run (`initial_step=0`) in a
used directory appends to metrics.jsonl, generations.jsonl and TensorBoard and starts a new
W&B run.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from asyncrl.fsutil import atomic_write_text
from asyncrl.telemetry.generations import markdown_table, table_rows
from asyncrl.telemetry.trace import Trace

progress_logger = logging.getLogger("asyncrl.progress")
LINES_PER_RUN = 20
"""Without a progress bar, about this many step lines per run (and every validated step)."""

CONSOLE_KEYS = ("critic/score/mean", "val/score/mean", "response_length/mean", "actor/pg_loss",
                "timing_s/step", "trainer/idle_ratio")


class Sink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


class TextSink(Protocol):
    """A sink that also shows generations (`telemetry.generations.records`)."""

    def log_text(self, split: str, records: Sequence[Mapping[str, Any]], step: int) -> None: ...
    def close(self) -> None: ...


WANDB_ID_FILE = "wandb_run_id.txt"


class JsonlSink:
    """One line per `log`: `{"step": N, key: value, ...}`, non-finite values as null. Resuming at
    `resume_step` > 0 first rolls the file back to the lines of steps <= resume_step."""

    def __init__(self, path: Path, resume_step: int = 0, log: Callable[[str], None] = print) -> None:
        if resume_step > 0 and path.exists():
            rollback_jsonl(path, resume_step, log)
        self.file = path.open("a")

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None)
                 for k, v in metrics.items()}
        self.file.write(json.dumps({"step": step, **clean}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class TensorBoardSink:
    """`purge_step=P`: TensorBoard hides the events of this logdir with step >= P (written as a
    SessionLog.START at step P in the new event file); P = K + 1 on resuming at step K."""

    def __init__(self, logdir: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(logdir), purge_step=purge_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_text(self, split: str, records: Sequence[Mapping[str, Any]], step: int) -> None:
        """The first records as a Markdown table in the text tab (`generations/train`, `generations/val`)."""
        self.writer.add_text(f"generations/{split}", markdown_table(records), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A resumed run (`resume=True`) reopens the W&B run whose id is in OUTPUT_DIR/wandb_run_id.txt;
    otherwise a new W&B run starts and its id is stored there."""

    def __init__(self, project: str, name: str, config: dict[str, Any], output_dir: Path,
                 resume: bool = False) -> None:
        import wandb

        id_file = output_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.exists() else ""
        kwargs: dict[str, Any] = {"id": run_id, "resume": "allow"} if run_id else {}
        self.run = wandb.init(project=project, name=name, config=config, dir=str(output_dir), **kwargs)
        if not run_id:
            atomic_write_text(id_file, f"{self.run.id}\n")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_text(self, split: str, records: Sequence[Mapping[str, Any]], step: int) -> None:
        """The first records as a `wandb.Table` under `generations/{split}` at this step."""
        import wandb

        columns, rows = table_rows(records)
        self.run.log({f"generations/{split}": wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class GenerationsLog:
    """generations.jsonl, one file per split's path (one file when both are the same); resuming at
    `resume_step` > 0 first rolls each back to the lines of steps <= resume_step."""

    def __init__(self, paths: Mapping[str, Path], resume_step: int = 0, log: Callable[[str], None] = print) -> None:
        self.paths = dict(paths)
        self.files: dict[Path, Any] = {}
        for path in dict.fromkeys(self.paths.values()):
            path.parent.mkdir(parents=True, exist_ok=True)
            if resume_step > 0 and path.exists():
                rollback_jsonl(path, resume_step, log)
            self.files[path] = path.open("a")

    def log_text(self, split: str, records: Sequence[Mapping[str, Any]], step: int) -> None:
        path = self.paths.get(split)
        if path is None:
            return
        self.files[path].write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        self.files[path].flush()

    def close(self) -> None:
        for file in self.files.values():
            file.close()


class MlflowSink:
    """An MLflow run in MLFLOW_TRACKING_URI when it is set, else in OUTPUT_DIR/mlruns (a local file
    store). The flattened config is logged as parameters once; a resumed run starts a new MLflow
    run (MLflow keeps every step it was given)."""

    def __init__(self, experiment: str, name: str, config: dict[str, Any], output_dir: Path) -> None:
        import os

        import mlflow

        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri((output_dir / "mlruns").resolve().as_uri())
        mlflow.set_experiment(experiment)
        self.mlflow = mlflow
        self.run = mlflow.start_run(run_name=name)
        mlflow.log_params({k: str(v)[:500] for k, v in _flatten(config).items()})  # MLflow's value limit

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


class SwanLabSink:
    """A SwanLab run (verl's `swanlab` logger); SWANLAB_MODE=local or offline is honoured by swanlab itself."""

    def __init__(self, project: str, name: str, config: dict[str, Any], output_dir: Path) -> None:
        import swanlab

        self.run = swanlab.init(project=project, experiment_name=name, config=config,
                                logdir=str(output_dir / "swanlog"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


LOGGER_EXTRAS = ("wandb", "mlflow", "swanlab")
"""Loggers whose package is an optional extra of the same name (`pip install 'asyncrl[wandb]'`)."""


def missing_logger_package(names: Sequence[str]) -> str | None:
    """One line naming the install for the first logger whose package is absent, else None."""
    from importlib.util import find_spec

    for name in names:
        if name in LOGGER_EXTRAS and find_spec(name) is None:
            return (f"trainer.logger={name}: the {name} package is not installed; pip install 'asyncrl[{name}]', "
                    f"or drop {name} from trainer.logger")
    return None


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"actor": {"lr": 1e-6}} -> {"actor.lr": 1e-6}."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str) -> Any:
    """A tqdm bar with an ETA on stderr when stderr is a terminal and "asyncrl.progress" logs INFO;
    else one that shows nothing (`update`, `close`)."""
    if not (progress_logger.isEnabledFor(logging.INFO) and sys.stderr.isatty()):
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)


class ConsoleSink:
    """Progress over steps with the key metrics: a bar with an ETA on a terminal at INFO,
    else a line every ~1/`LINES_PER_RUN` of the run at INFO, else nothing."""

    def __init__(self, total_steps: int, initial: int = 0, desc: str = "train") -> None:
        self.total, self.step, self.bar = total_steps, initial, None
        if progress_logger.isEnabledFor(logging.INFO) and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=initial, desc=desc, file=sys.stderr, dynamic_ncols=True)

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = {k.split("/", 1)[-1] if k.count("/") == 1 else k: f"{metrics[k]:.3g}"
                 for k in CONSOLE_KEYS if k in metrics}
        validated = {k: round(v, 3) for k, v in metrics.items() if k.startswith("val/") and "/score/" in k}
        if self.bar is not None:
            self.bar.set_postfix(shown, refresh=False)
            self.bar.update(max(step - self.step, 0))
            if validated:
                self.bar.write(f"step {step}: {validated}", file=sys.stderr)
        elif validated or step == self.total or step % max(self.total // LINES_PER_RUN, 1) == 0:
            progress_logger.info(f"step {step}/{self.total}: " + " ".join(f"{k}={v}" for k, v in shown.items())
                                 + (f" {validated}" if validated else ""))
        self.step = max(self.step, step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class TraceSink:
    """Each logged step into the run's trace (`Trace.log_step`): phase spans and counters."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.trace.log_step(metrics, step)

    def close(self) -> None:
        pass


class Tracker:
    """`sinks` get the metrics, `text_sinks` the generations; a sink in both is closed once."""

    def __init__(self, sinks: Sequence[Sink], text_sinks: Sequence[TextSink] = ()) -> None:
        self.sinks = list(sinks)
        self.text_sinks = list(text_sinks)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def log_generations(self, split: str, records: Sequence[Mapping[str, Any]], step: int) -> None:
        if not records:
            return
        for sink in self.text_sinks:
            sink.log_text(split, records, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        for text_sink in self.text_sinks:
            if not any(text_sink is sink for sink in self.sinks):
                text_sink.close()


def make_tracker(names: Sequence[str], output_dir: Path, *, total_steps: int, initial_step: int,
                 project: str, experiment: str, config: dict[str, Any],
                 log: Callable[[str], None] = print, trace: Trace | None = None,
                 generations: Mapping[str, Path] | None = None) -> Tracker:
    """`initial_step`: the checkpoint step a run resumes from (0: a fresh run); `generations`:
    the generations.jsonl path of each split logged ("train", "val"), none: no file."""
    resume = initial_step > 0
    sinks: list[Sink] = [TraceSink(trace)] if trace is not None else []
    text_sinks: list[TextSink] = [GenerationsLog(generations, initial_step, log)] if generations else []
    for name in names:
        if name == "console":
            sinks.append(ConsoleSink(total_steps, initial_step))
        elif name == "jsonl":
            sinks.append(JsonlSink(output_dir / "metrics.jsonl", initial_step, log))
        elif name == "tensorboard":
            board = TensorBoardSink(output_dir / "tensorboard", initial_step + 1 if resume else None)
            sinks.append(board)
            text_sinks.append(board)
        elif name == "wandb":
            wandb_run = WandbSink(project, experiment, config, output_dir, resume)
            sinks.append(wandb_run)
            text_sinks.append(wandb_run)
        elif name == "mlflow":
            sinks.append(MlflowSink(project, experiment, config, output_dir))
        elif name == "swanlab":
            sinks.append(SwanLabSink(project, experiment, config, output_dir))
    return Tracker(sinks, text_sinks)


def rollback_jsonl(path: Path, last_step: int, log: Callable[[str], None] = print) -> None:
    """Keep only the lines of steps <= last_step, rewriting the file atomically. Lines that are
    not a JSON record with an integer "step" (a line torn by a crash) are dropped too."""
    kept: list[str] = []
    dropped = unreadable = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        step = _step_of(line)
        if step is None:
            unreadable += 1
        elif step <= last_step:
            kept.append(line + "\n")
        else:
            dropped += 1
    if dropped or unreadable:
        atomic_write_text(path, "".join(kept))
        log(f"{path}: resuming after step {last_step}: dropped {dropped} later records"
            + (f" and {unreadable} unreadable lines" if unreadable else ""))


def _step_of(line: str) -> int | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None
