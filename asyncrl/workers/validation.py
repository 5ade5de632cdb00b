"""Validation on the held-out split: `rollout.val_n` responses per prompt at
`rollout.val_temperature`, scored like training. Metrics: `val/score/mean` (mean@k over all
prompts), `val/pass@k`, and per data source `val-core/{source}/reward/mean@k` and `.../best@k`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from asyncrl.telemetry.metrics import timer
from asyncrl.types import Group

if TYPE_CHECKING:
    from asyncrl.workers.reward import RewardWorker
    from asyncrl.workers.rollout import RolloutWorker


async def validate(rollout: RolloutWorker, reward: RewardWorker, rows: list, k: int,
                   tag: str) -> dict[str, float]:
    """Generate, score and summarise; `tag` makes request ids unique per validation round."""
    if not rows:
        return {}
    metrics: dict[str, float] = {}
    with timer("testing", metrics):
        groups = await rollout.generate_groups(rows, k, uid_suffix=f"@val{tag}", mode="val")
        reward.score_groups(groups)
    return metrics | summarise(groups, k)


def summarise(groups: list[Group], k: int) -> dict[str, float]:
    by_source: dict[str, list[Group]] = defaultdict(list)
    for g in groups:
        by_source[g.row.data_source].append(g)
    out: dict[str, float] = {}
    for source, gs in by_source.items():
        out[f"val-core/{source}/reward/mean@{k}"] = _mean([_mean(g.rewards_G) for g in gs])
        out[f"val-core/{source}/reward/best@{k}"] = _mean([max(g.rewards_G) for g in gs])
    out["val/score/mean"] = _mean([_mean(g.rewards_G) for g in groups])
    out[f"val/pass@{k}"] = _mean([float(max(g.rewards_G) >= 1.0) for g in groups])
    out["val/response_length/mean"] = _mean([len(t.response_ids) for g in groups for t in g.trajectories])
    return out


def _mean(values: list[float] | list[int]) -> float:
    return sum(values) / len(values) if values else 0.0
