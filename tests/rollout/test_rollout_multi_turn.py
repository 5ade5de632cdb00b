"""TorchEngine serving multi-turn conversations with its prefix cache: a turn's prompt is the
conversation so far, and only its new tokens are prefilled; outputs equal the engine's without
the cache (same tolerance as the other engine tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from asyncrl.config.schema import MultiTurnConfig, RolloutConfig
from asyncrl.rollout import TorchEngine
from asyncrl.rollout.settings import engine_settings
from asyncrl.types import EngineStats, Trajectory
from tests.rollout.rollout_testlib import engine, prompt, request, tiny_model

TOOL_TOKENS = 5  # tokens a scripted tool message appends between turns


def tool_message(episode: int, turn: int) -> list[int]:
    return list(prompt(TOOL_TOKENS, seed=1000 * episode + turn))


async def converse(eng: TorchEngine, episode: int, turns: int, prompt_len: int, max_tokens: int,
                   stats: list[EngineStats] | None = None, **params: Any) -> list[Trajectory]:
    """One scripted conversation: each turn's prompt is the last prompt + its response + a tool message."""
    ids = list(prompt(prompt_len, seed=episode))
    outs = []
    for turn in range(turns):
        out = await eng.generate(request(f"e{episode}t{turn}", tuple(ids), max_tokens, **params))
        outs.append(out)
        if stats is not None:
            stats.append(eng.stats())
        ids += list(out.response_ids) + tool_message(episode, turn)
        await asyncio.sleep(0)
    return outs


def assert_same(outs: Sequence[Trajectory], refs: Sequence[Trajectory]) -> None:
    for out, ref in zip(outs, refs, strict=True):
        assert out.response_ids == ref.response_ids, out.request_id
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(ref.logprobs), rtol=0, atol=1e-5)


def run_conversations(model: torch.nn.Module, episodes: int, turns: int, read_late: bool = False,
                      **settings: Any) -> tuple[list[Trajectory], EngineStats, int]:
    """Every conversation at once; (trajectories, the engine's last stats, prefix-cache evictions).
    `read_late`: results read a step late, as on a GPU."""
    async def main() -> tuple[list[Trajectory], EngineStats, int]:
        eng = engine(model, **settings)
        eng._runner.read_late = read_late
        outs = await asyncio.gather(*(converse(eng, e, turns, 20 + 3 * e, 4 + e % 5) for e in range(episodes)))
        stats, prefix = eng.stats(), eng._prefix
        await eng.aclose()
        return [t for conv in outs for t in conv], stats, 0 if prefix is None else prefix.evictions

    return asyncio.run(main())


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
def test_turns_after_the_first_prefill_only_their_new_tokens(arch: str) -> None:
    model = tiny_model(arch)
    stats: list[EngineStats] = []

    async def main(prefix_cache: bool) -> list[Trajectory]:
        eng = engine(model, prefix_cache=prefix_cache)
        outs = await converse(eng, 0, 3, 40, 7, stats if prefix_cache else None)
        await eng.aclose()
        return outs

    refs, outs = asyncio.run(main(False)), asyncio.run(main(True))
    assert_same(outs, refs)
    prefilled = [s.prefill_tokens for s in stats]
    # turn 1: the 40-token prompt; turns 2 and 3: the last sampled token (never fed) + the tool message
    assert [prefilled[0], prefilled[1] - prefilled[0], prefilled[2] - prefilled[1]] == [40, 1 + TOOL_TOKENS,
                                                                                       1 + TOOL_TOKENS]
    assert [s.prefix_cache_queries for s in stats] == [1, 2, 3]
    assert stats[-1].prefix_cache_hit_tokens == (40 + 6) + (40 + 7 + TOOL_TOKENS + 6)


@pytest.mark.parametrize(("cuda_graphs", "read_late"), [(False, False), (True, False), (True, True)])
def test_conversations_under_slot_and_budget_pressure_equal_the_engine_without_a_cache(cuda_graphs: bool,
                                                                                        read_late: bool) -> None:
    """Six conversations in eight slots and a 250-token budget: entries are moved out of the way
    and evicted for slots and for the budget; greedy outputs stay those of the engine without a
    cache. Static decode pads rows into the entries' slots (CUDA graphs' layout, run eagerly here);
    a late read (a GPU's) runs a finished row one extra step before its entry is made."""
    model = tiny_model("llama")
    settings: dict[str, Any] = dict(max_num_seqs=8, kv_budget_tokens=250, cuda_graphs=cuda_graphs)
    refs, _, _ = run_conversations(model, episodes=6, turns=3, read_late=read_late, **settings)
    outs, stats, evictions = run_conversations(model, episodes=6, turns=3, read_late=read_late, prefix_cache=True,
                                               **settings)
    assert_same(outs, refs)
    assert stats.prefix_cache_hit_tokens > 0 and evictions > 0


