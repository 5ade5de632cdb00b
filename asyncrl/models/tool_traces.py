"""The tiny-tools model's conversations: its tokenizer and chat template, the warm-up's SFT traces,
and a scripted tool loop that measures how well a model uses the calculator.

A tool conversation, as token ids (what an episode concatenates; nothing is re-tokenised):

    <|system|>tools: calculator, python<|end|><|user|>What is 123456+654321?<|end|><|assistant|>   prompt
    <tool_call>calculator 123456+654321</tool_call><|end|>                                          trained
    <|tool|>777777<|end|><|assistant|>                                                              context
    Answer: 777777<|end|>                                                                           trained

The scripted loop here is a measuring device for the warm-up and the tests (an exact `a+b`
calculator, HF `generate`); it is not the rollout path, which is `asyncrl.agents`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from tokenizers import AddedToken
from transformers import (
    BatchEncoding,
    GenerationMixin,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from asyncrl.data import make_task
from asyncrl.data.tasks.long_addition import ANSWER_PREFIX
from asyncrl.models.tokenizer import SPECIALS, build_char_tokenizer
from asyncrl.rewards.puzzles import long_addition_score

TOOL_ROLE = "<|tool|>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOLS_CHAT_TEMPLATE = (
    "{% if tools %}<|system|>tools: {% for t in tools %}"
    "{{ t['function']['name'] if t['function'] is defined else t['name'] }}{% if not loop.last %}, {% endif %}"
    "{% endfor %}<|end|>{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""tiny's template plus a `tools=` line (the tools' names) and any role, `tool` included."""
OTHER_TOOLS = ("python", "search")
_CALL = re.compile(re.escape(CALL_OPEN) + r"calculator (\d+)\+(\d+)" + re.escape(CALL_CLOSE))


def build_tool_tokenizer() -> PreTrainedTokenizerFast:
    """tiny's character tokenizer plus a `<|tool|>` role (special) and the `<tool_call>` tags.

    The tags are added tokens but not special ones (as in Qwen's tokenizers): decoding with
    `skip_special_tokens=True` keeps them, so a tool-call parser and the reward still see them.
    """
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [*SPECIALS[3:], TOOL_ROLE]})
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (CALL_OPEN, CALL_CLOSE)])
    tok.chat_template = TOOLS_CHAT_TEMPLATE
    return tok


def tool_schemas(names: Sequence[str] = ("calculator", "python")) -> list[dict[str, Any]]:
    """OpenAI function schemas with these names (the template renders only the names)."""
    return [{"type": "function", "function": {"name": n, "description": "", "parameters": {}}} for n in names]


