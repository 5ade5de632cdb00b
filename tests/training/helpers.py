"""Random tiny causal LMs and hand-made groups for training tests (no hub, no warm-up)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from asyncrl.config.schema import ActorConfig
from asyncrl.types import Group, PromptRow, Trajectory

VOCAB = 32


def tiny_lm(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def make_groups(n_prompts: int = 2, n: int = 3, seed: int = 0) -> list[Group]:
    """Groups with ragged prompts/responses and rewards that differ within each group."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for p in range(n_prompts):
        prompt = torch.randint(3, VOCAB, (2 + p,), generator=g).tolist()
        trajs = []
        for i in range(n):
            resp = torch.randint(3, VOCAB, (1 + (i + p) % 4,), generator=g).tolist()
            trajs.append(Trajectory(request_id=f"p{p}/{i}", prompt_ids=prompt, response_ids=resp,
                                    logprobs=[-1.0] * len(resp), versions=[0] * len(resp),
                                    finish_reason="stop", reward=float(i % 2)))
        row = PromptRow(uid=f"p{p}", data_source="arithmetic", messages=(), ground_truth="0",
                        prompt_ids=tuple(prompt))
        groups.append(Group(uid=f"p{p}", row=row, trajectories=trajs))
    return groups


def groups_of_lengths(prompt_lens: list[int], response_lens_P: list[list[int]], seed: int = 0) -> list[Group]:
    """One group per prompt of the given length, one trajectory per response length (random tokens)."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for p, (prompt_len, lens) in enumerate(zip(prompt_lens, response_lens_P, strict=True)):
        prompt = torch.randint(3, VOCAB, (prompt_len,), generator=g).tolist()
        trajs = [Trajectory(request_id=f"p{p}/{i}", prompt_ids=prompt,
                            response_ids=torch.randint(3, VOCAB, (r,), generator=g).tolist(),
                            logprobs=[-1.0] * r, versions=[0] * r, finish_reason="stop", reward=float(i % 2))
                 for i, r in enumerate(lens)]
        row = PromptRow(uid=f"p{p}", data_source="arithmetic", messages=(), ground_truth="0",
                        prompt_ids=tuple(prompt))
        groups.append(Group(uid=f"p{p}", row=row, trajectories=trajs))
    return groups


def make_ragged_groups(seed: int = 0) -> list[Group]:
    """Three prompts of 2, 4 and 7 tokens x 4 long-tailed responses (1 to 14 tokens), so
    length-sorted micro-batches drop padding columns on both sides."""
    return groups_of_lengths([2, 4, 7], [[1, 2, 11, 3], [2, 1, 14, 2], [5, 1, 3, 2]], seed)


def gradient_terms(cfg: ActorConfig, tokens: int) -> int:
    """Terms an actor's loss sums into each gradient element over `tokens` response tokens: one
    per token and loss (policy, plus KL and entropy when on), for `tests.tolerances.sum_error`."""
    losses = 1 + bool(cfg.use_kl_loss) + bool(cfg.entropy_coeff)
    return tokens * losses
