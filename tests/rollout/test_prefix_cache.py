"""The prefix cache's bookkeeping (asyncrl.rollout.prefix_cache) and the scheduler's use of it,
on hand-built tokens and sequences: where entries live, which one a prompt hits, what is evicted."""

from __future__ import annotations

from asyncrl.rollout.prefill import pack_prompts
from asyncrl.rollout.prefix_cache import BLOCK, PrefixCache
from asyncrl.rollout.scheduler import Scheduler, StepResult
from asyncrl.rollout.sequence import Sequence
from asyncrl.types import GenerationRequest, SamplingParams


class Clock:
    """A settable clock for pins."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ids(n: int, first: int = 1) -> tuple[int, ...]:
    return tuple(range(first, first + n))


def test_retire_keeps_an_entry_of_at_least_a_block_at_most_max_len() -> None:
    cache = PrefixCache(max_slots=8, max_len=30)
    assert cache.retire(ids(40), slot=3) == 30
    assert cache.retire(ids(20, first=500), slot=2) == 20
    assert cache.retire(ids(BLOCK - 1), slot=1) == 0  # shorter than a block: not kept
    assert len(cache) == 2 and cache.tokens == 50 and cache.top_slot == 4 and cache.longest == 30


def test_lookup_finds_the_longest_common_prefix_and_always_leaves_a_token_to_prefill() -> None:
    cache = PrefixCache(max_slots=8, max_len=1000)
    cache.retire(ids(40), slot=2)
    cache.retire(ids(20) + ids(30, first=900), slot=3)
    entry, reuse = cache.lookup(ids(40) + (7, 7, 7))  # a next turn: the whole entry, then new tokens
    assert entry is not None and entry.slot == 2 and reuse == 40
    entry, reuse = cache.lookup(ids(35) + (7,) * 10)  # diverges at token 35 from both: the longer shared part
    assert entry is not None and entry.slot == 2 and reuse == 35
    entry, reuse = cache.lookup(ids(40))  # the same tokens again: the last one is prefilled for its logits
    assert entry is not None and reuse == 39
    assert cache.lookup(ids(BLOCK - 1) + (7,) * 30) == (None, 0)  # not one whole block in common


def test_place_swaps_the_hit_in_and_moves_an_entry_without_a_hit_out_of_the_way() -> None:
    cache = PrefixCache(max_slots=5, max_len=1000)
    cache.retire(ids(32), slot=2)  # entry A
    cache.retire(ids(48, first=300), slot=3)  # entry B
    hit, _ = cache.lookup(ids(48, first=300) + (9,))
    assert hit is not None and hit.slot == 3
    # a sequence admitted into slot 2 that continues B: B and A swap slots
    assert cache.place(2, hit, reuse=48) == [(3, 2, -48)]
    assert len(cache) == 1 and cache.tokens == 32 and cache.lookup(ids(33))[0].slot == 3  # type: ignore[union-attr]
    assert cache.place(3, None) == [(3, 4, 32)]  # no hit: the entry in the way moves to a free slot
    assert cache.place(4, None) == []  # and with none left it is evicted
    assert len(cache) == 0 and cache.evictions == 1


def test_a_hit_on_part_of_an_entry_copies_it_and_keeps_it_cached() -> None:
    cache = PrefixCache(max_slots=4, max_len=1000)
    cache.retire(ids(40), slot=1)  # another conversation's, sharing the first 32 tokens (a system prompt)
    cache.retire(ids(20, first=500), slot=2)
    hit, reuse = cache.lookup(ids(32) + (7,) * 8)
    assert hit is not None and reuse == 32
    assert cache.place(1, hit, reuse) == [(1, 3, 40), (3, 1, 32)]  # out of the way to slot 3, then copied back
    assert len(cache) == 2 and cache.lookup(ids(41))[0] is hit and hit.slot == 3
    hit, reuse = cache.lookup(ids(32) + (7,) * 8)
    assert cache.place(2, hit, reuse) == [(3, 2, 32)]  # no slot free for the entry in 2: it goes
    assert len(cache) == 1 and cache.evictions == 1


def test_eviction_is_least_recently_kept_first_and_spares_pins_and_the_hit() -> None:
    clock = Clock()
    cache = PrefixCache(max_slots=8, max_len=1000, clock=clock)
    for i in range(3):
        cache.retire(ids(20, first=100 * i + 1), slot=2 + i)
    assert cache.pin(ids(20, first=1) + (5, 5), seconds=10.0)  # entry 0 (prompt + response): pinned
    hit, _ = cache.lookup(ids(20, first=101) + (5,))
    assert cache.evict(30, spare=hit) == 20  # entry 1 is the hit, entry 0 pinned: only entry 2 goes
    assert cache.evict(1) == 20 and cache.tokens == 20  # without a hit to spare, entry 1
    assert cache.evict(1) == 0  # the pinned one stays ...
    clock.now += 11.0
    assert cache.evict(1) == 20  # ... until its pin expires


def test_a_pinned_entry_is_only_hit_by_a_prompt_containing_all_of_it() -> None:
    cache = PrefixCache(max_slots=8, max_len=1000)
    mine = ids(32) + ids(16, first=500)
    cache.retire(mine, slot=1)
    assert cache.pin(mine + (3,), seconds=60.0)
    assert cache.lookup(ids(32) + (7,) * 20) == (None, 0)  # another episode sharing the system prompt
    entry, reuse = cache.lookup(mine + (3, 4))  # its own next turn
    assert entry is not None and reuse == len(mine)
    cache.drop_unpinned()  # a weight load: the pinned entry stays
    assert len(cache) == 1 and cache.unpin(mine)
    cache.drop_unpinned()
    assert len(cache) == 0 and not cache.pin(mine, seconds=1.0)


def test_entries_keep_at_most_max_len_positions() -> None:
    cache = PrefixCache(max_slots=4, max_len=40)
    cache.retire(ids(64), slot=0)
    assert cache.tokens == 40 and cache.lookup(ids(64))[1] == 40


def test_pack_prompts_places_a_hits_tokens_after_its_cached_positions() -> None:
    flat, lengths = pack_prompts([(5, 6), (8,)], first_slot=3, starts=[4, 0])
    assert flat[:9].view(3, 3).tolist() == [[5, 6, 8], [4, 5, 0], [3, 3, 4]]  # ids, positions, slots
    assert lengths == (2, 1)


def conversation_seq(rid: str, context: tuple[int, ...], max_tokens: int) -> Sequence:
    req = GenerationRequest(rid, context, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return Sequence.from_request(req, eos_ids=(0,))


def run_to_end(sched: Scheduler, token: int = 5, steps: int = 1000) -> None:
    while steps and (plan := sched.schedule()) is not None:
        sched.apply(plan, StepResult([token] * plan.num_rows, [-1.0] * plan.num_rows, 0))
        steps -= 1


def test_scheduler_keeps_finished_sequences_and_prefills_a_next_turn_past_them() -> None:
    sched = Scheduler(max_num_seqs=4, kv_budget_tokens=1000, max_prefill_tokens=1000, prefix=PrefixCache(4, 1000))
    first = conversation_seq("t1", ids(30), max_tokens=3)
    sched.add(first)
    run_to_end(sched)
    assert first.response_ids == [5, 5, 5] and len(sched.prefix or ()) == 1  # its K/V: 30 + 2 positions
    sched.add(conversation_seq("t2", ids(30) + (5, 5, 5, 9, 9), max_tokens=2))
    plan = sched.schedule()
    assert plan is not None and plan.prefill_starts == (32,) and plan.cache_slots == 1
    assert (sched.prefill_tokens, sched.prefix_queries, sched.prefix_hit_tokens) == (30 + 3, 2, 32)


def test_a_finished_sequence_swaps_with_the_last_running_one() -> None:
    sched = Scheduler(max_num_seqs=3, kv_budget_tokens=1000, max_prefill_tokens=1000, prefix=PrefixCache(3, 1000))
    for i, max_tokens in enumerate((2, 5, 5)):
        sched.add(conversation_seq(f"s{i}", ids(20, first=100 * i + 1), max_tokens))
    run_to_end(sched, steps=2)  # the first one finishes in slot 0, the others run in 1 and 2
    plan = sched.schedule()
    assert plan is not None and plan.moves == ((0, 2, -21),)  # 20 prompt + 1 fed token each: one swap
    assert (plan.cache_slots, plan.cache_len) == (3, 21)  # the entry in slot 2, its 21 positions
    entry, reuse = sched.prefix.lookup(ids(20) + (5, 5, 9))  # type: ignore[union-attr]
    assert [s.slot for s in sched.running] == [0, 1] and entry is not None and (entry.slot, reuse) == (2, 21)


def test_scheduler_evicts_cached_entries_before_preempting_a_running_sequence() -> None:
    sched = Scheduler(max_num_seqs=4, kv_budget_tokens=100, max_prefill_tokens=1000, prefix=PrefixCache(4, 1000))
    for i in range(2):
        sched.add(conversation_seq(f"a{i}", ids(30, first=100 * i + 1), max_tokens=2))
    run_to_end(sched)
    assert sched.prefix is not None and sched.prefix.tokens == 62  # two entries of 31
    sched.add(conversation_seq("b", ids(60, first=900), max_tokens=30))
    run_to_end(sched)
    assert sched.preemptions == 0 and sched.prefix.evictions == 2  # 60 + 30 + 31 > 100: both entries go
