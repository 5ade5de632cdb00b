"""`asyncrl eval`: a model's mean@k and pass@k on held-out prompts, named as verl names them.

`run_eval(cfg)` loads `model.path`, builds one rollout worker exactly as a run does
(`asyncrl.workers.factory.build_rollout_server`: the same engine, sampling at
`rollout.val_temperature`, the same `RewardWorker`), generates `rollout.val_n` responses for
every prompt of `data.val_files` (or of the built-in task's test split when there are none),
loaded as a run loads its validation prompts (`asyncrl.data.held_out.val_rows`), and scores
them. It reports the metrics a run's validation logs, computed by the same function
(`asyncrl.telemetry.val_metrics`): per data source `val-core/{source}/reward/mean@{n}`,
`best@{m}/mean`, `pass@{m}`, ... under verl's names, and over all sources `val/score/mean`,
`val/pass@{n}` and `val/response_length/mean`.

It trains nothing and writes only the report (`write_report`) and, unless
`trainer.log_val_generations=0`, the responses as text (`generations_path`: generations.jsonl in
`trainer.validation_data_dir`, else `<report>_generations.jsonl` beside the report; the lines
of a run's validation, `telemetry.generations`, at step 0); the model is not changed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncrl.config.schema import Config
from asyncrl.errors import ConfigError
from asyncrl.fsutil import atomic_write_text, nearest_unwritable
from asyncrl.telemetry.generations import GENERATIONS_FILE, pick, records, write_generations
from asyncrl.telemetry.val_metrics import validation_metrics
from asyncrl.types import Group, PromptRow

logger = logging.getLogger("asyncrl.eval")


@dataclasses.dataclass(frozen=True)
class EvalReport:
    metrics: dict[str, float]
    model: str
    data: list[str]
    """The files evaluated, or the built-in task's test split."""
    n: int
    """Responses per prompt (rollout.val_n)."""
    prompts: int
    seconds: float
    generations: str = ""
    """The file holding the responses as text ('' when trainer.log_val_generations=0)."""


def check_eval(cfg: Config, out: Path | None = None) -> None:
    """Before loading anything: model.path and data.val_files exist, every data source has a
    reward, and the report `out` (and the generations beside it) can be written."""
    from asyncrl.models.loading import check_model_path
    from asyncrl.preflight import check_data_files, check_rewards

    check_model_path(cfg.model.path)
    check_rewards(cfg.reward, check_data_files(dataclasses.replace(cfg.data, train_files=())))
    if out is not None:
        check_writable(out, "--out")
        generations = generations_path(cfg, out)
        if generations is not None and generations.parent != out.parent:
            check_writable(generations, "trainer.validation_data_dir")


def check_writable(path: Path, option: str) -> None:
    """`path` can be written: the nearest directory of it that exists takes a new file (so a
    read-only one fails now, not after the generation work)."""
    _, problem = nearest_unwritable(path.absolute().parent)
    if problem:
        raise ConfigError(f"{option} {path}: {problem}; give a writable path")


def run_eval(cfg: Config, generations: Path | None = None) -> EvalReport:
    """Generate rollout.val_n responses per held-out prompt with a run's engine and rewards;
    `trainer.log_val_generations` of them as text to `generations` if given."""
    from asyncrl.agents.build import prompt_data
    from asyncrl.data.held_out import val_rows
    from asyncrl.models import load_model
    from asyncrl.workers.factory import build_rollout_server
    from asyncrl.workers.handles import close_worker

    start = time.perf_counter()
    model, tok = load_model(cfg.model, logger.info)
    rows, data = val_rows(prompt_data(cfg.data, cfg.rollout.multi_turn, cfg.sandbox,
                                       cfg.rollout.agent.entrypoint), cfg.seed, tok, logger.warning)
    server = build_rollout_server(cfg, 0, model, tok)
    try:
        metrics, groups = asyncio.run(evaluate(server, rows, cfg.rollout.val_n))
    finally:
        close_worker(server)
    if generations is not None:
        picked = pick(groups, cfg.trainer.log_val_generations, f"{cfg.seed}/val/0")
        write_generations(generations, records(picked, 0, "val",
                                               lambda ids: str(tok.decode(list(ids), skip_special_tokens=True))))
    return EvalReport(metrics, cfg.model.path, data, cfg.rollout.val_n, len(rows),
                      time.perf_counter() - start, str(generations or ""))


def generations_path(cfg: Config, report: Path) -> Path | None:
    """Where `asyncrl eval` writes the responses: trainer.validation_data_dir/generations.jsonl,
    else beside the report (eval.json -> eval_generations.jsonl); None when
    trainer.log_val_generations=0."""
    if cfg.trainer.log_val_generations == 0:
        return None
    if cfg.trainer.validation_data_dir:
        return Path(cfg.trainer.validation_data_dir) / GENERATIONS_FILE
    return report.with_name(f"{report.stem}_generations.jsonl")


async def evaluate(server: Any, rows: Sequence[PromptRow], n: int) -> tuple[dict[str, float], list[Group]]:
    """n scored responses per row from `server` (a rollout side): their validation metrics, and
    the groups."""
    from asyncrl.telemetry.loggers import progress_bar

    bar = progress_bar(len(rows), "eval")

    async def one(row: PromptRow) -> Group:
        group = await server.generate_scored(row, n, f"{row.uid}@eval", "val")
        bar.update(1)
        return group

    try:
        groups = list(await asyncio.gather(*(one(r) for r in rows)))
    finally:
        bar.close()
    return validation_metrics(groups), groups


def table(report: EvalReport) -> str:
    """The metrics as two aligned columns, val-core first."""
    keys = sorted(report.metrics, key=lambda k: (not k.startswith("val-core"), not k.startswith("val/"), k))
    width = max((len(k) for k in keys), default=0)  # no prompts: no metrics
    head = f"{report.model} on {', '.join(report.data)}: {report.prompts} prompts x {report.n} responses"
    return "\n".join([head, *(f"{k:<{width}}  {report.metrics[k]:.4f}" for k in keys)])


def write_report(report: EvalReport, path: Path) -> None:
    atomic_write_text(path, json.dumps(dataclasses.asdict(report), indent=2) + "\n")

