"""The episode interface: the engine client's requests, the builder's resume, loading by name."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.agents import EngineClient, EpisodeBuilder, MessageTemplate, single_turn
from asyncrl.agents.build import episode_from_config, load_episode, prompt_data
from asyncrl.config.long_tail import SandboxConfig
from asyncrl.config.schema import MultiTurnConfig
from asyncrl.errors import ConfigError
from asyncrl.types import GenerationRequest, PromptRow, SamplingParams, Trajectory
from tests.agents.fakes import TOK, ScriptedModel

BASE = GenerationRequest("u/1", (4, 5, 6), SamplingParams(max_tokens=50, temperature=0.7, top_k=5, seed=100))
ROW = PromptRow(uid="u", data_source="x", messages=(), ground_truth="", prompt_ids=BASE.prompt_ids)


class Recorder:
    """A TurnRunner that records each request and answers its prefix, finished."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []

    async def __call__(self, request: GenerationRequest) -> Trajectory:
        self.requests.append(request)
        return Trajectory(request.request_id, request.prompt_ids, list(request.prefix_ids),
                          list(request.prefix_logprobs), list(request.prefix_versions), "stop")


def test_client_requests_carry_the_run_sampling_unique_ids_and_offset_seeds():
    model = Recorder()
    client = EngineClient(BASE, model, TOK, max_response_tokens=50)
    asyncio.run(client.generate([4, 5, 6, 7, 8], max_tokens=9))
    prefix = Trajectory("", (), [40, 41], [-0.1, -0.2], [2, 2], "aborted")
    asyncio.run(client.generate([4, 5, 6], max_tokens=9, prefix=prefix))
    first, second = model.requests
    assert (first.request_id, second.request_id) == ("u/1#0", "u/1#1")
    assert first.params.temperature == 0.7 and first.params.top_k == 5 and first.params.max_tokens == 9
    assert first.params.seed == 102 and second.params.seed == 102  # offset: 2 context tokens / 2 prefix tokens
    assert second.prefix_ids == (40, 41) and second.prefix_logprobs == (-0.1, -0.2) and second.prefix_versions == (2, 2)


def test_a_stopped_client_returns_its_prefix_aborted_without_the_engine():
    model = ScriptedModel(lambda k: "abc")
    client = EngineClient(BASE, model, TOK, max_response_tokens=50, stopped=lambda: True)
    prefix = Trajectory("", (), [40], [-0.1], [2], "aborted")
    turn = asyncio.run(client.generate([4, 5, 6], max_tokens=9, prefix=prefix))
    assert model.requests == [] and turn.finish_reason == "aborted" and list(turn.response_ids) == [40]


def test_single_turn_is_one_generate_over_the_whole_budget():
    model = ScriptedModel(lambda k: "hello")
    traj = asyncio.run(single_turn(ROW, EngineClient(BASE, model, TOK, max_response_tokens=50), None))
    assert traj.request_id == "u/1" and TOK.decode(list(traj.response_ids)) == "hello<|end|>"
    assert model.requests[0].params.max_tokens == 50 and traj.loss_mask == () and traj.episode == {}


def test_builder_masks_environment_tokens_and_resumes_an_open_turn():
    ep = EpisodeBuilder((1, 2))
    ep.add_model(Trajectory("", (), [5, 6], [-0.5, -0.6], [3, 4], "stop"))
    ep.add_environment([7, 8])
    ep.add_model(Trajectory("", (), [9], [-0.9], [4], "aborted"))
    ep.count("num_turns", 2)
    partial = ep.trajectory("e", "aborted")
    assert list(partial.loss_mask) == [1, 1, 0, 0, 1] and list(partial.logprobs) == [-0.5, -0.6, 0.0, 0.0, -0.9]
    assert list(partial.versions) == [3, 4, 4, 4, 4] and partial.episode == {"num_turns": 2}
    again = EpisodeBuilder.resume((1, 2), partial)
    turn = again.open_turn()
    assert turn is not None and list(turn.response_ids) == [9] and list(turn.versions) == [4]
    assert again.response_ids == [5, 6, 7, 8] and again.open_turn() is None
    between = EpisodeBuilder.resume((1, 2), Trajectory("e", (1, 2), [5, 7], [-0.5, 0.0], [3, 3], "aborted",
                                                       loss_mask=[1, 0]))
    assert between.open_turn() is None and between.response_ids == [5, 7]


