"""Random tiny causal LMs and hand-made groups for training tests (no hub, no warm-up)."""

from __future__ import annotations

import dataclasses

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


def episode(request_id: str, prompt: list[int], turns: list[list[int]], tools: list[list[int]],
            reward: float) -> Trajectory:
    """A multi-turn trajectory: model turns with tool text between them (after each turn but the
    last, or after every turn when `tools` has as many entries), as an episode builds it: the
    model's tokens trained (log-prob -1.0, version 0), the tool's context (log-prob 0.0, version 1)."""
    response, mask = [], []
    for i, turn in enumerate(turns):
        response += turn
        mask += [1] * len(turn)
        if i < len(tools):
            response += tools[i]
            mask += [0] * len(tools[i])
    return Trajectory(request_id=request_id, prompt_ids=prompt, response_ids=response,
                      logprobs=[-1.0 if m else 0.0 for m in mask], versions=[0 if m else 1 for m in mask],
                      finish_reason="stop", reward=reward, loss_mask=mask)


def episode_groups(n_prompts: int = 2, seed: int = 0) -> list[Group]:
    """Prompts x 3 episodes of two model turns (1-3 tokens) around a tool message (2-4 tokens),
    and in the second group a single-turn response (empty loss mask) and an episode that ends on
    tool text; rewards differ within each group."""
    g = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(3, VOCAB, (n,), generator=g).tolist()

    groups = []
    for p in range(n_prompts):
        prompt = tokens(2 + 3 * p)
        trajs = [episode(f"p{p}/{i}", prompt, [tokens(1 + (i + p) % 3), tokens(1 + i)], [tokens(2 + i)],
                         float(i % 2)) for i in range(3)]
        if p == 1:
            trajs[1] = Trajectory(request_id="p1/1", prompt_ids=prompt, response_ids=tokens(4), logprobs=[-1.0] * 4,
                                  versions=[0] * 4, finish_reason="stop", reward=0.0)
            trajs[2] = episode("p1/2", prompt, [tokens(2), tokens(1)], [tokens(2), tokens(3)], 1.0)
        row = PromptRow(uid=f"p{p}", data_source="arithmetic", messages=(), ground_truth="0",
                        prompt_ids=tuple(prompt))
        groups.append(Group(uid=f"p{p}", row=row, trajectories=trajs))
    return groups


def single_turn_as_episodes(groups: list[Group]) -> list[Group]:
    """The same groups with every trajectory's loss mask spelled out as all ones."""
    return [dataclasses.replace(g, trajectories=[dataclasses.replace(t, loss_mask=[1] * len(t.response_ids))
                                                 for t in g.trajectories]) for g in groups]


def two_episodes() -> list[Group]:
    """One prompt, two episodes: 3 model tokens around 2 tool tokens (reward 1), 2 model tokens
    around 4 tool tokens (reward 0): loss masks [1, 0, 0, 1, 1] and [1, 0, 0, 0, 0, 1]."""
    prompt = [3, 4, 5]
    trajs = [episode("e0", prompt, [[6], [7, 8]], [[9, 10]], 1.0),
             episode("e1", prompt, [[11], [12]], [[13, 14, 15, 16]], 0.0)]
    row = PromptRow(uid="p", data_source="arithmetic", messages=(), ground_truth="0", prompt_ids=tuple(prompt))
    return [Group(uid="p", row=row, trajectories=trajs)]
