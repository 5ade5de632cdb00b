"""The simulated response lengths: a lognormal whose marginal law does not depend on
`sim.length_prompt_share`, with the responses of one prompt correlated when it is above 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

from asyncrl.config import load_config
from asyncrl.errors import ConfigError
from asyncrl.sim.workload import Workload
from asyncrl.types import PromptRow

PROMPTS, N, MEDIAN, SIGMA = 4000, 8, 500.0, 0.9
BIG = ["data.max_response_length=200000", "rollout.kv_budget_tokens=300000"]  # no response capped


def _rows(count: int) -> list[PromptRow]:
    return [PromptRow(uid=f"train-{i}", data_source="x", messages=(), ground_truth="") for i in range(count)]


def _log_lengths(rho: float, seed: int = 0) -> np.ndarray:  # (PROMPTS, N)
    cfg = load_config(None, [f"sim.length_median={MEDIAN}", f"sim.length_sigma={SIGMA}",
                             f"sim.length_prompt_share={rho}", *BIG])
    w = Workload(cfg, seed)
    return np.log(np.array([w.response_lengths(r, 0, N) for r in _rows(PROMPTS)], dtype=float))


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_marginal_law_is_the_same_lognormal_for_every_prompt_share(rho):
    logs = _log_lengths(rho)
    # the standard error of the log-median is ~0.9 * sqrt(rho/4000 + (1-rho)/32000) <= 0.014
    assert np.exp(np.median(logs)) == pytest.approx(MEDIAN, rel=0.05, abs=0)
    assert logs.std() == pytest.approx(SIGMA, rel=0.05, abs=0)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_responses_of_one_prompt_correlate_with_the_prompt_share(rho):
    logs = _log_lengths(rho)
    # two responses of each prompt: their log-lengths correlate with coefficient rho
    # (standard error ~1/sqrt(4000) = 0.016)
    corr = np.corrcoef(logs[:, 0], logs[:, 1])[0, 1]
    assert corr == pytest.approx(rho, rel=0, abs=0.05)


def test_a_prompt_keeps_its_difficulty_when_generated_again():
    cfg = load_config(None, ["sim.length_prompt_share=1.0", *BIG])
    row = _rows(1)[0]
    w = Workload(cfg, 7)
    first = w.response_lengths(row, 0, 4)
    w.rewards(100)  # the run's random stream moves on; the prompt's difficulty does not
    again = Workload(cfg, 7).response_lengths(row, 0, 4)
    assert first == again and len(set(first)) == 1  # rho = 1: all of a prompt's responses alike
    assert Workload(cfg, 8).difficulty(row.uid) != w.difficulty(row.uid)
    assert w.difficulty(row.uid) == w.difficulty("train-0")


def test_zero_share_draws_what_the_independent_model_drew():
    cfg = load_config(None, [f"sim.length_median={MEDIAN}", *BIG])
    drawn = np.rint(np.random.default_rng(3).lognormal(math.log(MEDIAN), cfg.sim.length_sigma, 16))
    assert Workload(cfg, 3).response_lengths(_rows(1)[0], 0, 16) == drawn.astype(int).tolist()


def test_prompt_share_outside_0_1_is_rejected():
    with pytest.raises(ConfigError, match="sim.length_prompt_share"):
        load_config(None, ["sim.length_prompt_share=1.5"])
