"""The agent as a rollout episode: its reward, its chain as the trajectory, and every way an
agent fails (raises, hangs, never calls) as a counted, scored-0 episode; too many stop the run."""

from __future__ import annotations

import asyncio
import logging

import pytest

from asyncrl.agents.episode import EngineClient
from asyncrl.agents.gateway import AgentEpisode
from asyncrl.config.schema import AgentConfig, MultiTurnConfig
from asyncrl.errors import RolloutError
from asyncrl.training.batch import build_batch
from asyncrl.types import GenerationRequest, Group, PromptRow, SamplingParams, Trajectory
from tests.agents.fakes import ScriptedModel
from tests.agents.gateway.helpers import QUESTION, TOOL_TOK, CharModel, two_turns

ROW = PromptRow("u0", "long_addition", (QUESTION,), "42", prompt_ids=tuple(TOOL_TOK.encode("<|user|>Q<|end|>")))


def episode(fn: str, *, timeout_s: float = 30.0, window: int = 64, max_turns: int = 5) -> AgentEpisode:
    return AgentEpisode(AgentConfig(entrypoint=f"tests.agents.gateway.agents:{fn}", timeout_s=timeout_s),
                        MultiTurnConfig(enable=True, format="compact", max_assistant_turns=max_turns),
                        max_prompt_tokens=200, template_kwargs={}, max_failure_ratio=0.5, window=window)


def play(ep: AgentEpisode, partial: Trajectory | None = None, stopped: bool = False,
         model: ScriptedModel | CharModel | None = None) -> Trajectory:
    model = model or ScriptedModel(two_turns, tok=TOOL_TOK, version=7)
    client = EngineClient(GenerationRequest("ep0", ROW.prompt_ids, SamplingParams(max_tokens=96)), model, TOOL_TOK,
                          max_response_tokens=96, stopped=lambda: stopped)
    return asyncio.run(ep(ROW, client, partial))


def test_the_agents_dict_reward_is_kept_and_its_chain_is_the_trajectory():
    traj = play(episode("tool_loop"))
    assert traj.reward == 1.5 and traj.reward_details == {"correct": 1.0, "bonus": 0.5}
    assert traj.reward_status == "agent" and traj.finish_reason == "stop"
    assert TOOL_TOK.decode(list(traj.response_ids)).endswith("Answer: 42<|end|>")
    assert traj.episode["agent/chains"] == 1 and traj.episode["agent/calls"] == 2 and set(traj.versions) == {7}


def test_an_agent_given_a_base_url_reaches_the_loopback_listener():
    traj = play(episode("by_url"))
    assert traj.episode["agent/calls"] == 1 and traj.reward_status == ""  # None: the reward function scores it


@pytest.mark.parametrize(("fn", "status", "counter"), [
    ("raises", "agent_error", "agent/errors"), ("hangs", "agent_timeout", "agent/timeouts"),
    ("never_calls", "agent_no_calls", "agent/no_calls")])
def test_a_failing_agent_is_a_scored_zero_counted_episode(fn, status, counter, caplog):
    with caplog.at_level(logging.WARNING):
        traj = play(episode(fn, timeout_s=0.3))
    assert traj.reward == 0.0 and traj.reward_status == status and traj.episode[counter] == 1
    assert traj.finish_reason != "aborted" and traj.response_ids and len(traj.versions) == len(traj.response_ids)
    if fn == "raises":
        assert [r.message for r in caplog.records if "agent" in r.message][0].count("\n") == 0
    if fn == "never_calls":
        assert traj.loss_mask == [0]  # one sampled token for its version, never trained


def test_an_agent_refused_by_the_turn_limit_is_no_failure():
    traj = play(episode("stubborn", max_turns=2))
    assert traj.reward_status == "" and traj.episode["agent/errors"] == 0 and traj.episode["agent/calls"] == 2


def test_too_many_failed_episodes_stop_the_run_with_one_line():
    ep = episode("raises", window=2)
    play(ep)
    with pytest.raises(RolloutError, match="reward.max_failure_ratio") as err:
        play(ep)
    assert "\n" not in str(err.value)


def test_a_stopped_episode_comes_back_aborted_and_restarts_from_its_row():
    stopped = play(episode("one_call"), stopped=True)
    assert stopped.finish_reason == "aborted" and stopped.reward_status == ""
    resumed = play(episode("one_call"), partial=stopped)
    assert resumed.episode["agent/restarts"] == 1 and resumed.reward == 0.25 and resumed.finish_reason == "stop"


def test_an_agent_that_edits_its_history_is_one_trajectory_per_chain_each_token_exact():
    model = CharModel(lambda k: "<tool_call>calculator 1+2</tool_call>")  # one character a token: re-encodes otherwise
    traj = play(episode("edits_history"), model=model)
    assert traj.episode["agent/chains"] == 2 and traj.episode["agent/calls"] == 2
    assert traj.episode["agent/retokenized_tokens"] == 0  # the edit drops the first answer: nothing re-tokenised
    (first,) = traj.chains
    for chain, sampled in zip((first, traj), model.sampled, strict=True):
        assert list(chain.response_ids) == sampled and list(chain.loss_mask) == [1] * len(sampled)
        assert TOOL_TOK.encode(TOOL_TOK.decode(sampled), add_special_tokens=False) != sampled
    assert TOOL_TOK.decode(list(traj.prompt_ids)).endswith("Sure?<|end|><|assistant|>")
    batch = build_batch([Group("u0", ROW, [traj])], pad_id=0)  # both chains trained, with the episode's reward
    assert batch.responses[:, : len(first.response_ids)].tolist()[0] == list(first.response_ids)
    assert batch.loss_mask.sum(-1).tolist() == [len(s) for s in model.sampled]
    assert batch.token_level_scores.sum(-1).tolist() == [0.75, 0.75]
