"""What a simulated run generates: prompts, response lengths, rewards.

Prompts are the run's real prompt rows (its data files or built-in task), with a modelled
prompt length of `sim.prompt_length` tokens. A response's length is the row's
`extra_info["length"]` when `rollout.length_from_prompt` is set (the long-tail benchmark task,
so the simulator sees the very lengths a CPU run decodes); otherwise it is drawn from a
lognormal (median `sim.length_median`, shape `sim.length_sigma`) that can drift longer as the
policy version grows (`sim.length_growth`), capped at `data.max_response_length`. Rewards are
Bernoulli(`sim.accuracy`): they drive dynamic sampling and validation numbers, never learning.

A prompt can carry a difficulty (`sim.length_prompt_share` = rho, the share of the log-length
variance it explains):

    log L = log(median) + sigma * (sqrt(rho) * Z_prompt + sqrt(1 - rho) * Z_response)

Z_prompt is a standard normal fixed per prompt, derived from its uid and the run seed (not from
the run's random stream), so a prompt that tail batching aborts, queues and generates again in a
long round keeps its difficulty; Z_response is drawn per response. The marginal law of a
response's length is the same lognormal for every rho; the responses of one prompt correlate
(log-lengths with correlation rho), which is what makes a prompt's first responses predict its
tail. rho = 0 draws exactly what the model without it drew.

With `rollout.multi_turn.enable` a response is an episode (`EpisodePlan`): the model tokens it
generates are the single-turn draw above, split evenly over its assistant turns (every episode
`max_assistant_turns`, or 1 + Poisson(`sim.turns_mean` - 1) capped there); between two turns a
tool call lasts a lognormal time (median `sim.tool_latency_median_s`, shape
`sim.tool_latency_sigma`, a timeout at `multi_turn.tool_timeout_s`) and appends
`sim.tool_output_tokens` tokens; the whole response fits `multi_turn.max_episode_tokens` minus
the prompt (0: `data.max_response_length`), cut where it would not. Turns and tool latencies
come from their own random stream, so the response lengths, rewards and every single-turn
number stay what they were.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np

from asyncrl.config.schema import Config
from asyncrl.data.dataset import load_rows
from asyncrl.data.tasks import task_rows
from asyncrl.errors import ConfigError
from asyncrl.types import PromptRow


@dataclasses.dataclass(frozen=True)
class EpisodePlan:
    """One modelled episode: model tokens per assistant turn, the tool call after each turn but
    the last (seconds, whether it timed out) and the tokens each tool result appends.

    Example: 900 model tokens over 3 turns with 64-token tool results: turns_T (300, 300, 300),
    tool_s two latencies; the response is 900 + 2 x 64 = 1028 tokens, 128 of them context."""

    turns_T: tuple[int, ...]
    tool_s: tuple[float, ...]
    timeouts: tuple[bool, ...]
    tool_tokens: int
    truncated: bool
    """The episode reached its token budget (its finish reason is "length")."""


class Workload:
    def __init__(self, cfg: Config, seed: int) -> None:
        self.sim = cfg.sim
        self.max_tokens = cfg.data.max_response_length
        self.from_prompt = cfg.rollout.length_from_prompt
        self.multi_turn = cfg.rollout.multi_turn
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.tool_rng = np.random.default_rng((seed, 28))  # turns and tool latencies: their own stream
        if 0 < cfg.sim.turns_mean < 1:
            raise ConfigError(f"sim.turns_mean={cfg.sim.turns_mean} must be 0 (always max_assistant_turns) or >= 1")
        self._difficulty: dict[str, float] = {}  # prompt uid -> Z_prompt

    def response_lengths(self, row: PromptRow, version: int, n: int) -> list[int]:
        if self.from_prompt and "length" in row.extra_info:
            return [max(1, min(int(row.extra_info["length"]), self.max_tokens))] * n
        median = self.sim.length_median * (1 + self.sim.length_growth * version)
        rho, sigma = self.sim.length_prompt_share, self.sim.length_sigma
        if rho == 0.0:
            drawn = self.rng.lognormal(math.log(median), sigma, n)
        else:
            z = math.sqrt(rho) * self.difficulty(row.uid) + math.sqrt(1 - rho) * self.rng.standard_normal(n)
            drawn = np.exp(math.log(median) + sigma * z)
        return np.clip(np.rint(drawn), 1, self.max_tokens).astype(int).tolist()

    def episodes(self, row: PromptRow, version: int, n: int) -> list[EpisodePlan]:
        """The plans of n episodes of `row` (module docstring)."""
        mt, sim = self.multi_turn, self.sim
        budget = (mt.max_episode_tokens - len(row.prompt_ids) if mt.max_episode_tokens else self.max_tokens)
        out = []
        for total in self.response_lengths(row, version, n):
            turns = mt.max_assistant_turns
            if sim.turns_mean:
                turns = min(turns, 1 + int(self.tool_rng.poisson(sim.turns_mean - 1)))
            turns = max(1, min(turns, total))
            split = [total // turns + (i < total % turns) for i in range(turns)]
            drawn = self.tool_rng.lognormal(math.log(sim.tool_latency_median_s), sim.tool_latency_sigma, turns - 1)
            out.append(fit_budget(split, [float(s) for s in drawn], mt.tool_timeout_s, sim.tool_output_tokens,
                                  max(budget, 1), total >= self.max_tokens))
        return out

    def difficulty(self, uid: str) -> float:
        """Z_prompt of this prompt: a standard normal that depends only on (seed, uid)."""
        z = self._difficulty.get(uid)
        if z is None:
            key = hashlib.blake2b(f"{self.seed}/{uid}".encode(), digest_size=8).digest()
            z = self._difficulty[uid] = float(np.random.default_rng(int.from_bytes(key, "little")).standard_normal())
        return z

    def rewards(self, n: int) -> list[float]:
        return (self.rng.random(n) < self.sim.accuracy).astype(float).tolist()


def fit_budget(turns_T: list[int], tool_s: list[float], timeout_s: float, tool_tokens: int, budget: int,
               truncated: bool) -> EpisodePlan:
    """The episode's turns and tool calls that fit `budget` response tokens: a turn is cut where
    the budget ends, and no tool call starts unless a token of a next turn fits after it.

    Example: turns (300, 300, 300), 64-token results, budget 700: 300 + 64 + 300 = 664, then a
    tool call would leave no token: two turns, truncated."""
    kept: list[int] = []
    used = 0
    for i, n in enumerate(turns_T):
        if i:
            if used + tool_tokens + 1 > budget:
                truncated = True
                break
            used += tool_tokens
        kept.append(min(n, budget - used))
        used += kept[-1]
        if kept[-1] < n:
            truncated = True
            break
    calls = [min(s, timeout_s) for s in tool_s[:len(kept) - 1]]
    return EpisodePlan(tuple(kept), tuple(calls), tuple(s >= timeout_s for s in tool_s[:len(kept) - 1]),
                       tool_tokens, truncated)


def sim_rows(cfg: Config) -> tuple[list[PromptRow], list[PromptRow]]:
    """The run's prompt rows with modelled prompt token ids (no tokenizer, no model)."""
    d = cfg.data
    if d.train_files:
        train = [r for i, f in enumerate(d.train_files) for r in load_rows(f, split_name=f"train{i}")]
        val = [r for i, f in enumerate(d.val_files) for r in load_rows(f, split_name=f"val{i}")]
    else:
        train = task_rows(d, d.task_size, seed=cfg.seed, split="train")
        val = task_rows(d, d.val_size, seed=cfg.seed, split="test")
    ids = (0,) * cfg.sim.prompt_length
    return ([dataclasses.replace(r, prompt_ids=ids) for r in train],
            [dataclasses.replace(r, prompt_ids=ids) for r in val])