def test_episode_names_that_do_not_resolve_are_config_errors_naming_the_key():
    for spec, match in [("nocolon", "must look like"), ("no.such.module:fn", "cannot import"),
                        ("asyncrl.agents.episode:nothing", "has no attribute"),
                        ("asyncrl.agents.episode:EpisodeBuilder", "must be an async function")]:
        with pytest.raises(ConfigError, match=f"rollout.multi_turn.episode.*{match}"):
            load_episode(spec)
    assert load_episode("asyncrl.agents.episode:single_turn") is single_turn


def test_episode_from_config():
    sandbox = SandboxConfig()
    assert episode_from_config(MultiTurnConfig(), TOK, sandbox=sandbox) is None
    custom = MultiTurnConfig(enable=True, episode="asyncrl.agents.episode:single_turn")
    assert episode_from_config(custom, TOK, sandbox=sandbox) is single_turn


def test_message_delimiters_of_the_tiny_template():
    message = MessageTemplate(TOK)
    assert (message.before, message.after) == ("<|tool|>", "<|end|><|assistant|>")
    assert TOK.decode(message.encode("7")) == "<|tool|>7<|end|><|assistant|>"


def test_a_template_that_drops_the_tool_message_is_a_config_error():
    tok = TOK.__class__(tokenizer_object=TOK.backend_tokenizer, eos_token="<|end|>")
    tok.chat_template = "{% for m in messages %}{% if m['role'] != 'tool' %}{{ m['content'] }}{% endif %}{% endfor %}"
    with pytest.raises(ConfigError, match="data.chat_template"):
        MessageTemplate(tok)


def test_the_tool_episode_prompts_list_its_tools_for_the_chat_template():
    from asyncrl.config.schema import DataConfig
    from asyncrl.data.held_out import prompt_rows
    from asyncrl.data.tasks import make_task

    tok = TOK.__class__(tokenizer_object=TOK.backend_tokenizer, eos_token="<|end|>")
    tok.chat_template = ("{% if tools %}<|system|>tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}"
                         "<|end|>{% endif %}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
                         "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    d = DataConfig(max_prompt_length=200)
    raw = make_task("arithmetic", 1)
    sandbox = SandboxConfig()
    with_tools = prompt_data(d, MultiTurnConfig(enable=True), sandbox)
    text = tok.decode(list(prompt_rows(raw, with_tools, tok, "x", print)[0].prompt_ids))
    assert text.startswith("<|system|>tools: calculator python <|end|><|user|>")
    assert prompt_data(d, MultiTurnConfig(), sandbox) is d
    assert prompt_data(d, MultiTurnConfig(enable=True, episode="m:f"), sandbox) is d


def test_the_built_in_episode_calls_the_real_calculator():
    episode = episode_from_config(MultiTurnConfig(enable=True, format="compact"), TOK, sandbox=SandboxConfig())
    assert episode is not None
    model = ScriptedModel(lambda k: "<tool_call>calculator 12+30</tool_call>" if k == 0 else "Answer: 42")
    traj = asyncio.run(episode(ROW, EngineClient(BASE, model, TOK, max_response_tokens=200), None))
    tool_text = TOK.decode([t for t, m in zip(traj.response_ids, traj.loss_mask) if m == 0])
    assert tool_text == "<|tool|>42<|end|><|assistant|>" and traj.episode["tool_errors"] == 0
    assert TOK.decode(list(traj.response_ids)).endswith("Answer: 42<|end|>")
