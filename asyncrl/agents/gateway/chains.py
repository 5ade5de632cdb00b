"""Chains: an agent's calls joined into token-exact trajectories, never re-tokenising a model turn.

A call whose messages are an earlier call's messages, plus the assistant message that call
returned, plus new messages (tool results, a user's reply), CONTINUES that call's chain: its
prompt is the chain's tokens so far (prompt, every sampled turn, every environment message, as
ids) plus only the new messages, tokenised alone. The new messages' text is what the chat
template writes after the chain: the conversation is rendered with each of the chain's model
turns as the text the model wrote, and must start with the chain's decoded tokens; the rest is
the new text. A template that rewrites an earlier assistant turn (Qwen3 drops past `<think>`
blocks) fails that test, and so does a tokenizer whose decode is not exact: the call then
starts a NEW chain, counted (`template_rewrites`), its prompt the whole conversation rendered
and tokenised; so does any call that extends no chain (an edited history, a sub-agent, a
summariser). A chain's model tokens are trained (loss mask 1), everything else is context; each
chain that holds a turn is one trajectory of the episode (`asyncrl.agents.gateway.episode`).

Example (tiny-tools): call 1 [user U] -> prompt ids of `<|user|>U<|end|><|assistant|>`, sampled
`<tool_call>calculator 1+2</tool_call><|end|>`; call 2 [user U, assistant (that call), tool "3"]
-> new ids only for `<|tool|>3<|end|><|assistant|>`; the chain's response is
[sampled (mask 1), tool message (mask 0), the next turn (mask 1)].
Not here: HTTP, the engine call and the OpenAI objects (`session`, `server`, `chat`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncrl.agents.episode import EpisodeBuilder
from asyncrl.agents.gateway.chat import ApiError, ChatRequest, Message
from asyncrl.types import FinishReason, Trajectory


@dataclass
class Chain:
    """One token-exact conversation: its prompt, its response so far, the messages it answers."""

    index: int
    builder: EpisodeBuilder
    tools: str
    """The request's tools as JSON text: a call with other tools starts another chain."""
    messages: list[Message] = field(default_factory=list)
    """The conversation so far, ending with the assistant message the last call returned."""
    raw: dict[int, str] = field(default_factory=dict)
    """Index in `messages` -> the text the model wrote for that assistant message (tokens decoded, EOS off)."""
    finish_reason: FinishReason = "stop"
    busy: bool = False
    """A call on this chain is in flight (a concurrent call cannot extend it)."""
    calls: int = 0


@dataclass(frozen=True)
class Plan:
    """How one call runs: on which chain, after which context ids."""

    chain: Chain
    context_ids: list[int]
    new_ids: int
    """Tokens tokenised for this call (the whole prompt of a new chain; the new messages of a continued one)."""


class ChainBook:
    """The chains of one episode."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any], max_prompt_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = template_kwargs
        self.max_prompt_tokens = max_prompt_tokens
        self.chains: list[Chain] = []
        self.counters: dict[str, float] = {}
        self.sampled: dict[tuple[Any, ...], int] = {}
        """A returned assistant message's key -> its sampled token count (a new chain that holds it
        re-tokenises that many sampled tokens: counted)."""

    def plan(self, req: ChatRequest, tools: str) -> Plan:
        """The chain this call continues (its context ids), else a new chain."""
        for chain in reversed(self.chains):
            if chain.busy or chain.tools != tools or not extends(req.messages, chain.messages):
                continue
            new = self._continued_text(chain, req)
            if new is None:
                self._count("template_rewrites")
                break
            ids = self._encode(new)
            return Plan(chain, [*chain.builder.prompt_ids, *chain.builder.response_ids, *ids], len(ids))
        return self._new_chain(req, tools)

    def record(self, plan: Plan, turn: Trajectory, returned: Message, raw_text: str, req: ChatRequest) -> None:
        """The call's turn joins its chain: the new messages as context, the sampled tokens trained."""
        chain, ep = plan.chain, plan.chain.builder
        start = len(ep.prompt_ids) + len(ep.response_ids)
        env = plan.context_ids[start:]
        if env:
            ep.add_environment(env)
        ep.add_model(turn)
        chain.messages = [*req.messages, returned]
        chain.raw[len(chain.messages) - 1] = raw_text
        chain.finish_reason = turn.finish_reason
        if chain.calls == 0:  # a chain counts once it holds a turn: one whose first call failed is no trajectory
            self._count("chains")
        chain.calls += 1
        self.sampled[returned.key()] = len(turn.response_ids)

    def _new_chain(self, req: ChatRequest, tools: str) -> Plan:
        text = self._render([m.for_template() for m in req.messages], req)
        ids = self._encode(text)
        if len(ids) > self.max_prompt_tokens:
            raise ApiError(400, f"the conversation is {len(ids)} tokens, more than the run's prompt limit "
                           f"{self.max_prompt_tokens} (data.max_prompt_length)", code="context_length_exceeded",
                           param="messages")
        retokenised = sum(self.sampled.get(m.key(), 0) for m in req.messages if m.role == "assistant")
        self._count("retokenized_tokens", retokenised)
        chain = Chain(len(self.chains), EpisodeBuilder(ids), tools)
        self.chains.append(chain)
        return Plan(chain, ids, len(ids))

    def _continued_text(self, chain: Chain, req: ChatRequest) -> str | None:
        """The new messages' text after the chain, or None when the template does not render the
        chain's own turns as the model wrote them."""
        msgs = [m.for_template(chain.raw.get(i)) for i, m in enumerate(req.messages)]
        full = self._render(msgs, req)
        ep = chain.builder
        so_far = self.tokenizer.decode([*ep.prompt_ids, *ep.response_ids], skip_special_tokens=False)
        return full[len(so_far):] if full.startswith(so_far) and len(full) > len(so_far) else None

    def _render(self, messages: list[dict[str, Any]], req: ChatRequest) -> str:
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=list(req.tools) or None, tokenize=False,
                                                      add_generation_prompt=True, **self.template_kwargs)
        except Exception as exc:  # a template may reject a message it cannot render
            raise ApiError(400, f"the chat template cannot render these messages ({type(exc).__name__}: {exc})",
                           param="messages") from exc
        return str(text)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _count(self, name: str, by: float = 1.0) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + by


def extends(messages: Sequence[Message], earlier: Sequence[Message]) -> bool:
    """`messages` are `earlier` (ending with the assistant message returned) plus at least one more."""
    if not earlier or len(messages) <= len(earlier):
        return False
    return all(a.key() == b.key() for a, b in zip(messages, earlier))