def test_a_cache_sized_once_as_on_a_gpu_keeps_entries_clear_of_the_graph_padding_position() -> None:
    """The GPU's layout and timing on the CPU: every slot allocated once at max_model_len positions
    (64), static decode padding rows writing at position 63, results read a step late. The last
    conversation fills all 64 positions, so its entries are capped at 63; outputs equal the
    engine's without a cache."""
    model = tiny_model("llama")

    async def main(prefix_cache: bool) -> list[Trajectory]:
        eng = engine(model, prefix_cache=prefix_cache, cuda_graphs=True, max_model_len=64, max_num_seqs=4)
        eng._runner.cache.allocate(64)  # what the runner does on a GPU (`memory.plan_kv_cache`)
        eng._runner.read_late = True  # and a GPU's late read: a finished row's extra step feeds its last token
        outs = await asyncio.gather(*(converse(eng, e, 3, 30 + e, 7) for e in range(4)))  # 64 = 33 + 2 x 12 + 7
        await eng.aclose()
        return [t for conv in outs for t in conv]

    assert_same(asyncio.run(main(True)), asyncio.run(main(False)))


def test_seeded_sampling_is_unchanged_by_prefix_reuse() -> None:
    model = tiny_model("qwen2")

    async def main(prefix_cache: bool) -> list[Trajectory]:
        eng = engine(model, prefix_cache=prefix_cache)
        outs = await asyncio.gather(*(converse(eng, e, 3, 24, 6, temperature=1.0, seed=e) for e in range(3)))
        await eng.aclose()
        return [t for conv in outs for t in conv]

    assert_same(asyncio.run(main(True)), asyncio.run(main(False)))


async def next_turns(eng: TorchEngine, done: Sequence[Trajectory]) -> tuple[int, int]:
    """(prefix-cache hit tokens, prefill tokens) of one more turn of each of `done`'s conversations."""
    before = eng.stats()
    for t in done:
        await eng.generate(request(t.request_id + "'", tuple(t.prompt_ids) + tuple(t.response_ids), 2))
    after = eng.stats()
    return after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens, after.prefill_tokens - before.prefill_tokens


@pytest.mark.parametrize("max_num_seqs", [4, 8])
def test_a_pinned_entry_survives_slot_pressure_and_a_weight_load(max_num_seqs: int) -> None:
    """Two finished conversations, one pinned; four other requests take every slot (4: the
    unpinned entry is evicted, and one request waits for a slot the pin holds) or not (8);
    then a weight load. The pinned one's next turn prefills 1 token, the other's all 36."""
    model = tiny_model("llama")

    async def main() -> tuple[tuple[int, int], bool]:
        eng = engine(model, prefix_cache=True, max_num_seqs=max_num_seqs)
        kept, dropped = [await eng.generate(request(f"p{i}", prompt(32, seed=i), 4)) for i in range(2)]
        full = list(kept.prompt_ids) + list(kept.response_ids)
        assert eng.pin(full, timeout_s=60.0)
        others = await eng.generate_many([request(f"x{i}", prompt(20, seed=50 + i), 4) for i in range(4)])
        assert all(len(t.response_ids) == 4 for t in others)
        await eng.load_weights(tiny_model("llama", seed=1).named_parameters(), version=1)
        counts = await next_turns(eng, [kept, dropped])
        unpinned = eng.unpin(full)
        await eng.aclose()
        return counts, unpinned

    (hits, prefilled), unpinned = asyncio.run(main())
    assert (hits, prefilled) == (32 + 3, 1 + 36)  # the pinned entry: 32 prompt + 3 of 4 response positions
    assert not unpinned  # its next turn consumed it


def test_an_expired_pin_is_evicted_like_any_entry() -> None:
    model = tiny_model("llama")

    async def main() -> tuple[int, int]:
        eng = engine(model, prefix_cache=True, max_num_seqs=2)
        done = await eng.generate(request("p", prompt(32, seed=0), 4))
        assert eng.pin(list(done.prompt_ids) + list(done.response_ids), timeout_s=1e-9)
        await asyncio.sleep(0.001)
        await eng.generate_many([request(f"x{i}", prompt(20, seed=50 + i), 4) for i in range(2)])
        counts = await next_turns(eng, [done])
        await eng.aclose()
        return counts

    assert asyncio.run(main()) == (0, 36)


def test_a_request_blocked_by_pinned_slots_runs_once_the_pins_expire() -> None:
    model = tiny_model("llama")

    async def main() -> Trajectory:
        eng = engine(model, prefix_cache=True, max_num_seqs=2)
        done = await eng.generate_many([request(f"p{i}", prompt(32, seed=i), 4) for i in range(2)])
        for t in done:  # both slots pinned, briefly
            assert eng.pin(list(t.prompt_ids) + list(t.response_ids), timeout_s=0.05)
        out = await asyncio.wait_for(eng.generate(request("x", prompt(20, seed=9), 4)), timeout=30.0)
        await eng.aclose()
        return out

    assert len(asyncio.run(main()).response_ids) == 4


def test_the_rollout_config_turns_the_cache_on_for_multi_turn_runs_only() -> None:
    single = engine_settings(RolloutConfig(), device="cpu", seed=0)
    multi = engine_settings(RolloutConfig(multi_turn=MultiTurnConfig(enable=True)), device="cpu", seed=0)
    assert not single.prefix_cache and multi.prefix_cache
