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
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np

from asyncrl.config.schema import Config
from asyncrl.data.dataset import load_rows
from asyncrl.data.tasks import make_task
from asyncrl.types import PromptRow


class Workload:
    def __init__(self, cfg: Config, seed: int) -> None:
        self.sim = cfg.sim
        self.max_tokens = cfg.data.max_response_length
        self.from_prompt = cfg.rollout.length_from_prompt
        self.seed = seed
        self.rng = np.random.default_rng(seed)
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

    def difficulty(self, uid: str) -> float:
        """Z_prompt of this prompt: a standard normal that depends only on (seed, uid)."""
        z = self._difficulty.get(uid)
        if z is None:
            key = hashlib.blake2b(f"{self.seed}/{uid}".encode(), digest_size=8).digest()
            z = self._difficulty[uid] = float(np.random.default_rng(int.from_bytes(key, "little")).standard_normal())
        return z

    def rewards(self, n: int) -> list[float]:
        return (self.rng.random(n) < self.sim.accuracy).astype(float).tolist()


def sim_rows(cfg: Config) -> tuple[list[PromptRow], list[PromptRow]]:
    """The run's prompt rows with modelled prompt token ids (no tokenizer, no model)."""
    d = cfg.data
    if d.train_files:
        train = [r for i, f in enumerate(d.train_files) for r in load_rows(f, split_name=f"train{i}")]
        val = [r for i, f in enumerate(d.val_files) for r in load_rows(f, split_name=f"val{i}")]
    else:
        train = make_task(d.task, d.task_size, seed=cfg.seed, split="train")
        val = make_task(d.task, d.val_size, seed=cfg.seed, split="test")
    ids = (0,) * cfg.sim.prompt_length
    return ([dataclasses.replace(r, prompt_ids=ids) for r in train],
            [dataclasses.replace(r, prompt_ids=ids) for r in val])
