"""The simulated response lengths: a lognormal whose marginal law does not depend on
`sim.length_prompt_share`, with the responses of one prompt correlated when it is above 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

from asyncrl.config import load_config
from asyncrl.errors import ConfigError
from asyncrl.sim.workload import Workload, fit_budget
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


EPISODES = ["rollout.multi_turn.enable=true", "rollout.multi_turn.max_assistant_turns=6"]


def test_episode_turns_and_tool_latencies_follow_their_knobs():
    """1 + Poisson(turns_mean - 1) turns capped at max_assistant_turns; tool latencies lognormal
    around their median, cut at the tool timeout and counted as timeouts there."""
    cfg = load_config(None, [*BIG, *EPISODES, "sim.turns_mean=3", "sim.tool_latency_median_s=2",
                             "rollout.multi_turn.tool_timeout_s=6"])
    plans = Workload(cfg, 0).episodes(_rows(1)[0], 0, 20000)
    turns = np.array([len(p.turns_T) for p in plans])
    assert turns.min() == 1 and turns.max() == 6
    capped = np.minimum(1 + np.random.default_rng(1).poisson(2, 200000), 6)  # the law, drawn apart
    assert turns.mean() == pytest.approx(capped.mean(), rel=0.02, abs=0)
    calls = np.array([s for p in plans for s in p.tool_s])
    timeouts = np.array([t for p in plans for t in p.timeouts])
    assert np.median(calls) == pytest.approx(2.0, rel=0.05, abs=0) and calls.max() == 6.0
    p_over = 0.5 * math.erfc(math.log(3) / math.sqrt(2))  # P(lognormal(2 s, 1) >= 6 s)
    assert timeouts.mean() == pytest.approx(p_over, rel=0.1, abs=0) and np.all(calls[timeouts] == 6.0)


def test_an_episode_fits_its_token_budget():
    """Turns (300, 300, 300) with 64-token results in 700 tokens: 300 + 64 + 300 = 664, and a
    further call would leave no room for a token: two turns, truncated. Without a budget
    problem nothing is cut."""
    cut = fit_budget([300, 300, 300], [1.0, 2.0], 10.0, 64, 700, False)
    assert (cut.turns_T, cut.tool_s, cut.truncated) == ((300, 300), (1.0,), True)
    cut = fit_budget([300, 300, 300], [1.0, 2.0], 10.0, 64, 500, False)
    assert (cut.turns_T, cut.tool_s, cut.truncated) == ((300, 136), (1.0,), True)
    whole = fit_budget([300, 300, 300], [1.0, 20.0], 10.0, 64, 2000, False)
    assert (whole.turns_T, whole.tool_s, whole.timeouts, whole.truncated) == \
        ((300, 300, 300), (1.0, 10.0), (False, True), False)


def test_turns_mean_below_one_is_refused():
    cfg = load_config(None, [*EPISODES, "sim.turns_mean=0.5"])
    with pytest.raises(ConfigError, match="sim.turns_mean"):
        Workload(cfg, 0)
