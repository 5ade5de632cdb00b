"""The rollout worker: engines behind a least-loaded router, turning prompts into groups.

A prompt's group of n responses is the unit handed to training. Request ids are
`{uid}/{i}` and per-request seeds derive from (run seed, request id, attempt), so a
run and its resumed continuation sample the same tokens. Weight loads go to every engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import zlib
from collections.abc import Iterable, Sequence

import torch

from asyncrl.config_schema import RolloutConfig
from asyncrl.rollout import TorchEngine
from asyncrl.types import GenerationRequest, Group, Mode, PromptRow, SamplingParams, Trajectory


class RolloutWorker:
    def __init__(self, engines: Sequence[TorchEngine], cfg: RolloutConfig, *, max_tokens: int,
                 seed: int) -> None:
        assert engines, "need at least one engine"
        self.engines = list(engines)
        self.cfg = cfg
        self.max_tokens = max_tokens
        self.seed = seed
        self._load = [0] * len(engines)

    def sampling_params(self, mode: Mode = "train", request_seed: int | None = None) -> SamplingParams:
        """train: rollout.temperature/top_p/top_k; val: rollout.val_temperature; greedy: argmax."""
        if mode == "train":
            return SamplingParams(max_tokens=self.max_tokens, temperature=self.cfg.temperature,
                                  top_p=self.cfg.top_p, top_k=self.cfg.top_k, seed=request_seed,
                                  ignore_eos=self.cfg.ignore_eos)
        temperature = self.cfg.val_temperature if mode == "val" else 0.0
        return SamplingParams(max_tokens=self.max_tokens, temperature=temperature, seed=request_seed)

    def request_seed(self, request_id: str) -> int:
        return zlib.crc32(f"{self.seed}:{request_id}".encode())

    async def generate(self, request: GenerationRequest) -> Trajectory:
        """One response from the least-loaded engine."""
        i = min(range(len(self.engines)), key=self._load.__getitem__)
        self._load[i] += 1
        try:
            return await self.engines[i].generate(request)
        finally:
            self._load[i] -= 1

    async def generate_group(self, row: PromptRow, n: int, *, uid: str | None = None,
                             mode: Mode = "train") -> Group:
        uid = uid or row.uid
        requests = [self.request(row, f"{uid}/{i}", mode) for i in range(n)]
        trajectories = await asyncio.gather(*(self.generate(r) for r in requests))
        return Group(uid=uid, row=row, trajectories=list(trajectories))

    def request(self, row: PromptRow, request_id: str, mode: Mode = "train") -> GenerationRequest:
        params = self.sampling_params(mode, self.request_seed(request_id))
        if self.cfg.length_from_prompt and "length" in row.extra_info:
            # a long-tail workload whose lengths are set by the data, not by what the model learned
            length = min(int(row.extra_info["length"]), self.max_tokens)
            params = dataclasses.replace(params, max_tokens=length, ignore_eos=True)
        return GenerationRequest(request_id=request_id, prompt_ids=row.prompt_ids, params=params)

    async def generate_groups(self, rows: Sequence[PromptRow], n: int, *, uid_suffix: str = "",
                              mode: Mode = "train") -> list[Group]:
        return list(await asyncio.gather(*(
            self.generate_group(r, n, uid=r.uid + uid_suffix, mode=mode) for r in rows)))

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        tensors = list(named_tensors)
        for engine in self.engines:
            engine.load_weights(tensors, version)

    @property
    def version(self) -> int:
        return self.engines[0].version

    def preemptions(self) -> int:
        return sum(e.stats().preemptions for e in self.engines)
