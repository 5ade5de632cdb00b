"""Slow rewards are loud: the share of each step that reward timeouts cost, and one warning per run.

A reward function that hangs on 1 response in 10 makes every step wait out `reward.timeout_s`
for each hang: steps 80-400x slower, and nothing said so. Each step now logs

    reward/timeout_time_share = (reward-process seconds spent waiting out timed-out calls in the step)
                                / (reward processes x the step's seconds), clamped to [0, 1]

from the rollout side's cumulative `reward/timeout_wait_s` and `reward/workers` (summed over the
rollout workers). It is the share of the reward pool's time in the step that went to timeouts, so
an upper bound on the step time they explain where rewards are on the critical path. Above
`WARN_SHARE`, the run logs one warning line (once per run) naming `reward.timeout_s` and the
reward function(s) whose calls timed out.

Not here: the deadlines themselves (`asyncrl.rewards.pool`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from asyncrl.config.schema import RewardConfig
from asyncrl.errors import ConfigError
from asyncrl.rewards import resolve_reward_fn
from asyncrl.types import Group

WARN_SHARE = 0.2
"""Warn once timeouts took more than this share of a step's reward-pool time."""
SHARE_KEY = "reward/timeout_time_share"


@dataclass
class SlowRewards:
    """Per run: the last cumulative wait seen, and whether the warning was given."""

    waited_s: float = 0.0
    warned: bool = False

    def observe(self, cfg: RewardConfig, step: int, metrics: dict[str, float], groups: Sequence[Group],
                log: Callable[[str], None]) -> None:
        """Add `reward/timeout_time_share` to `metrics`; warn the first time it passes WARN_SHARE."""
        waited = metrics.get("reward/timeout_wait_s", 0.0)
        lost, self.waited_s = max(0.0, waited - self.waited_s), waited
        capacity = metrics.get("reward/workers", 0.0) * metrics.get("timing_s/step", 0.0)
        share = min(1.0, lost / capacity) if capacity > 0 else 0.0
        metrics[SHARE_KEY] = share
        if share > WARN_SHARE and not self.warned:
            self.warned = True
            log(f"warning: reward timeouts took {share:.0%} of step {step}'s reward time ({lost:.1f} s of "
                f"reward-process time, above {WARN_SHARE:.0%}): each hung call waits out "
                f"reward.timeout_s={cfg.timeout_s:g}; reward function {hung_functions(cfg, groups)}; "
                f"fix the function or lower reward.timeout_s (said once per run; see {SHARE_KEY})")


def hung_functions(cfg: RewardConfig, groups: Sequence[Group]) -> str:
    """The reward function(s) of the step's timed-out responses (of all its responses if none did)."""
    if cfg.functions:
        return ", ".join(cfg.functions)
    if cfg.custom_function:
        return cfg.custom_function
    trajectories = [(g.row.data_source, t) for g in groups for t in g.trajectories]
    sources = sorted({s for s, t in trajectories if t.reward_status == "timeout"} or {s for s, _ in trajectories})
    return ", ".join(f"{_name(s)} (data source '{s}')" for s in sources) or "(unknown: no responses in the step)"


def _name(data_source: str) -> str:
    try:
        fn = resolve_reward_fn(data_source)
    except ConfigError:
        return "?"
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
