"""Where a run writes, and what it resumes from.

- `trainer.output_dir` empty (the default): a new directory per run,
  `outputs/<experiment_name>-<YYYYmmdd-HHMMSS>`, so running the same command twice never
  touches the first run.
- `trainer.resume_mode=auto`: continue the newest complete checkpoint in `output_dir`, if any;
  `disable`: start over there; a directory: that checkpoint (`.../checkpoints/global_step_K`) or
  that run's newest one, and the run goes on writing into the run directory it belongs to.
- A resumed run whose config differs from the `config.yaml` it was started with is refused,
  naming the keys, unless `trainer.allow_config_change=true`; keys that only say how long to run
  or how to log (`RESUMABLE_KEYS`) may change freely.
- The checkpoint resumed from is verified against its manifest first; `auto` falls back past a
  damaged one (`manifest.resume_point`), a checkpoint named outright is refused if damaged.
- `claim_run` does all this under the run directory's lock (`runlock`), taken before the run
  writes anything there.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from asyncrl.config import config_to_dict
from asyncrl.config.schema import Config
from asyncrl.errors import ConfigError
from asyncrl.pipelines.checkpoint import COMPLETE, checkpoint_root, latest_checkpoint
from asyncrl.pipelines.manifest import resume_point, verified
from asyncrl.pipelines.runlock import RunLock, hold_run_dir

RESUMABLE_KEYS = frozenset({
    "trainer.total_training_steps", "rollout.total_rollout_steps", "trainer.test_freq", "rollout.test_freq",
    "trainer.save_freq", "trainer.max_ckpt_to_keep", "trainer.logger", "trainer.resume_mode",
    "trainer.output_dir", "trainer.allow_config_change", "trainer.stop_timeout_s",
    "trainer.val_before_train", "trainer.log_generations", "trainer.log_val_generations",
    "trainer.rollout_data_dir", "trainer.validation_data_dir", "num_threads"})
"""Keys a resumed run may change without `trainer.allow_config_change`."""
RUNS_ROOT = Path("outputs")
"""Where run directories are made when trainer.output_dir is empty."""


def claim_run(cfg: Config, log: Callable[[str], None] = print) -> tuple[Config, Path | None, RunLock]:
    """`prepare_run` with the run directory locked first (`RunDirBusy` if another run holds it);
    the caller releases the lock when the run ends."""
    t = cfg.trainer
    out = Path(t.output_dir) if t.output_dir else None
    if out is None and t.resume_mode not in ("auto", "disable"):
        named = Path(t.resume_mode)
        out = named.parent.parent if (named / COMPLETE).exists() else named
    out = out or new_run_dir(t.experiment_name)
    lock = hold_run_dir(out, log)
    try:
        cfg, resume = prepare_run(dataclasses.replace(cfg, trainer=dataclasses.replace(t, output_dir=str(out))), log)
    except BaseException:
        lock.release()
        raise
    return cfg, resume, lock


def prepare_run(cfg: Config, log: Callable[[str], None] = print) -> tuple[Config, Path | None]:
    """The config with its run directory filled in, and the checkpoint to resume from (if any)."""
    t = cfg.trainer
    resume: Path | None = None
    out = Path(t.output_dir) if t.output_dir else None
    if t.resume_mode not in ("auto", "disable"):
        resume = _checkpoint_at(Path(t.resume_mode), log)
        out = out or resume.parent.parent
    out = out or new_run_dir(t.experiment_name)
    if t.resume_mode == "auto":
        resume = resume_point(checkpoint_root(out), log)
    elif t.resume_mode == "disable" and (old := latest_checkpoint(out)) is not None:
        log(f"trainer.resume_mode=disable: starting over in {out}; it holds checkpoints up to {old.name} "
            "of an earlier run, replaced as this run saves")
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(t, output_dir=str(out)))
    if resume is not None:
        check_config_change(cfg, out / "config.yaml", log)
    return cfg, resume


def with_run_dir(cfg: Config) -> Config:
    """`cfg` with its new run directory named (`trainer.output_dir`, not made yet) where it is empty
    and no checkpoint path says where the run belongs: so the start line can name it."""
    t = cfg.trainer
    if t.output_dir or t.resume_mode not in ("auto", "disable"):
        return cfg
    return dataclasses.replace(cfg, trainer=dataclasses.replace(t, output_dir=str(new_run_dir(t.experiment_name))))


def new_run_dir(experiment_name: str, root: Path = RUNS_ROOT) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = root / f"{experiment_name}-{stamp}", 1
    while path.exists():
        n += 1
        path = root / f"{experiment_name}-{stamp}-{n}"
    return path


def _checkpoint_at(path: Path, log: Callable[[str], None]) -> Path:
    if (path / COMPLETE).exists():
        return verified(path)
    latest = resume_point(checkpoint_root(path), log)
    if latest is None:
        where = checkpoint_root(path)
        raise ConfigError(f"trainer.resume_mode={path}: neither a complete checkpoint nor a run directory "
                          f"with one in {where}; use trainer.resume_mode=auto or disable")
    return latest


def check_config_change(cfg: Config, saved_path: Path, log: Callable[[str], None]) -> None:
    if not saved_path.exists():
        return
    saved = _flatten(yaml.safe_load(saved_path.read_text()) or {})
    now = _flatten(config_to_dict(cfg))
    changed = sorted(k for k in saved.keys() | now.keys()
                     if saved.get(k) != now.get(k) and k not in RESUMABLE_KEYS)
    if not changed:
        return
    diff = "; ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed)
    if not cfg.trainer.allow_config_change:
        raise ConfigError(f"resuming {cfg.trainer.output_dir} with a changed config ({diff}); set "
                          "trainer.allow_config_change=true to resume anyway, or trainer.resume_mode=disable")
    log(f"resuming with a changed config: {diff}")


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat
