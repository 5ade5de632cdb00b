"""The freshness rule of the fully asynchronous pipeline (SPEC §3), as a pure policy.

With R = require_batches x ppo_mini_batch_size prompts per local update and T =
trigger_parameter_sync_step updates per weight sync, between two syncs the rollouter starts at
most `floor((1 + staleness_threshold) x R x T) - num_stale` new prompts, where `num_stale`
counts the samples produced or in flight under an older version when the sync happened
(recounted at every sync). threshold 0 is synchronous streaming (exactly R x T per version);
threshold 1 is about one-step-off. `max_version_lag` adds a strict per-sample cap that the
aggregate rule alone does not give. No clocks, no I/O: the pipeline and the simulator share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class StalenessBudget:
    """How many prompts the rollouter may still start under the current version.

    Example: R=4, T=2, threshold=0.5 -> 12 per version. After 12 starts `can_start()` is
    False; a sync that finds 5 samples queued or in flight allows 12 - 5 = 7 more.
    """

    prompts_per_update: int
    updates_per_sync: int
    staleness_threshold: float
    max_version_lag: int = -1
    started: int = 0
    num_stale: int = 0

    @property
    def per_version(self) -> int:
        exact = (1 + self.staleness_threshold) * self.prompts_per_update * self.updates_per_sync
        return math.floor(exact + 1e-9)

    @property
    def remaining(self) -> int:
        return max(self.per_version - self.num_stale - self.started, 0)

    def can_start(self) -> bool:
        return self.remaining > 0

    def on_start(self) -> None:
        assert self.can_start(), "started a prompt beyond the staleness budget"
        self.started += 1

    def on_abandoned(self) -> None:
        """A started prompt ended without a sample (its run is stopping): it will be started
        again, so its start no longer counts."""
        self.started = max(self.started - 1, 0)

    def on_sync(self, num_stale: int) -> None:
        """A new version: reset the count, remember what is still stale."""
        self.started = 0
        self.num_stale = num_stale

    def admissible(self, sample_version: int, trainer_version: int) -> bool:
        """Per-sample cap: may a sample started under `sample_version` train now?"""
        return self.max_version_lag < 0 or trainer_version - sample_version <= self.max_version_lag
