"""The rollout server with multi-turn episodes: groups of episodes scored on their whole response,
abort inside a model turn or a tool call, continuation after a stop and across a sync."""

from __future__ import annotations

import asyncio
import copy
import pickle

import torch

from asyncrl.agents import EngineClient, EpisodeBuilder, MessageTemplate, ToolEpisode
from asyncrl.config.schema import MultiTurnConfig, RewardConfig, RolloutConfig
from asyncrl.rollout import TorchEngine, engine_settings
from asyncrl.types import PromptRow, Trajectory
from asyncrl.workers.reward import RewardWorker
from asyncrl.workers.rollout import RequestBuilder
from asyncrl.workers.rollout_server import RolloutServer
from tests.agents.fakes import TOK, AddTools, ScriptedModel, StepEngine, compact_calls
from tests.training.helpers import tiny_lm

CALL, ANSWER = "<tool_call>add 12+30</tool_call>", "The answer is 42"
PROMPT = tuple(TOK.encode("<|user|>What is 12+30?<|end|><|assistant|>", add_special_tokens=False))
ROW = PromptRow(uid="p", data_source="arithmetic", messages=(), ground_truth="42", prompt_ids=PROMPT)
TURN1 = len(TOK.encode(CALL + "<|end|>", add_special_tokens=False))
TOOL = len(MessageTemplate(TOK).encode("42"))


def two_turns(k: int) -> str:
    return CALL if k == 0 else ANSWER


def tool_server(tools: AddTools, **mt) -> RolloutServer:
    cfg = RolloutConfig(temperature=1.0, multi_turn=MultiTurnConfig(enable=True, format="compact", **mt))
    episode = ToolEpisode(cfg.multi_turn, tools, compact_calls, MessageTemplate(TOK))
    return RolloutServer(StepEngine(ScriptedModel(two_turns)), RequestBuilder(cfg, max_tokens=200, seed=0),
                         RewardWorker(TOK, RewardConfig()), episode=episode)


async def until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def test_a_group_is_n_episodes_scored_on_their_whole_response():
    tools = AddTools()
    group = asyncio.run(tool_server(tools).generate_scored(ROW, 2, "g"))
    assert [t.request_id for t in group.trajectories] == ["g/0", "g/1"] and len(tools.calls) == 2
    for t in group.trajectories:
        assert t.finish_reason == "stop" and t.reward == 1.0 and t.episode["num_turns"] == 2
        assert sum(1 for m in t.loss_mask if m == 0) == TOOL and "gen_end" in t.timings
        assert TOK.decode(list(t.response_ids), skip_special_tokens=True).endswith(ANSWER)


def test_abort_inside_a_model_turn_returns_the_partial_episode_which_continues():
    async def main():
        tools = AddTools()
        srv = tool_server(tools)
        whole = await srv.generate_scored(ROW, 1, "w")
        task = asyncio.create_task(srv.generate_scored(ROW, 1, "g"))
        await until(lambda: srv.engine.generated >= len(whole.trajectories[0].response_ids) - TOOL + TURN1 + 3)
        await srv.abort(["g/0"])
        stopped = await task
        partial = pickle.loads(pickle.dumps(stopped.trajectories[0]))  # as a checkpoint keeps it
        resumed = await srv.generate_scored(ROW, 1, "g", partials=[partial])
        return whole.trajectories[0], partial, resumed.trajectories[0], tools, srv

    whole, partial, resumed, tools, srv = asyncio.run(main())
    assert partial.finish_reason == "aborted" and partial.reward_status == "aborted"
    assert TURN1 + TOOL < len(partial.response_ids) < len(whole.response_ids)  # stopped inside turn 2
    assert partial.loss_mask[-1] == 1 and partial.episode["tool_calls"] == 1
    assert len(tools.calls) == 2 and srv.partial_continuations == 1  # one call per episode: never re-run
    assert resumed.response_ids == whole.response_ids and resumed.loss_mask == whole.loss_mask
    assert resumed.episode == whole.episode and resumed.reward == 1.0 and resumed.finish_reason == "stop"


def test_abort_during_a_tool_call_waits_for_it_and_keeps_its_result():
    async def main():
        tools = AddTools(delay_s=0.05)
        srv = tool_server(tools)
        task = asyncio.create_task(srv.generate_scored(ROW, 1, "g"))
        await until(lambda: len(tools.calls) == 1)  # the call is running
        await srv.abort(["g/0"])
        stopped = (await task).trajectories[0]
        resumed = (await srv.generate_scored(ROW, 1, "g", partials=[stopped])).trajectories[0]
        return stopped, resumed, tools

    stopped, resumed, tools = asyncio.run(main())
    assert stopped.finish_reason == "aborted" and len(stopped.response_ids) == TURN1 + TOOL
    assert list(stopped.loss_mask) == [1] * TURN1 + [0] * TOOL and stopped.episode["tool_calls"] == 1
    assert len(tools.calls) == 1 and resumed.episode["tool_calls"] == 1  # the resumed episode ran no tool
    assert resumed.finish_reason == "stop" and resumed.reward == 1.0


def test_a_sync_inside_a_turn_continues_it_under_the_new_version():
    async def main():
        srv = tool_server(AddTools())
        task = asyncio.create_task(srv.generate_scored(ROW, 1, "g"))
        await until(lambda: srv.engine.generated >= TURN1 + 3)
        await srv.pause("abort")
        await srv.load_weights({}, version=1)
        await srv.resume()
        return (await task).trajectories[0], srv

    traj, srv = asyncio.run(main())
    versions, mask = list(traj.versions), list(traj.loss_mask)
    assert traj.finish_reason == "stop" and srv.partial_continuations == 1  # the turn, continued once
    assert versions[:TURN1] == [0] * TURN1 and versions[-1] == 1
    assert versions == sorted(versions) and mask[TURN1:TURN1 + TOOL] == [0] * TOOL
    assert len(traj.response_ids) == TURN1 + TOOL + len(TOK.encode(ANSWER + "<|end|>", add_special_tokens=False))


