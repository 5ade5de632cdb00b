"""tiny-tools: its tokenizer and template, the warm-up's traces, its own cache key, and (slow) the
warmed model calling the calculator and copying the result with a scripted tool loop."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from asyncrl.config.load import load_config
from asyncrl.config.schema import ModelConfig
from asyncrl.models.loading import load_model, local_tokenizer_dir
from asyncrl.models.tiny import TinySpec
from asyncrl.models.tiny_tools import TinyToolsSpec, probe
from asyncrl.models.tool_traces import (
    TraceMix,
    build_tool_tokenizer,
    call_text,
    chat_ids,
    encode_traces,
    sft_traces,
    tool_loop_accuracy,
    tool_message_ids,
    tool_schemas,
    turn_ids,
)


def test_tiny_keeps_its_spec_and_cache_key() -> None:
    """The tiny model's cache directory name is pinned: tiny-tools must not move it."""
    assert TinySpec().key().startswith("tiny-")  # pinned in test_cache
    assert TinyToolsSpec().key().startswith("tiny_tools-")
    assert TinyToolsSpec(copy_noise=0.2).key() != TinyToolsSpec().key()
    assert TinyToolsSpec().arch().max_positions == 1024 > TinySpec().max_positions


def test_tiny_tools_keeps_asyncrls_defaults_like_tiny() -> None:
    """verl's defaults (lr 1e-6, greedy validation, ...) are for real models, not the built-in toys."""
    tiny, tools = (load_config(overrides=[f"model.path={m}"]) for m in ("tiny", "tiny-tools"))
    assert (tools.actor.lr, tools.rollout.val_temperature) == (tiny.actor.lr, tiny.rollout.val_temperature)
    assert load_config(overrides=["model.path=/some/model"]).rollout.val_temperature == 0.0


def test_template_renders_tools_and_a_tool_message() -> None:
    tok = build_tool_tokenizer()
    question = [{"role": "user", "content": "What is 12+5?"}]
    with_tools = tok.decode(chat_ids(tok, question, tool_schemas(["calculator", "python"])))
    assert with_tools == "<|system|>tools: calculator, python<|end|><|user|>What is 12+5?<|end|><|assistant|>"
    assert tok.decode(chat_ids(tok, question)) == "<|user|>What is 12+5?<|end|><|assistant|>"
    assert tok.decode(tool_message_ids(tok, "17")) == "<|tool|>17<|end|><|assistant|>"


def test_call_tags_are_single_tokens_that_survive_decoding() -> None:
    """A parser and the reward read text decoded without special tokens: the call's tags stay,
    the role markers go."""
    tok = build_tool_tokenizer()
    call = turn_ids(tok, call_text("What is 123+456?"))
    assert len(call) == len("calculator 123+456") + 3  # one token each for the tags and the end token
    response = call + tool_message_ids(tok, "579") + turn_ids(tok, "Answer: 579")
    assert tok.decode(response, skip_special_tokens=True) == \
        "<tool_call>calculator 123+456</tool_call>579Answer: 579"


def test_traces_train_only_the_models_tokens() -> None:
    tok = build_tool_tokenizer()
    mix = TraceMix(min_digits=6, max_digits=8, small_max_operand=99, tool_share=1.0, copy_noise=0.0)
    traces = sft_traces(tok, mix, 40, seed=3)
    ids, labels = encode_traces(traces, int(tok.pad_token_id))
    tool_traces = [i for i, segs in enumerate(traces) if len(segs) == 4]
    direct = [str(tok.decode(traces[i][0][0])) for i in range(len(traces)) if i not in tool_traces]
    assert direct and all(re.search(r"What is \d{1,2}\+\d{1,2}\?", p) for p in direct)  # tool_share=1: long ones call
    listed = [str(tok.decode(traces[i][0][0])).startswith("<|system|>tools: ") for i in tool_traces]
    assert any(listed) and not all(listed)  # calls with and without a tools line in the prompt
    i = tool_traces[0]
    prompt, call, tool, answer = (str(tok.decode(seg)) for seg, _ in traces[i])
    trained = tok.decode([t for t in labels[i].tolist() if t != -100])
    assert tool.startswith("<|tool|>")
    assert trained == call + answer and "<|tool|>" not in trained
    assert answer == f"Answer: {tool.removeprefix('<|tool|>').split('<|end|>')[0]}<|end|>"
    assert call == call_text(prompt.split("<|user|>")[1].split("<|end|>")[0]) + "<|end|>"
    assert (labels != -100).sum() < (ids != tok.pad_token_id).sum()


def test_tiny_tokenizer_lookup_ignores_tiny_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCRL_CACHE", str(tmp_path))
    build_tool_tokenizer().save_pretrained(tmp_path / TinyToolsSpec().key())
    assert local_tokenizer_dir("tiny") is None
    assert local_tokenizer_dir("tiny-tools") == tmp_path / TinyToolsSpec().key()


@pytest.mark.slow
def test_warmed_model_calls_the_calculator_and_copies_its_result(tiny_tools_cache: Path) -> None:
    """Greedy, the warmed model writes a well-formed call for most test prompts and copies the
    tool's result; without the tool (calls unanswered) the same model mostly fails."""
    model, tok = load_model(ModelConfig(path="tiny-tools"), log=lambda _: None)
    questions, answers = probe(TinyToolsSpec(), 48, split="test", seed=1)
    with_tool = tool_loop_accuracy(model, tok, questions, answers, tools=True)
    without = tool_loop_accuracy(model, tok, questions, answers, tools=False)
    assert with_tool["calls"] >= 0.75 and with_tool["copied"] >= 0.6
    assert with_tool["accuracy"] >= without["accuracy"] + 0.5
