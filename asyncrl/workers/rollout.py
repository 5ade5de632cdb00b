"""How a rollout host turns a prompt row into generation requests.

Request ids are `{uid}/{i}` and per-request seeds derive from (run seed, request id), so a run
and its resumed continuation sample the same tokens. Sampling follows the mode: training
samples at rollout.temperature/top_p/top_k, validation at rollout.val_temperature/val_top_p/val_top_k, the greedy
baseline (ReMax) at temperature 0.
"""

from __future__ import annotations

import dataclasses
import zlib

from asyncrl.config.schema import RolloutConfig
from asyncrl.types import GenerationRequest, Mode, PromptRow, SamplingParams


class RequestBuilder:
    def __init__(self, cfg: RolloutConfig, *, max_tokens: int, seed: int) -> None:
        self.cfg = cfg
        self.max_tokens = max_tokens
        self.seed = seed

    def sampling_params(self, mode: Mode = "train", request_seed: int | None = None) -> SamplingParams:
        """train: rollout.temperature/top_p/top_k; val: rollout.val_temperature/val_top_p/val_top_k; greedy: argmax."""
        if mode == "train":
            return SamplingParams(max_tokens=self.max_tokens, temperature=self.cfg.temperature,
                                  top_p=self.cfg.top_p, top_k=self.cfg.top_k, seed=request_seed,
                                  ignore_eos=self.cfg.ignore_eos)
        if mode == "val":
            return SamplingParams(max_tokens=self.max_tokens, temperature=self.cfg.val_temperature,
                                  top_p=self.cfg.val_top_p, top_k=self.cfg.val_top_k, seed=request_seed)
        return SamplingParams(max_tokens=self.max_tokens, temperature=0.0, seed=request_seed)

    def request_seed(self, request_id: str) -> int:
        return zlib.crc32(f"{self.seed}:{request_id}".encode())

    def request(self, row: PromptRow, request_id: str, mode: Mode = "train") -> GenerationRequest:
        params = self.sampling_params(mode, self.request_seed(request_id))
        if self.cfg.length_from_prompt and "length" in row.extra_info:
            # a long-tail workload whose lengths are set by the data, not by what the model learned
            length = min(int(row.extra_info["length"]), self.max_tokens)
            params = dataclasses.replace(params, max_tokens=length, ignore_eos=True)
        return GenerationRequest(request_id=request_id, prompt_ids=row.prompt_ids, params=params)

    def group(self, row: PromptRow, n: int, uid: str, mode: Mode = "train") -> list[GenerationRequest]:
        """The n requests of one group: ids `{uid}/0` .. `{uid}/{n-1}`."""
        return [self.request(row, f"{uid}/{i}", mode) for i in range(n)]
