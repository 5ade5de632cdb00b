"""The rollout server with an agent's episodes (`rollout.agent.entrypoint`): a call in flight at
a weight sync continues under the new weights, a stopped episode restarts from its row, and an
agent's reward or the run's reward function scores the group."""

from __future__ import annotations

import asyncio
import pickle

from asyncrl.agents.gateway import AgentEpisode
from asyncrl.config.schema import AgentConfig, MultiTurnConfig, RewardConfig, RolloutConfig
from asyncrl.workers.reward import RewardWorker
from asyncrl.workers.rollout import RequestBuilder
from asyncrl.workers.rollout_server import RolloutServer
from tests.agents.fakes import ScriptedModel, StepEngine
from tests.agents.gateway.helpers import TOOL_TOK, two_turns
from tests.agents.gateway.test_episode import ROW

TURN1 = len(TOOL_TOK.encode("<tool_call>calculator 12+30</tool_call><|end|>", add_special_tokens=False))


def agent_server(fn: str) -> RolloutServer:
    mt = MultiTurnConfig(enable=True, format="compact")
    cfg = RolloutConfig(temperature=1.0, multi_turn=mt)
    episode = AgentEpisode(AgentConfig(entrypoint=f"tests.agents.gateway.agents:{fn}"), mt, max_prompt_tokens=200,
                           template_kwargs={}, max_failure_ratio=0.5, window=8)
    return RolloutServer(StepEngine(ScriptedModel(two_turns, tok=TOOL_TOK)), RequestBuilder(cfg, max_tokens=96, seed=0),
                         RewardWorker(TOOL_TOK, RewardConfig()), episode=episode)


async def until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def test_a_call_in_flight_at_a_sync_continues_under_the_new_version():
    async def main():
        srv = agent_server("tool_loop")
        task = asyncio.create_task(srv.generate_scored(ROW, 1, "g"))
        await until(lambda: srv.engine.generated >= TURN1 + 3)  # inside the second call
        await srv.pause("abort")
        await srv.load_weights({}, version=1)
        await srv.resume()
        return (await task).trajectories[0], srv

    traj, srv = asyncio.run(main())
    versions = [v for v, m in zip(traj.versions, traj.loss_mask) if m == 1]
    assert srv.partial_continuations == 1 and traj.finish_reason == "stop"
    assert versions[:TURN1] == [0] * TURN1 and versions[-1] == 1 and versions == sorted(versions)
    assert traj.reward == 1.5 and traj.reward_status == "agent" and traj.episode["agent/chains"] == 1


def test_a_stopped_episode_restarts_from_its_row_and_a_finished_one_is_kept():
    async def main():
        srv = agent_server("tool_loop_unscored")
        task = asyncio.create_task(srv.generate_scored(ROW, 2, "g"))
        await until(lambda: srv.engine.generated >= 3)
        await srv.abort(["g/1"])
        stopped = await task
        partials = pickle.loads(pickle.dumps(stopped.trajectories))  # as a checkpoint keeps them
        resumed = await srv.generate_scored(ROW, 2, "g", partials=partials)
        return stopped, resumed

    stopped, resumed = asyncio.run(main())
    done, cut = stopped.trajectories
    assert done.finish_reason == "stop" and cut.finish_reason == "aborted" and cut.reward_status == "aborted"
    kept, restarted = resumed.trajectories
    assert kept is not done and kept.response_ids == done.response_ids and kept.episode == done.episode
    assert restarted.episode["agent/restarts"] == 1 and restarted.finish_reason == "stop"
    assert restarted.reward == 1.0 and done.reward == 1.0  # the run's reward function read "Answer: 42"
