"""The reward worker: decode each response, score it in the reward process pool, stop loudly.

Reward functions are resolved and their signature checked before the run starts
(`asyncrl.preflight`; `check` does the same for given rows), so a config mistake fails before
any generation. Each call then runs in a worker process
(`asyncrl.rewards.pool`) with a deadline: a raising, hanging, crashing or nonsense-returning
function scores 0 with a status and a counter, never a crashed step. But a run whose rewards mostly
fail learns nothing, so once more than `reward.max_failure_ratio` of the last `window` scored
responses failed (about one step's worth), `score` raises `RewardError` naming the failure.

Code rewards run model-written programs in the `sandbox` section's sandbox (handed to the pool's
processes). With `reward_scheduler.enable`, this worker owns RollPacker's `AdaptiveTimeout`: before
scoring it puts per-test timeouts (keyed by row uid and test index) into each code row's
`extra_info["code_timeouts_s"]`, extends that call's pool deadline past reward.timeout_s to their
sum plus CALL_SLACK_S (so a slow but correct program is not killed), and afterwards feeds the
per-test times of passing tests back as anchors; `reward/code_timeout_s_mean` reports the mean
timeout over the anchored cases.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter, deque
from collections.abc import Iterable, Sequence

from transformers import PreTrainedTokenizerBase

from asyncrl.config.long_tail import RewardSchedulerConfig, SandboxConfig
from asyncrl.config.schema import RewardConfig
from asyncrl.errors import ConfigError, RewardError
from asyncrl.rewards import (
    RewardPool,
    RewardResult,
    RewardStats,
    add_terms,
    check_signature,
    length_penalty,
    resolve_reward_fn,
    score_batch,
)
from asyncrl.rewards.batch_functions import BatchFunctions
from asyncrl.rewards.code_exec import CODE_SOURCES, count_tests
from asyncrl.rewards.reward_model import combine
from asyncrl.rewards.runner import Outcome
from asyncrl.scheduling.adaptive_timeout import AdaptiveTimeout
from asyncrl.training.reward_model import RewardModel
from asyncrl.types import Group, Mode, PromptRow, Trajectory

DEFAULT_WINDOW = 64
"""Responses judged together when the owner does not say (it passes train_batch_size * rollout.n)."""
_PLURAL = {"error": "errors", "timeout": "timeouts", "invalid": "invalid"}


class RewardWorker:
    """Thread-safe: `score` may run in several threads at once. `close()` ends its processes."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, cfg: RewardConfig, window: int = DEFAULT_WINDOW,
                 sandbox: SandboxConfig | None = None, scheduler: RewardSchedulerConfig | None = None,
                 max_response_length: int = 0, reward_model: RewardModel | None = None) -> None:
        """`max_response_length`: data.max_response_length, where DAPO's overlong punishment ends by default.
        `reward_model`: the learned reward model (`reward.model_path`), combined with the rule reward."""
        if cfg.num_workers < 1 or cfg.timeout_s <= 0:
            raise ConfigError(f"reward.num_workers must be >= 1 and reward.timeout_s > 0, got "
                              f"{cfg.num_workers} and {cfg.timeout_s}")
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.stats = RewardStats()
        self.failures = FailureWindow(cfg.max_failure_ratio, window)
        self.pool = RewardPool(cfg.num_workers, cfg.timeout_s, cfg.custom_function, sandbox)
        self.functions = BatchFunctions(cfg.functions, cfg.function_weights, cfg.timeout_s, self.pool) \
            if cfg.functions else None
        self.code_timeouts = CodeTimeouts(scheduler) if scheduler is not None and scheduler.enable else None
        self.overlong_max_len = cfg.overlong_max_len or max_response_length
        self.reward_model = reward_model
        self.rules = reward_model is None or cfg.rule_weight != 0
        """Whether rule rewards run in training: not for a reward model alone (rule_weight 0), as verl."""
        self._has_rule: dict[str, bool] = {}
        """Data source -> whether a rule scores it (validation with a reward model)."""

    def check(self, rows: Iterable[PromptRow]) -> None:
        """Resolve and signature-check every data source's function now (ConfigError if wrong)."""
        if self.functions is not None or not self.rules:
            return  # resolved when built; they score every data source (or no rule runs)
        for source in sorted({r.data_source for r in rows}):
            check_signature(resolve_reward_fn(source, self.cfg.custom_function or None), self.cfg.custom_function)

    def score(self, rows: Sequence[PromptRow], trajectories: Sequence[Trajectory], mode: Mode = "train") -> None:
        """Set reward, details and status on each trajectory (rows[i] is trajectory i's prompt).
        `mode` "val" (validation, `asyncrl eval`): with a reward model, the rule alone
        (`_validation_results`).

        Raises RewardError (after setting them) when too many recent rewards failed.
        """
        mine = [i for i, t in enumerate(trajectories) if not t.reward_status.startswith(AGENT_SCORED)]
        if len(mine) < len(trajectories):  # an agent scored these (or failed): kept as they are
            rows, trajectories = [rows[i] for i in mine], [trajectories[i] for i in mine]
            if not mine:
                return
        texts = self.tokenizer.batch_decode([list(t.response_ids) for t in trajectories], skip_special_tokens=True)
        if self.code_timeouts is not None:
            rows = [self.code_timeouts.attach(r) for r in rows]
        results = self._validation_results(rows, trajectories, texts) if mode == "val" and self.reward_model \
            else self._results(rows, trajectories, texts)
        for row, traj, result in zip(rows, trajectories, results):
            if self.cfg.overlong_buffer:
                result = add_terms(result, {"overlong_penalty": length_penalty(
                    len(traj.response_ids), self.overlong_max_len, self.cfg.overlong_buffer,
                    penalty_factor=self.cfg.overlong_penalty_factor)})
            if self.code_timeouts is not None:
                self.code_timeouts.learn(row, result)
            traj.reward = result.score
            traj.reward_details = {k: v for k, v in result.details.items() if not k.startswith(PER_TEST)}
            traj.reward_status = result.status
        self.failures.add([r.data_source for r in rows], results)

    def _results(self, rows: Sequence[PromptRow], trajectories: Sequence[Trajectory],
                 texts: Sequence[str]) -> list[RewardResult]:
        """The rule rewards (unless only the reward model scores), with the reward model's score added."""
        rules: list[RewardResult | None] = (list(self._rule_results(rows, texts, trajectories)) if self.rules
                                            else [None] * len(rows))
        if self.reward_model is None:
            return [r for r in rules if r is not None]
        scores = self.reward_model.score(rows, trajectories, texts)
        return [combine(r, s, self.cfg.rule_weight, self.cfg.model_weight) for r, s in zip(rules, scores)]

    def _rule_results(self, rows: Sequence[PromptRow], texts: Sequence[str],
                      trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        """The rule rewards: `reward.functions`, else each data source's function."""
        if self.functions is None:
            return score_batch(rows, texts, pool=self.pool, stats=self.stats,
                               defaults={"gsm8k_method": self.cfg.gsm8k_method})
        scored = self.functions.score(rows, texts, [t.response_ids for t in trajectories],
                                      max((t.end_version for t in trajectories), default=0))
        for row, result in zip(rows, scored):
            self.stats.record(Outcome(result, result.error), row.data_source)
        return list(scored)

    def _validation_results(self, rows: Sequence[PromptRow], trajectories: Sequence[Trajectory],
                            texts: Sequence[str]) -> list[RewardResult]:
        """Validation with a reward model scores as verl's `_validate` does, with the rule (its
        `val_reward_fn`, whatever `reward_model.enable`): the rule's score alone, unweighted, so
        val accuracy and pass@k read the task's verifier. A data source no rule scores (verl
        skips validating it): the reward model's weighted score, as in training."""
        assert self.reward_model is not None
        ruled = [i for i, r in enumerate(rows) if self.has_rule(r.data_source)]
        rest = [i for i, r in enumerate(rows) if not self.has_rule(r.data_source)]
        results: dict[int, RewardResult] = dict(zip(ruled, self._rule_results(
            [rows[i] for i in ruled], [texts[i] for i in ruled], [trajectories[i] for i in ruled])))
        if rest:
            scores = self.reward_model.score([rows[i] for i in rest], [trajectories[i] for i in rest],
                                             [texts[i] for i in rest])
            results |= {i: combine(None, s, 0.0, self.cfg.model_weight) for i, s in zip(rest, scores)}
        return [results[i] for i in range(len(rows))]

    def has_rule(self, data_source: str) -> bool:
        """Whether a rule scores `data_source`: `reward.functions`, `reward.custom_function` or a
        built-in scorer for it."""
        if data_source not in self._has_rule:
            try:
                if self.functions is None:
                    resolve_reward_fn(data_source, self.cfg.custom_function or None)
                self._has_rule[data_source] = True
            except ConfigError:
                self._has_rule[data_source] = False
        return self._has_rule[data_source]

    def score_groups(self, groups: Sequence[Group], mode: Mode = "train") -> None:
        rows = [g.row for g in groups for _ in g.trajectories]
        self.score(rows, [t for g in groups for t in g.trajectories], mode)

    def metrics(self) -> dict[str, float]:
        """Cumulative counts; `reward/timeout_wait_s` (worker seconds lost waiting out timeouts) and
        `reward/workers` let the trainer side compute `reward/timeout_time_share` per step."""
        metrics = self.stats.metrics() | {"reward/timeout_wait_s": self.pool.timeout_wait_s,
                                          "reward/workers": float(self.cfg.num_workers)}
        if self.code_timeouts is not None:
            metrics.update(self.code_timeouts.metrics())
        return metrics

    def close(self) -> None:
        """Kill the reward processes (a later `score` is a programmer error)."""
        self.pool.close()
        if self.functions is not None:
            self.functions.close()


AGENT_SCORED = "agent"
"""Statuses of rewards an agent set (`asyncrl.agents.gateway`): agent, agent_error, agent_timeout, ..."""
CALL_SLACK_S = 5.0
"""A code call's deadline over the sum of its tests' timeouts: interpreter and sandbox start-up."""
PER_TEST = ("test_pass/", "test_s/")
"""Per-test details of the code scorer: consumed here, not kept on trajectories."""


class CodeTimeouts:
    """The parent side of the adaptive code timeout: thread-safe wrapper of `AdaptiveTimeout`."""

    def __init__(self, cfg: RewardSchedulerConfig) -> None:
        self.policy = AdaptiveTimeout(cfg.timeout_lambda, cfg.min_timeout_s, cfg.max_timeout_s)
        self._tests: dict[str, int] = {}  # ground truth -> number of tests
        self._lock = threading.Lock()

    def attach(self, row: PromptRow) -> PromptRow:
        """`row` with one timeout per test in extra_info["code_timeouts_s"] (code data sources only)."""
        if row.data_source not in CODE_SOURCES:
            return row
        with self._lock:
            n = self._tests.setdefault(row.ground_truth, count_tests(row.ground_truth))
            timeouts = [self.policy.timeout((row.uid, i)) for i in range(n)]
        if not n:
            return row
        deadline = sum(timeouts) + CALL_SLACK_S  # every test may run up to its timeout: the call may take that
        return dataclasses.replace(row, extra_info={**row.extra_info, "code_timeouts_s": timeouts,
                                                    "reward_deadline_s": deadline})

    def learn(self, row: PromptRow, result: RewardResult) -> None:
        """Anchor each passing test's measured time (a failed call teaches nothing)."""
        if row.data_source not in CODE_SOURCES or result.status != "ok":
            return
        with self._lock:
            i = 0
            while f"test_pass/{i}" in result.details:
                self.policy.update((row.uid, i), result.details.get(f"test_s/{i}", 0.0),
                                   result.details[f"test_pass/{i}"] == 1.0)
                i += 1

    def metrics(self) -> dict[str, float]:
        with self._lock:
            return {"reward/code_timeout_s_mean": self.policy.mean_timeout(),
                    "reward/code_timeout_cases": float(len(self.policy.anchors))}


class FailureWindow:
    """The statuses of the last `size` scored responses; too many failures raise RewardError.

    Judged whenever the window is full, and on its own for any one `add` of >= `size` results.
    `max_ratio` >= 1.0 never raises. Example: max_ratio 0.5, size 4: adding ok, error, error
    raises nothing (not full); adding one more error makes 3 of 4 failed > 0.5: RewardError.
    """

    def __init__(self, max_ratio: float, size: int) -> None:
        assert size >= 1, size
        self.max_ratio = max_ratio
        self.size = size
        self._recent: deque[tuple[str, RewardResult]] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, data_sources: Sequence[str], results: Sequence[RewardResult]) -> None:
        entries = list(zip(data_sources, results))
        with self._lock:
            self._recent.extend(entries)
            judged = entries if len(entries) >= self.size else list(self._recent)
        if len(judged) >= self.size:
            self._judge(judged)

    def _judge(self, entries: list[tuple[str, RewardResult]]) -> None:
        failed = [(source, r) for source, r in entries if r.status != "ok"]
        if len(failed) <= self.max_ratio * len(entries):
            return
        counts = Counter(r.status for _, r in failed)
        first: dict[str, str] = {}
        for _, r in failed:
            first.setdefault(r.status, r.error)
        kinds = "; ".join(f"{_PLURAL[s]} {n}: {first[s]}" for s, n in counts.most_common())
        sources = ", ".join(f"'{s}'" for s in sorted({source for source, _ in failed}))
        raise RewardError(
            f"reward: {len(failed)} of {len(entries)} recent rewards failed ({kinds}; data source "
            f"{sources}), more than reward.max_failure_ratio={self.max_ratio:g}; fix the reward "
            f"function or raise reward.max_failure_ratio")
