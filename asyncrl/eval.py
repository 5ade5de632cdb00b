"""`asyncrl eval`: a model's mean@k and pass@k on held-out prompts, named as verl names them.

`run_eval(cfg)` loads `model.path`, builds one rollout worker exactly as a run does
(`asyncrl.workers.factory.build_rollout_server`: the same engine, sampling at
`rollout.val_temperature`, the same `RewardWorker`), generates `rollout.val_n` responses for
every prompt of `data.val_files` (or of the built-in task's test split when there are none) and
scores them. `eval_metrics` then reports, per data source, verl's validation metrics
(`verl.trainer.ppo.metric_utils.process_validation_metrics` and the trainer's `val-core` /
`val-aux` split):

- `val-core/{source}/reward/mean@{n}`: the mean reward over all n responses of a prompt;
  `val-aux/.../std@{n}`: their spread;
- `best@{m}/mean`, `best@{m}/std`, `worst@{m}/...` for m = 2, 4, ... < n and n: the best (worst)
  reward of m responses drawn with replacement from the n. verl estimates these with 1,000
  bootstrap draws; here they are the exact expectations of the same draw (no sampling noise);
- `pass@{m}` (m = 1, 2, 4, ..., n): the chance that at least one of m responses drawn without
  replacement passes (reward >= `PASS_SCORE`), the unbiased estimator of Chen et al. 2021
  ("Evaluating Large Language Models Trained on Code", eq. 1); verl has no such metric;
- over all sources: `val/score/mean`, `val/pass@{n}` and `val/response_length/mean`, as the
  validation of a training run logs them.
The `@n` metrics of mean and best (and pass) are `val-core`, the rest `val-aux`, as in verl.

It trains nothing and writes only the report (`write_report`); the model is not changed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncrl.config_schema import Config
from asyncrl.fsutil import atomic_write_text
from asyncrl.types import Group, PromptRow

logger = logging.getLogger("asyncrl.eval")
PASS_SCORE = 1.0
"""A response passes when its reward is at least this (the built-in and verl scorers give 1 for a right answer)."""


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


def check_eval(cfg: Config) -> None:
    """Before loading anything: model.path and data.val_files exist and every data source has a reward."""
    from asyncrl.models.loading import check_model_path
    from asyncrl.preflight import check_data_files, check_rewards

    check_model_path(cfg.model.path)
    check_rewards(cfg.reward, check_data_files(dataclasses.replace(cfg.data, train_files=())))


def run_eval(cfg: Config) -> EvalReport:
    """Generate rollout.val_n responses per held-out prompt with a run's engine and rewards."""
    from asyncrl.models import load_model
    from asyncrl.workers.factory import build_rollout_server
    from asyncrl.workers.handles import close_worker

    start = time.perf_counter()
    model, tok = load_model(cfg.model, logger.info)
    rows, data = val_rows(cfg, tok)
    server = build_rollout_server(cfg, 0, model, tok)
    try:
        groups = asyncio.run(_generate(server, rows, cfg.rollout.val_n))
    finally:
        close_worker(server)
    return EvalReport(eval_metrics(groups), cfg.model.path, data, cfg.rollout.val_n, len(rows),
                      time.perf_counter() - start)


def val_rows(cfg: Config, tok: Any) -> tuple[list[PromptRow], list[str]]:
    """The tokenized held-out rows that fit data.max_prompt_length, and where they came from."""
    from asyncrl.data import load_rows, make_task, tokenize_rows
    from asyncrl.data.dataset import drop_overlong

    d = cfg.data
    template = d.chat_template or None
    if d.val_files:
        sources = [(f, load_rows(f, split_name=f"val{i}")) for i, f in enumerate(d.val_files)]
    else:
        sources = [(f"data.task={d.task} (test split)", make_task(d.task, d.val_size, seed=cfg.seed, split="test"))]
    rows: list[PromptRow] = []
    for source, raw in sources:
        tokenized, _ = tokenize_rows(raw, tok, sys.maxsize, chat_template=template)
        rows += drop_overlong(tokenized, d.max_prompt_length, source, logger.warning)
    return rows, [s for s, _ in sources]