ENV = (9, 10, 11)


async def echo_episode(row: PromptRow, client: EngineClient, partial: Trajectory | None) -> Trajectory:
    """Three model turns of 6 tokens, each followed by three environment tokens."""
    ep = EpisodeBuilder.resume(client.prompt_ids, partial)
    while True:
        prefix = ep.open_turn()
        turn = await client.generate([*client.prompt_ids, *ep.response_ids], max_tokens=6, prefix=prefix)
        ep.add_model(turn)
        if turn.finish_reason == "aborted":
            return ep.trajectory(client.episode_id, "aborted")
        if ep.loss_mask.count(0) == 2 * len(ENV):
            return ep.trajectory(client.episode_id, "stop")
        ep.add_environment(ENV)


def test_episodes_through_the_torch_engine_continue_across_a_sync_with_the_same_tokens():
    model = tiny_lm()

    def server() -> RolloutServer:
        engine = TorchEngine(copy.deepcopy(model), 0,
                             engine_settings(RolloutConfig(kv_budget_tokens=4096, max_num_seqs=8)))
        cfg = RolloutConfig(temperature=0.0, ignore_eos=True, multi_turn=MultiTurnConfig(enable=True))
        row_tok = type("NoTok", (), {"batch_decode": lambda self, ids, skip_special_tokens=True: ["1"] * len(ids)})()
        return RolloutServer(engine, RequestBuilder(cfg, max_tokens=40, seed=0), RewardWorker(row_tok, RewardConfig()),
                             episode=echo_episode)

    row = PromptRow(uid="p", data_source="arithmetic", messages=(), ground_truth="1", prompt_ids=(5, 6, 7))
    plain = asyncio.run(server().generate_scored(row, 2, "g"))

    async def interrupted():
        srv = server()
        task = asyncio.create_task(srv.generate_scored(row, 2, "g"))
        while srv.engine.stats().generated_tokens < 14:  # inside turn 2 or 3
            await asyncio.sleep(0.001)
        await srv.pause("abort")
        await srv.load_weights({n: p.detach().clone() for n, p in model.named_parameters()}, version=1)
        await srv.resume()
        return await task

    group = asyncio.run(interrupted())
    for a, b in zip(plain.trajectories, group.trajectories):
        assert b.response_ids == a.response_ids and len(b.response_ids) == 3 * 6 + 2 * len(ENV)
        assert list(b.loss_mask) == ([1] * 6 + [0] * 3) * 2 + [1] * 6
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), rtol=1e-5, atol=1e-5)
        assert b.versions[0] == 0 and b.versions[-1] == 1 and list(b.versions) == sorted(b.versions)
        assert b.reward == 1.0


async def kept_episode(row: PromptRow, client: EngineClient, partial: Trajectory | None) -> Trajectory:
    """Two model turns around an environment message; the slot is kept over the (tool) wait."""
    ep = EpisodeBuilder.resume(client.prompt_ids, partial)
    ep.add_model(await client.generate(client.prompt_ids, max_tokens=6))
    ep.count("kept", client.keep([*client.prompt_ids, *ep.response_ids], 5.0))
    await asyncio.sleep(0.02)  # the tool
    ep.add_environment(ENV)
    ep.add_model(await client.generate([*client.prompt_ids, *ep.response_ids], max_tokens=6))
    return ep.trajectory(client.episode_id, "stop")


def test_keep_slot_pins_the_conversation_and_the_next_turn_prefills_only_its_new_tokens():
    def run(keep_slot: str) -> tuple[Trajectory, object]:
        multi_turn = RolloutConfig(kv_budget_tokens=4096, max_num_seqs=8, multi_turn=MultiTurnConfig(enable=True))
        engine = TorchEngine(tiny_lm(), 0, engine_settings(multi_turn))
        cfg = RolloutConfig(temperature=0.0, ignore_eos=True,
                            multi_turn=MultiTurnConfig(enable=True, keep_slot=keep_slot))  # type: ignore[arg-type]
        no_tok = type("NoTok", (), {"batch_decode": lambda self, ids, skip_special_tokens=True: ["1"] * len(ids)})()
        srv = RolloutServer(engine, RequestBuilder(cfg, max_tokens=40, seed=0), RewardWorker(no_tok, RewardConfig()),
                            episode=kept_episode)
        row = PromptRow(uid="p", data_source="arithmetic", messages=(), ground_truth="1",
                        prompt_ids=tuple(3 + i % 25 for i in range(40)))  # whole blocks of the prefix cache
        traj = asyncio.run(srv.generate_scored(row, 1, "g")).trajectories[0]
        return traj, engine.stats()

    kept, stats = run("keep")
    released, _ = run("release")
    assert kept.episode["kept"] == 1 and released.episode["kept"] == 0
    assert kept.response_ids == released.response_ids and len(kept.response_ids) == 6 + len(ENV) + 6
    # turn 2 reuses the prompt and turn 1 (its last token was sampled, never fed): it prefills that
    # token and the environment's only
    assert stats.prefix_cache_hit_tokens == 40 + 6 - 1 and stats.prefill_tokens == 40 + 1 + len(ENV)
