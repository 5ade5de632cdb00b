"""The reward worker: decode each response, score it with its `data_source`'s function.

Reward functions are resolved for every data source at start-up (`check`), so a config
mistake fails before any generation. A raising or hanging function becomes score 0 with a
status and a counter (see `asyncrl.rewards.runner`), never a crashed step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from transformers import PreTrainedTokenizerBase

from asyncrl.config_schema import RewardConfig
from asyncrl.rewards import RewardFn, RewardStats, resolve_reward_fn, score_batch
from asyncrl.types import Group, PromptRow, Trajectory


class RewardWorker:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, cfg: RewardConfig) -> None:
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.stats = RewardStats()
        self._fns: dict[str, RewardFn] = {}

    def check(self, rows: Iterable[PromptRow]) -> None:
        """Resolve the function of every data source now (raises ConfigError if one is unknown)."""
        for source in {r.data_source for r in rows}:
            self._fn(source)

    def _fn(self, data_source: str) -> RewardFn:
        if data_source not in self._fns:
            self._fns[data_source] = resolve_reward_fn(data_source, self.cfg.custom_function or None)
        return self._fns[data_source]

    def score(self, rows: Sequence[PromptRow], trajectories: Sequence[Trajectory]) -> None:
        """Set reward, details and status on each trajectory (rows[i] is trajectory i's prompt)."""
        texts = self.tokenizer.batch_decode([list(t.response_ids) for t in trajectories], skip_special_tokens=True)
        by_source: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            by_source.setdefault(row.data_source, []).append(i)
        for source, idx in by_source.items():
            results = score_batch([rows[i] for i in idx], [texts[i] for i in idx],
                                  reward_fn=self._fn(source), timeout_s=self.cfg.timeout_s,
                                  max_workers=self.cfg.num_workers, stats=self.stats)
            for i, result in zip(idx, results):
                trajectories[i].reward = result.score
                trajectories[i].reward_details = dict(result.details)
                trajectories[i].reward_status = result.status

    def score_groups(self, groups: Sequence[Group]) -> None:
        rows = [g.row for g in groups for _ in g.trajectories]
        self.score(rows, [t for g in groups for t in g.trajectories])

    def metrics(self) -> dict[str, float]:
        return self.stats.metrics()
