"""The agent-loop interface: an episode is an async function from a prompt to one trajectory.

    async def episode(row: PromptRow, client: EngineClient, partial: Trajectory | None) -> Trajectory

An episode calls `client.generate` once per model turn and appends environment text (a tool's
answer, a user's reply) between the turns as token ids of its own. It returns ONE trajectory:
a GRPO group is n episodes of one prompt (`rollout.n`), scored on their whole response, as
verl's agent loop is. The trajectory's `response_ids` are the model's tokens as generated and
the environment's tokens as appended, never re-tokenised; `loss_mask` says which are the
model's (1, trained) and which are context (0: log-prob 0.0, version of the turn before).
An episode whose turns form several conversations that do not extend one another (an agent's
chains, `asyncrl.agents.gateway`) returns the last one and puts the others in its `chains`:
each trained as a row of its own with the episode's reward and advantage, the episode counted once.

`partial` is the same episode stopped earlier (finish_reason "aborted": a stop, a checkpoint,
tail batching): the episode continues it instead of starting over. `EpisodeBuilder.resume`
reads one back: a partial that ends in model tokens stopped inside a model turn, which the
next `generate` continues (`open_turn`); one that ends in environment text is between turns.

The single-turn rollout is the trivial episode (`single_turn`); the rollout server runs its
own single-turn path unless `rollout.multi_turn.enable`, so nothing changes for one turn.
Not here: tools and their messages (`asyncrl.agents.tool_episode`), how the server schedules,
aborts and resumes episodes (`asyncrl.workers.rollout_server`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

from asyncrl.telemetry.episode_spans import span_timings
from asyncrl.types import FinishReason, GenerationRequest, PromptRow, Trajectory

TurnRunner: TypeAlias = Callable[[GenerationRequest], Awaitable[Trajectory]]
"""How a client's requests reach the engine (the rollout server's: pause, park and abort apply)."""
Pin: TypeAlias = Callable[[Sequence[int], float], bool]
"""An engine's `pin(token_ids, seconds)` (TorchEngine's prefix cache; not in the Engine protocol)."""


class EngineClient:
    """An episode's handle on the rollout engine, built per episode by the rollout server.

    `generate` sends one turn as a `GenerationRequest` with the run's sampling parameters
    (those of the episode's base request: the mode's temperature, top-p, top-k), a request id
    unique per call (`{episode_id}#{k}`), and a seed derived from the base request's and the
    turn's offset in the episode, so a turn continued after a resume samples as it would have.
    Once the episode is aborted for good (`stopped()`), `generate` returns at once with
    finish_reason "aborted" and the prefix it was given, so the episode ends where it is.
    """

    def __init__(self, base: GenerationRequest, run: TurnRunner, tokenizer: Any, *,
                 max_response_tokens: int, stopped: Callable[[], bool] = lambda: False,
                 pin: Pin | None = None, unpin: Callable[[Sequence[int]], bool] | None = None) -> None:
        self.base = base
        self.episode_id = base.request_id
        self.tokenizer = tokenizer
        """The run's tokenizer (decode turns, encode environment text, apply the chat template)."""
        self.max_response_tokens = max_response_tokens
        """Tokens after the prompt at most, every turn and environment message included."""
        self._run = run
        self._stopped = stopped
        self._pin, self._unpin = pin, unpin
        self.calls = 0

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.base.prompt_ids

    def keep(self, token_ids: Sequence[int], seconds: float) -> bool:
        """Ask the engine to keep the KV of this conversation so far (`token_ids`, prompt
        included) for its next turn, at most `seconds` (a tool wait; `rollout.multi_turn.
        keep_slot=keep`). False when it does not (keep_slot=release, or an engine without pins)."""
        return self._pin is not None and self._pin(token_ids, seconds)

    def release(self, token_ids: Sequence[int]) -> None:
        """The conversation `keep` held has no next turn: its KV may go."""
        if self._unpin is not None:
            self._unpin(token_ids)

    def stopped(self) -> bool:
        """Whether the episode was aborted for good (its next `generate` returns "aborted")."""
        return self._stopped()

    async def generate(self, context_ids: Sequence[int], *, max_tokens: int,
                       prefix: Trajectory | None = None) -> Trajectory:
        """One model turn after `context_ids` (prompt + everything before this turn): up to
        `max_tokens` tokens, `prefix` included (an aborted turn's tokens, kept with their
        log-probs and versions). The trajectory's response starts with the prefix."""
        assert max_tokens >= 1, max_tokens
        rid = f"{self.episode_id}#{self.calls}"
        self.calls += 1
        kept = prefix.response_ids if prefix is not None else ()
        if self._stopped():
            return Trajectory(rid, tuple(context_ids), list(kept), list(prefix.logprobs if prefix else ()),
                              list(prefix.versions if prefix else ()), "aborted")
        offset = len(context_ids) - len(self.base.prompt_ids) + len(kept)
        seed = None if self.base.params.seed is None else self.base.params.seed + offset
        params = dataclasses.replace(self.base.params, max_tokens=max_tokens, seed=seed)
        request = GenerationRequest(rid, tuple(context_ids), params, prefix_ids=tuple(kept))
        if prefix is not None:
            request = dataclasses.replace(request, prefix_logprobs=tuple(prefix.logprobs),
                                          prefix_versions=tuple(prefix.versions))
        return await self._run(request)


