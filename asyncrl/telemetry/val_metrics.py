"""Validation metrics: the one definition of what a run's validation (`asyncrl.pipelines.common.
run_validation`) and `asyncrl eval` log, so a key means the same number in a run's
metrics.jsonl and in an eval report. Named as verl names them
(`verl.trainer.ppo.metric_utils.process_validation_metrics` and the trainer's `val-core` /
`val-aux` split). Per data source, over the n scored responses of each prompt, averaged over
the source's prompts:

- `val-core/{source}/reward/mean@{n}`: the mean reward over all n responses of a prompt;
  `val-aux/.../std@{n}`: their spread;
- `best@{m}/mean`, `best@{m}/std`, `worst@{m}/...` for m = 2, 4, ... < n and n: the best (worst)
  reward of m responses drawn with replacement from the n. verl estimates these with 1,000
  bootstrap draws; here they are the exact expectations of the same draw (no sampling noise),
  so best@n is not the observed best: for rewards [0, 1], best@2/mean is 0.75;
- `pass@{m}` (m = 1, 2, 4, ..., n): the chance that at least one of m responses drawn without
  replacement passes (reward >= `PASS_SCORE`), the unbiased estimator of Chen et al. 2021
  ("Evaluating Large Language Models Trained on Code", eq. 1); verl has no such metric;
- over all sources: `val/score/mean` (mean@n over every prompt), `val/pass@{n}` (the share of
  prompts with a passing response) and `val/response_length/mean`.
The `@n` metrics of mean, best and pass are `val-core`, the rest `val-aux`, as in verl.

It lives in telemetry/ because both its users sit above it: `pipelines/` (training validation)
and the top-level `eval.py`; it reads only `asyncrl.types`. It is plain Python over floats (no
torch, no clock, no I/O). It neither generates nor scores responses: callers hand it scored groups.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from asyncrl.types import Group

PASS_SCORE = 1.0
"""A response passes when its reward is at least this (the built-in and verl scorers give 1 for a right answer)."""


def validation_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """The metrics of these scored groups (see the module docstring); none for no groups."""
    if not groups:
        return {}
    rewards_by_source: dict[str, list[list[float]]] = defaultdict(list)
    for g in groups:
        rewards_by_source[g.row.data_source].append(list(g.rewards_G))
    out: dict[str, float] = {}
    for source, rewards_P in sorted(rewards_by_source.items()):
        out |= source_metrics(source, rewards_P)
    rewards_P = [list(g.rewards_G) for g in groups]
    n = max(len(r) for r in rewards_P)
    out["val/score/mean"] = _mean([_mean(r) for r in rewards_P])
    out[f"val/pass@{n}"] = _mean([pass_at(r, len(r)) for r in rewards_P])
    out["val/response_length/mean"] = _mean([len(t.response_ids) for g in groups for t in g.trajectories])
    return out


def source_metrics(source: str, rewards_P: Sequence[Sequence[float]]) -> dict[str, float]:
    """One data source's `val-core/{source}/reward/...` and `val-aux/...` metrics: each prompt's
    `prompt_metrics`, averaged over the prompts that have it."""
    per_prompt = [prompt_metrics(r) for r in rewards_P]
    n = max(len(r) for r in rewards_P)
    out: dict[str, float] = {}
    for name in per_prompt[0]:
        core = name.startswith(("mean", "best", "pass")) and f"@{n}" in name  # verl's rule, plus pass@n
        out[f"{'val-core' if core else 'val-aux'}/{source}/reward/{name}"] = _mean([m[name] for m in per_prompt
                                                                                   if name in m])
    return out


def prompt_metrics(rewards: Sequence[float]) -> dict[str, float]:
    """One prompt's metrics over its n rewards, by verl's metric names.

    >>> m = prompt_metrics([0.0, 1.0])
    >>> m["mean@2"], m["best@2/mean"], m["worst@2/mean"], m["pass@1"], m["pass@2"]
    (0.5, 0.75, 0.25, 0.5, 1.0)
    """
    n = len(rewards)
    out = {f"mean@{n}": _mean(rewards)}
    if n > 1:
        out[f"std@{n}"] = math.sqrt(_mean([(r - out[f"mean@{n}"]) ** 2 for r in rewards]))
    for m in sizes(n):
        best_mean, best_std = best_of(rewards, m)
        worst_mean, worst_std = best_of([-r for r in rewards], m)  # the worst is minus the best of the negated
        out |= {f"best@{m}/mean": best_mean, f"best@{m}/std": best_std,
                f"worst@{m}/mean": -worst_mean, f"worst@{m}/std": worst_std}
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


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