def chat_ids(tok: PreTrainedTokenizerBase, messages: Sequence[dict[str, str]],
             tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
    """The templated conversation's ids, ending with the generation prompt."""
    out = cast("BatchEncoding | list[int]", tok.apply_chat_template(
        [dict(m) for m in messages], tools=list(tools) if tools else None, add_generation_prompt=True,
        tokenize=True))
    return list(out["input_ids"] if isinstance(out, BatchEncoding) else out)


def turn_ids(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    """A model turn's ids: its text, then the end-of-turn token (EOS) the model stops with."""
    return [*tok.encode(text, add_special_tokens=False), int(tok.eos_token_id)]


@dataclass(frozen=True)
class TraceMix:
    """What the warm-up's traces are made of (fields of `TinyToolsSpec`)."""

    min_digits: int
    max_digits: int
    small_max_operand: int
    tool_share: float
    copy_noise: float
    tools_listed: float = 0.5
    small_share: float = 0.15


def sft_traces(tok: PreTrainedTokenizerBase, mix: TraceMix, n: int, seed: int) -> list[list[tuple[list[int], bool]]]:
    """n traces as (ids, trained) segments: a `small_share` are small additions answered directly,
    the rest long ones, of which a `tool_share` call the calculator and copy its result (a
    `copy_noise` share of those copying one digit wrong) and the others answer directly. A
    `tools_listed` share of prompts list the tools: the behaviour does not depend on it, so the
    model calls the tool whether or not a run templates its prompts with `tools=`. Prompts come
    from the tasks' train splits only."""
    rng = random.Random(seed)
    longs = make_task("long_addition", n, seed=seed, split="train",
                      min_digits=mix.min_digits, max_digits=mix.max_digits)
    smalls = make_task("arithmetic", n, seed=seed, split="train", high=mix.small_max_operand)
    traces = []
    for long_row, small_row in zip(longs, smalls):
        row = small_row if rng.random() < mix.small_share else long_row
        question, answer = row.messages[0]["content"], row.ground_truth
        tools = tool_schemas(_tool_names(rng)) if rng.random() < mix.tools_listed else None
        prompt = chat_ids(tok, row.messages, tools)
        if row is long_row and rng.random() < mix.tool_share:
            copied = _misspell(rng, answer) if rng.random() < mix.copy_noise else answer
            traces.append([(prompt, False), (turn_ids(tok, call_text(question)), True),
                           (tool_message_ids(tok, answer), False), (turn_ids(tok, ANSWER_PREFIX + copied), True)])
        else:
            traces.append([(prompt, False), (turn_ids(tok, ANSWER_PREFIX + answer), True)])
    return traces


def call_text(question: str) -> str:
    """The compact calculator call for "What is a+b?": `<tool_call>calculator a+b</tool_call>`."""
    expression = question.removeprefix("What is ").removesuffix("?")
    return f"{CALL_OPEN}calculator {expression}{CALL_CLOSE}"


def tool_message_ids(tok: PreTrainedTokenizerBase, result: str) -> list[int]:
    """A tool message alone between the template's delimiters, then the assistant's prompt."""
    return chat_ids(tok, [{"role": "tool", "content": result}])


def encode_traces(traces: Sequence[Sequence[tuple[list[int], bool]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels: -100 on the prompt, tool messages and padding (never trained)."""
    rows = [[t for ids, _ in segs for t in ids] for segs in traces]
    labels = [[t if trained else -100 for ids, trained in segs for t in ids] for segs in traces]
    width = max(map(len, rows))
    ids_t = torch.full((len(rows), width), pad_id)  # (B, T)
    lab_t = torch.full((len(rows), width), -100)
    for i, (r, lb) in enumerate(zip(rows, labels)):
        ids_t[i, : len(r)] = torch.tensor(r)
        lab_t[i, : len(lb)] = torch.tensor(lb)
    return ids_t, lab_t


@torch.no_grad()
def tool_loop_accuracy(model: PreTrainedModel, tok: PreTrainedTokenizerBase, questions: Sequence[str],
                       answers: Sequence[str], *, tools: bool, temperature: float = 0.0,
                       max_turn_tokens: int = 48) -> dict[str, float]:
    """Score on long additions with a scripted exact calculator: turn 1, then, where it wrote a
    well-formed calculator call and with `tools` (the prompt lists the tools, the calls are
    answered; without, a call goes unanswered and ends the episode), the tool's message and turn 2.
    Returns `accuracy` (the task's reward), `calls` (share with a well-formed call, answered or
    not) and `copied` (accuracy among the answered calls: the question and the result both copied)."""
    schemas = tool_schemas() if tools else None
    prompts = [chat_ids(tok, [{"role": "user", "content": q}], schemas) for q in questions]
    first = generate(model, tok, prompts, temperature, max_turn_tokens)
    calls = [_CALL.search(text(tok, ids)) for ids in first]
    responses = [list(ids) for ids in first]
    todo = [i for i, c in enumerate(calls) if c is not None and tools]
    if todo:
        context = {i: responses[i] + tool_message_ids(tok, str(int(c[1]) + int(c[2])))
                   for i in todo for c in [calls[i]] if c is not None}
        second = generate(model, tok, [prompts[i] + context[i] for i in todo], temperature, max_turn_tokens)
        for i, ids in zip(todo, second):
            responses[i] = context[i] + ids
    scores = [long_addition_score(text(tok, r), a)["score"] for r, a in zip(responses, answers)]
    copied = [scores[i] for i in todo]
    return {"accuracy": sum(scores) / len(scores), "calls": sum(c is not None for c in calls) / len(scores),
            "copied": sum(copied) / len(copied) if copied else 0.0}


def text(tok: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """The ids as a reward reads them: special tokens (roles, end of turn) dropped, call tags kept."""
    return str(tok.decode(list(ids), skip_special_tokens=True))


def generate(model: PreTrainedModel, tok: PreTrainedTokenizerBase, prompts: Sequence[list[int]],
             temperature: float, max_new_tokens: int) -> list[list[int]]:
    """Each prompt's continuation up to and including its EOS (HF generate, left padding)."""
    pad, eos = int(tok.pad_token_id), int(tok.eos_token_id)
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # (B, T)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    # transformers types generate's self as a Protocol that real models fail under mypy (read-only `device`)
    out = cast(GenerationMixin, model).generate(  # type: ignore[misc, unused-ignore]
        input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
        temperature=temperature or None, top_k=0, pad_token_id=pad, eos_token_id=eos)
    rows = []
    for row in out[:, width:].tolist():
        rows.append(row[: row.index(eos) + 1] if eos in row else row)
    return rows


def _tool_names(rng: random.Random) -> list[str]:
    names = ["calculator", *(t for t in OTHER_TOOLS if rng.random() < 0.5)]
    rng.shuffle(names)
    return names


def _misspell(rng: random.Random, answer: str) -> str:
    """The answer with one digit replaced by another."""
    i = rng.randrange(len(answer))
    wrong = rng.choice([d for d in "0123456789" if d != answer[i]])
    return answer[:i] + wrong + answer[i + 1:]
