"""Step metrics: named stage timers and the verl-named data metrics of a batch.

`with timer("gen", metrics):` records `timing_s/gen`. `batch_metrics` computes
`critic/score/mean`, `response_length/mean|max|min|clip_ratio`, `prompt_length/mean` and the
advantage/return statistics verl logs, so existing dashboards read our runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from asyncrl.agents.metrics import episode_metrics
from asyncrl.telemetry import clock
from asyncrl.types import Group


@contextmanager
def timer(name: str, metrics: dict[str, float]) -> Iterator[None]:
    """Add the block's duration (`telemetry.clock`) to `metrics[f"timing_s/{name}"]` (accumulates)."""
    start = clock.now()
    try:
        yield
    finally:
        key = f"timing_s/{name}"
        metrics[key] = metrics.get(key, 0.0) + clock.now() - start


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    return {f"{prefix}/mean": float(values.float().mean()), f"{prefix}/max": float(values.max()),
            f"{prefix}/min": float(values.min())}


def group_metrics(groups: Sequence[Group], max_response_length: int) -> dict[str, float]:
    """Score and length statistics of finished groups."""
    trajs = [t for g in groups for t in g.trajectories]
    scores = torch.tensor([t.reward for t in trajs])
    lengths = torch.tensor([len(t.response_ids) for t in trajs], dtype=torch.float)
    prompt_lengths = torch.tensor([len(t.prompt_ids) for t in trajs], dtype=torch.float)
    out = _stats("critic/score", scores) | _stats("response_length", lengths)
    out |= _stats("prompt_length", prompt_lengths)
    out["response_length/clip_ratio"] = float((lengths >= max_response_length).float().mean())
    out["response_length/aborted_ratio"] = sum(t.finish_reason == "aborted" for t in trajs) / len(trajs)
    return out | episode_metrics(trajs)


def masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean/max/min of `values` over the tokens where mask is set."""
    return _stats(prefix, values[mask.bool()])



def reward_overlap_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """Rewards scored while generation went on (the reward scheduler): `timing_s/reward` is the
    reward time still waited for after the last response finished, `reward/hidden_ratio` the
    share of responses scored before it finished."""
    trajs = [t for g in groups for t in g.trajectories if "reward_end" in t.timings]
    if not trajs:
        return {}
    gen_end = max(t.timings["gen_end"] for t in trajs)
    reward_end = max(t.timings["reward_end"] for t in trajs)
    return {"timing_s/reward": max(reward_end - gen_end, 0.0),
            "reward/hidden_ratio": sum(t.timings["reward_end"] <= gen_end for t in trajs) / len(trajs)}