async def _generate(server: Any, rows: Sequence[PromptRow], n: int) -> list[Group]:
    from asyncrl.telemetry.loggers import progress_bar

    bar = progress_bar(len(rows), "eval")

    async def one(row: PromptRow) -> Group:
        group = await server.generate_scored(row, n, f"{row.uid}@eval", "val")
        bar.update(1)
        return group

    try:
        return list(await asyncio.gather(*(one(r) for r in rows)))
    finally:
        bar.close()


def eval_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """verl's validation metrics of these scored groups (see the module docstring)."""
    by_source: dict[str, list[list[float]]] = defaultdict(list)
    for g in groups:
        by_source[g.row.data_source].append(list(g.rewards_G))
    out: dict[str, float] = {}
    for source, rewards_P in sorted(by_source.items()):
        per_prompt = [prompt_metrics(r) for r in rewards_P]
        n = max(len(r) for r in rewards_P)
        for name in per_prompt[0]:
            core = name.startswith(("mean", "best", "pass")) and f"@{n}" in name  # verl's rule, plus pass@n
            values = [m[name] for m in per_prompt if name in m]
            out[f"{'val-core' if core else 'val-aux'}/{source}/reward/{name}"] = sum(values) / len(values)
    n = max((len(g.trajectories) for g in groups), default=0)
    out["val/score/mean"] = _mean([_mean(list(g.rewards_G)) for g in groups])
    out[f"val/pass@{n}"] = _mean([pass_at(list(g.rewards_G), len(g.rewards_G)) for g in groups])
    out["val/response_length/mean"] = _mean([len(t.response_ids) for g in groups for t in g.trajectories])
    return out


def prompt_metrics(rewards: Sequence[float]) -> dict[str, float]:
    """One prompt's metrics over its n rewards, by verl's metric names.

    >>> m = prompt_metrics([0.0, 1.0])
    >>> m["mean@2"], m["best@2/mean"], m["worst@2/mean"], m["pass@1"], m["pass@2"]
    (0.5, 0.75, 0.25, 0.5, 1.0)
    """
    n = len(rewards)
    out = {f"mean@{n}": _mean(list(rewards))}
    if n > 1:
        out[f"std@{n}"] = math.sqrt(_mean([(r - out[f"mean@{n}"]) ** 2 for r in rewards]))
    for m in sizes(n):
        for name, (mean, std) in (("best", best_of(rewards, m)), ("worst", best_of([-r for r in rewards], m))):
            out[f"{name}@{m}/mean"] = mean if name == "best" else -mean
            out[f"{name}@{m}/std"] = std
    for m in [1, *sizes(n)]:
        out[f"pass@{m}"] = pass_at(rewards, m)
    return out


def sizes(n: int) -> list[int]:
    """verl's subset sizes for best/worst@m: 2, 4, 8, ... below n, then n (none for n <= 1)."""
    if n <= 1:
        return []
    return [2**i for i in range(1, n.bit_length()) if 2**i < n] + [n]


def best_of(rewards: Sequence[float], m: int) -> tuple[float, float]:
    """Mean and std of the largest of m draws with replacement from `rewards`: with the values
    sorted, v_(i) is the largest with probability (i/n)^m - ((i-1)/n)^m."""
    values, n = sorted(rewards), len(rewards)
    p_i = [(i / n) ** m - ((i - 1) / n) ** m for i in range(1, n + 1)]
    mean = sum(p * v for p, v in zip(p_i, values))
    var = sum(p * (v - mean) ** 2 for p, v in zip(p_i, values))
    return mean, math.sqrt(max(var, 0.0))


def pass_at(rewards: Sequence[float], m: int) -> float:
    """1 - C(n - c, m) / C(n, m), c = responses with reward >= PASS_SCORE."""
    n, c = len(rewards), sum(r >= PASS_SCORE for r in rewards)
    return 1.0 - math.comb(n - c, m) / math.comb(n, m) if n >= m > 0 else 0.0


def table(report: EvalReport) -> str:
    """The metrics as two aligned columns, val-core first."""
    keys = sorted(report.metrics, key=lambda k: (not k.startswith("val-core"), not k.startswith("val/"), k))
    width = max(len(k) for k in keys)
    head = f"{report.model} on {', '.join(report.data)}: {report.prompts} prompts x {report.n} responses"
    return "\n".join([head, *(f"{k:<{width}}  {report.metrics[k]:.4f}" for k in keys)])


def write_report(report: EvalReport, path: Path) -> None:
    atomic_write_text(path, json.dumps(dataclasses.asdict(report), indent=2) + "\n")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
