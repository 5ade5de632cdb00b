"""Typed messages that cross package boundaries: prompts, requests, trajectories, groups.

These are plain dataclasses of Python lists and scalars (no tensors): cheap to pickle across Ray,
easy to assert on in tests. Padded tensors (`TrainBatch`) are built on the trainer side only.
Besides them, the two names for weights that the roles, weight sync and engines share
(`WeightMeta`, `NamedTensors`; torch is imported for type checking only). This module imports
nothing from the rest of the package.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar, overload

if TYPE_CHECKING:
    import torch

WeightMeta = tuple[str, tuple[int, ...], str]
"""(name, shape, dtype name such as "float32" or "bfloat16") of one exported weight tensor."""
NamedTensors: TypeAlias = "Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]"
"""Weight tensors by name: a dict or (name, tensor) pairs (what `load_weights` takes)."""

FinishReason = Literal["stop", "length", "aborted"]
Mode = Literal["train", "val", "greedy"]
"""What a generation is for: training samples, validation samples, or a greedy baseline."""
V = TypeVar("V")


class RunLength(Sequence[V]):
    """A long sequence stored as (value, count) runs, in O(runs) memory.

    The simulator's responses are thousands of tokens it never materialises: their token ids,
    log-probs and per-token versions are `RunLength`s, so code that reads `len(...)`,
    `versions[0]` or `versions[-1]` works unchanged. Example:
    RunLength(((3, 2), (4, 1))) == [3, 3, 4]; .distinct() == {3, 4}.
    """

    __slots__ = ("runs", "_len")

    def __init__(self, runs: tuple[tuple[V, int], ...], length: int | None = None) -> None:
        self.runs = runs
        self._len = sum(n for _, n in runs) if length is None else length

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> V: ...
    @overload
    def __getitem__(self, index: slice) -> list[V]: ...
    def __getitem__(self, index: int | slice) -> V | list[V]:
        runs = self.runs  # start/end version (the simulator's hot path): no walk over the runs
        if index == 0 and runs and runs[0][1]:
            return runs[0][0]
        if index == -1 and runs and runs[-1][1]:
            return runs[-1][0]
        if isinstance(index, slice):
            return list(self)[index]
        i = index + self._len if index < 0 else index
        if not 0 <= i < self._len:
            raise IndexError(index)
        for value, n in self.runs:
            if i < n:
                return value
            i -= n
        raise AssertionError("unreachable")

    def __iter__(self) -> Iterator[V]:
        for value, n in self.runs:
            for _ in range(n):
                yield value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def distinct(self) -> set[V]:
        return {v for v, _ in self.runs}


@dataclass(frozen=True)
class PromptRow:
    """One dataset row in the verl layout, plus its tokenized prompt.

    Example: PromptRow(uid="train-3", data_source="arithmetic",
    messages=({"role": "user", "content": "What is 2+3?"},), ground_truth="5")
    """

    uid: str
    data_source: str
    messages: tuple[dict[str, str], ...]
    ground_truth: str
    ability: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)
    prompt_ids: tuple[int, ...] = ()
    text: str = ""
    """The prompt as raw text (a string `prompt`, TRL's standard format), tokenized as it is, without
    the chat template; `messages` is then empty."""


@dataclass(frozen=True)
class SamplingParams:
    """How one response is sampled. temperature 0 means greedy."""

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False


@dataclass(frozen=True)
class GenerationRequest:
    """Ask an engine for one response.

    `prefix_ids`/`prefix_logprobs`/`prefix_versions` continue a partial rollout: the engine
    treats prompt + prefix as context, counts the prefix against `max_tokens` and returns a
    trajectory whose response starts with the prefix (tokens, log-probs and versions kept).
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    prefix_ids: tuple[int, ...] = ()
    prefix_logprobs: tuple[float, ...] = ()
    prefix_versions: tuple[int, ...] = ()


@dataclass(slots=True)  # millions of them in a simulated run: half the construction time
class Trajectory:
    """One response: tokens, the behaviour policy's per-token log-probs and versions.

    `logprobs[t]` is the log-probability, under the policy of version `versions[t]` and the
    sampling temperature, of `response_ids[t]`. `start_version`/`end_version` are the versions
    the first and last token were produced under (they differ after a partial rollout).
    """

    request_id: str
    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    logprobs: Sequence[float]
    versions: Sequence[int]
    finish_reason: FinishReason
    reward: float = 0.0
    reward_details: dict[str, float] = field(default_factory=dict)
    reward_status: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    loss_mask: Sequence[int] = ()
    """Per response token: 1 the model produced it (trained), 0 tool or environment text (context,
    never trained; its log-prob entry is 0.0 and its version the episode's then). Empty: every
    token is the model's (a single-turn response)."""
    episode: dict[str, float] = field(default_factory=dict)
    """A multi-turn episode's counters (num_turns, tool_calls, tool_errors, tool_time_s, ...); empty for one turn."""
    chains: list[Trajectory] = field(default_factory=list)
    """An agent episode's other chains (`asyncrl.agents.gateway.chains`), in the order they began:
    each a trajectory of its own, trained with this one's reward and advantage (this trajectory
    is the chain of the episode's last call). Empty for every other response."""

    @property
    def start_version(self) -> int:
        versions = self.versions
        if type(versions) is RunLength and versions.runs and versions.runs[0][1]:  # the simulator's
            return versions.runs[0][0]  # responses: read the first run, no sequence protocol
        first = versions[0] if versions else -1
        return min(first, *(c.start_version for c in self.chains)) if self.chains else first

    @property
    def end_version(self) -> int:
        versions = self.versions
        if type(versions) is RunLength and versions.runs and versions.runs[-1][1]:
            return versions.runs[-1][0]
        return versions[-1] if versions else -1

    @property
    def num_segments(self) -> int:
        """How many policy versions produced this response (1 unless it was partially rolled out)."""
        if isinstance(self.versions, RunLength):
            return len(self.versions.distinct())
        return len(set(self.versions))

    def version_span(self) -> tuple[int, int, int]:
        """(start_version, end_version, num_segments) in one read: the staleness metrics and the
        sample ledger need all three of every response. Example: versions [3, 3, 4] -> (3, 4, 2)."""
        versions = self.versions
        if type(versions) is RunLength:  # the simulator's responses: read the runs once
            runs = versions.runs
            if runs and runs[0][1] and runs[-1][1]:
                return runs[0][0], runs[-1][0], 1 if len(runs) == 1 else len({v for v, _ in runs})
        return self.start_version, self.end_version, self.num_segments


@dataclass
class Group:
    """The n trajectories sampled for one prompt: the unit of GRPO-style advantages."""

    uid: str
    row: PromptRow
    trajectories: list[Trajectory]
    baseline_reward: float | None = None
    """ReMax: the reward of the greedy response to this prompt."""

    @property
    def rewards_G(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def min_version(self) -> int:
        return min([t.start_version for t in self.trajectories])

    def unaborted(self) -> Group:
        """This group's responses that finished (aborted ones are never scored); itself if all did."""
        done = [t for t in self.trajectories if t.finish_reason != "aborted"]
        return self if len(done) == len(self.trajectories) else Group(self.uid, self.row, done, self.baseline_reward)


@dataclass(frozen=True)
class EngineStats:
    """What a rollout engine reports about itself."""

    running: int
    waiting: int
    preemptions: int
    kv_used_tokens: int
    kv_capacity_tokens: int
    generated_tokens: int
    tokens_per_s: float
    version: int
    prefill_tokens: int = 0
    """Prompt positions prefilled so far (after prefix-cache reuse)."""
    prefix_cache_queries: int = 0
    """Admissions that looked up the prefix cache (0 without one)."""
    prefix_cache_hit_tokens: int = 0
    """Prompt positions taken from the prefix cache instead of prefilled."""
