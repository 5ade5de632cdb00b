"""The engine's per-request state: what has been generated, where it lives in the cache.

A `Sequence` is plain bookkeeping owned by the event-loop thread; the step thread never touches
it (it receives plain lists in a `StepPlan`). It does no I/O and holds no future: the engine maps
request ids to futures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from asyncrl.rollout.sampler import request_key
from asyncrl.types import FinishReason, GenerationRequest, Trajectory


@dataclass(eq=False)
class Sequence:
    """One request in flight. `response_ids` starts with the request's prefix."""

    request: GenerationRequest
    stop_ids: frozenset[int]
    sample_key: int  # the counter-based sampler's key (`asyncrl.rollout.sampler`)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    slot: int = -1
    cached_len: int = 0  # positions whose K/V are in its cache slot once the planned steps have run
    reused: int = 0  # positions of its context taken from the prefix cache at its last admission
    admit_order: int = -1  # larger = admitted later; the youngest is preempted first
    in_flight: int = 0  # planned steps whose token is not applied yet (the engine reads a step late)
    finish_reason: FinishReason | None = None
    submitted_at: float = field(default_factory=time.perf_counter)
    first_admitted_at: float | None = None
    first_token_at: float | None = None  # when the first token of this call was applied

    @staticmethod
    def from_request(request: GenerationRequest, eos_ids: tuple[int, ...], unseeded_key: int = 0) -> Sequence:
        """`unseeded_key`: the sampling key of a request without a seed (the engine draws one per
        request from its own seed); a seeded request's is `request_key(seed)`."""
        params = request.params
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop.update(eos_ids)
        return Sequence(
            request=request,
            stop_ids=frozenset(stop),
            sample_key=unseeded_key if params.seed is None else request_key(params.seed),
            response_ids=list(request.prefix_ids),
            logprobs=list(request.prefix_logprobs),
            versions=list(request.prefix_versions),
        )

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def context_ids(self) -> list[int]:
        """What a (re-)prefill feeds: prompt plus everything generated so far."""
        return list(self.request.prompt_ids) + self.response_ids

    @property
    def cached_ids(self) -> list[int]:
        """The tokens whose K/V its slot holds: the context's first `cached_len` (the last sampled
        token has none until a step feeds it)."""
        return self.context_ids[: min(self.cached_len, self.context_len)]

    @property
    def context_len(self) -> int:
        return len(self.request.prompt_ids) + len(self.response_ids)

    def finished_by(self) -> FinishReason | None:
        """Whether the tokens so far end this response ("stop" wins over "length")."""
        if self.response_ids and self.response_ids[-1] in self.stop_ids:
            return "stop"
        if len(self.response_ids) >= self.request.params.max_tokens:
            return "length"
        return None

    def append(self, token: int, logprob: float, version: int) -> None:
        self.response_ids.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)

    def to_trajectory(self, finish_reason: FinishReason) -> Trajectory:
        """A snapshot (lists copied), so later appends never leak into a returned partial."""
        now = time.perf_counter()
        admitted = self.first_admitted_at if self.first_admitted_at is not None else now
        timings = {"queue_s": admitted - self.submitted_at, "generate_s": now - self.submitted_at}
        if self.first_token_at is not None:  # time to first token: from the generate call
            timings["first_token_s"] = self.first_token_at - self.submitted_at
        return Trajectory(
            request_id=self.request_id,
            prompt_ids=list(self.request.prompt_ids),
            response_ids=list(self.response_ids),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            finish_reason=finish_reason,
            timings=timings,
        )