Episode: TypeAlias = Callable[[PromptRow, EngineClient, "Trajectory | None"], Awaitable[Trajectory]]
"""`(row, client, partial) -> trajectory`: one episode (module docstring)."""


async def single_turn(row: PromptRow, client: EngineClient, partial: Trajectory | None) -> Trajectory:
    """The trivial episode: one model turn, the whole response budget, no environment."""
    turn = await client.generate(client.prompt_ids, max_tokens=client.max_response_tokens, prefix=partial)
    return dataclasses.replace(turn, request_id=client.episode_id, prompt_ids=client.prompt_ids)


class EpisodeBuilder:
    """An episode's response as it grows: model turns and environment text, with the per-token
    log-probs, versions and loss mask, and the episode's counters (`Trajectory.episode`).

    Example: add_model(turn of ids [5, 2]); add_environment([7, 8, 9]) ->
    response_ids [5, 2, 7, 8, 9], loss_mask [1, 1, 0, 0, 0], logprobs [a, b, 0.0, 0.0, 0.0],
    versions [v, v, v, v, v] (the environment's tokens take the last model token's version).
    """

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.prompt_ids = tuple(prompt_ids)
        self.response_ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.loss_mask: list[int] = []
        self.counters: dict[str, float] = {}
        self.timings: dict[str, float] = {}
        """Spans of this segment's turns and tool calls, for the run's trace (`span`)."""
        self._spans = 0
        self._open = 0

    @classmethod
    def resume(cls, prompt_ids: Sequence[int], partial: Trajectory | None) -> EpisodeBuilder:
        """A builder holding `partial` (None: empty). An aborted partial that ends in model tokens
        stopped inside that turn: `open_turn` hands those tokens to the next `generate`."""
        ep = cls(prompt_ids)
        if partial is None:
            return ep
        n = len(partial.response_ids)
        mask = list(partial.loss_mask) if partial.loss_mask else [1] * n
        assert len(mask) == n == len(partial.logprobs) == len(partial.versions), partial.request_id
        ep.response_ids, ep.logprobs = list(partial.response_ids), list(partial.logprobs)
        ep.versions, ep.loss_mask = list(partial.versions), mask
        ep.counters = dict(partial.episode)
        if partial.finish_reason == "aborted":
            ep._open = n - next((i + 1 for i in range(n - 1, -1, -1) if mask[i] == 0), 0)
        return ep

    def open_turn(self) -> Trajectory | None:
        """Take off the response the tokens of a model turn stopped midway, to continue them
        (`client.generate(..., prefix=...)`), or None when the episode is between turns."""
        n, self._open = self._open, 0
        if n == 0:
            return None
        cut = len(self.response_ids) - n
        turn = Trajectory("", (), self.response_ids[cut:], self.logprobs[cut:], self.versions[cut:], "aborted")
        del self.response_ids[cut:], self.logprobs[cut:], self.versions[cut:], self.loss_mask[cut:]
        return turn

    def add_model(self, turn: Trajectory) -> None:
        """A model turn's tokens as generated (its prefix included), trained."""
        self.response_ids += turn.response_ids
        self.logprobs += turn.logprobs
        self.versions += turn.versions
        self.loss_mask += [1] * len(turn.response_ids)

    def add_environment(self, ids: Sequence[int]) -> None:
        """Environment text between turns: context, never trained (log-prob 0.0)."""
        assert self.versions, "environment text follows a model turn"
        self.response_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [self.versions[-1]] * len(ids)
        self.loss_mask += [0] * len(ids)

    def span(self, name: str, start: float, end: float, **fields: float | str) -> None:
        """A timed part of the episode ("turn", "tool:<name>"; `telemetry.clock.now()` readings)
        that trace.json draws on the episode's lane (`asyncrl.telemetry.episode_spans`). A
        resumed builder starts none: an earlier segment's spans went with its own timings."""
        self.timings |= span_timings(self._spans, name, start, end, fields)
        self._spans += 1

    def count(self, name: str, by: float = 1.0) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + by

    def get(self, name: str) -> float:
        return self.counters.get(name, 0.0)

    def trajectory(self, episode_id: str, finish_reason: FinishReason) -> Trajectory:
        return Trajectory(episode_id, self.prompt_ids, list(self.response_ids), list(self.logprobs),
                          list(self.versions), finish_reason, loss_mask=list(self.loss_mask),
                          episode=dict(self.counters), timings=dict(self.timings))
