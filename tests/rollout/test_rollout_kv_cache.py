"""The stacked slot cache: a compaction moves every layer's K and V in one gather and one scatter,
with the contents the per-buffer moves of before gave."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from asyncrl.rollout.kv_cache import SlotKVCache, compose_moves

# Ops that only make views or the small index tensor: they move no cache data.
_NO_DATA = ("slice", "select", "unbind", "view", "alias", "detach", "lift_fresh", "_to_copy", "empty", "lift")


class CountOps(TorchDispatchMode):
    """Counts the aten ops run under it, by name (`aten.index.Tensor` -> "index")."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def filled_cache(layers: int = 3, slots: int = 8, length: int = 5, stacked: bool = True) -> SlotKVCache:
    """The GPU's stacked layout by default (the CPU's own is a tensor per buffer)."""
    cache = SlotKVCache(layers, 2, 4, max_slots=slots, dtype=torch.float32, device="cpu", min_capacity=4,
                        stacked=stacked)
    cache.reserve(slots, length)
    generator = torch.Generator().manual_seed(0)
    for buffer in (*cache.keys, *cache.values):
        buffer.copy_(torch.randn(buffer.shape, generator=generator))
    return cache


def moved_one_buffer_at_a_time(cache: SlotKVCache, moves: Sequence[tuple[int, int, int]]) -> list[torch.Tensor]:
    """The old semantics, buffer by buffer: the moves composed (a slot moved twice ends with its
    first source's contents), every destination read from the state before any move."""
    content: dict[int, tuple[int, int]] = {}
    for src, dst, length in moves:
        if src != dst and length > 0:
            content[dst] = content.get(src, (src, length))[0], length
    n = max(length for _, length in content.values())
    buffers = [b.clone() for b in (*cache.keys, *cache.values)]
    for buf in buffers:
        before = buf.clone()
        for dst, (src, _) in content.items():
            buf[dst, :, :n] = before[src, :, :n]
    return buffers


def test_a_compaction_of_several_moves_is_one_gather_and_one_scatter() -> None:
    cache = filled_cache()
    moves = [(7, 1, 5), (6, 3, 4), (5, 0, 5), (0, 2, 3)]  # a sweep, and a slot moved twice
    expected = moved_one_buffer_at_a_time(cache, moves)
    with CountOps() as counted:
        cache.apply_moves(moves)
    data_ops = {op: n for op, n in counted.ops.items() if not op.startswith(_NO_DATA)}
    assert data_ops == {"index": 1, "index_put_": 1}, counted.ops  # before: 2 x 3 layers x 2 (K, V)
    for got, want in zip((*cache.keys, *cache.values), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_cpu_layout_moves_and_grows_as_the_stacked_one() -> None:
    """On the CPU each buffer is its own tensor (no stacked `kv`): the same moves and growth give
    the same contents as the stacked layout, one indexed copy per buffer."""
    assert not SlotKVCache(1, 1, 1, max_slots=2, dtype=torch.float32, device="cpu").stacked
    moves = [(7, 1, 5), (6, 3, 4), (5, 0, 5), (0, 2, 3)]
    caches = [filled_cache(stacked=stacked) for stacked in (True, False)]
    with CountOps() as counted:
        caches[1].apply_moves(moves)
    assert counted.ops["index_put_"] == 2 * 3  # K and V of 3 layers
    caches[0].apply_moves(moves)
    for cache in caches:
        cache.reserve(8, 40)
    assert caches[1].kv.numel() == 0 and caches[1].capacity == 64
    for got, want in zip((*caches[1].keys, *caches[1].values), (*caches[0].keys, *caches[0].values), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_layer_views_are_the_stacked_cache() -> None:
    """A write through a layer's view is a write into `kv`; views survive nothing but a reallocation."""
    cache = filled_cache(layers=2)
    cache.keys[1][3, 0, 2] = 7.0
    cache.values[0][2, 1, 0] = -7.0
    assert cache.kv[0, 1, 3, 0, 2].eq(7.0).all() and cache.kv[1, 0, 2, 1, 0].eq(-7.0).all()
    assert all(k.is_contiguous() and v.is_contiguous() for k, v in zip(cache.keys, cache.values, strict=True))
    kept = cache.kv[:, :, :8, :, :5].clone()
    cache.reserve(8, 40)  # grows capacity: one copy of the kept contents into the new stack
    torch.testing.assert_close(cache.kv[:, :, :8, :, :5], kept, rtol=0, atol=0)
    assert cache.keys[1].data_ptr() == cache.kv[0, 1].data_ptr()


def test_copy_slots_reads_every_source_before_writing() -> None:
    """Slots swapped in one call exchange contents (a group's shared prefill copies this way)."""
    cache = filled_cache(layers=1)
    before = cache.kv.clone()
    cache.copy_slots([0, 1], [1, 0], 5)
    torch.testing.assert_close(cache.kv[:, :, 0, :, :5], before[:, :, 1, :, :5], rtol=0, atol=0)
    torch.testing.assert_close(cache.kv[:, :, 1, :, :5], before[:, :, 0, :, :5], rtol=0, atol=0)
    torch.testing.assert_close(cache.kv[:, :, :2, :, 5:], before[:, :, :2, :, 5:], rtol=0, atol=0)  # past length: kept


def test_compose_moves_in_order_with_swaps() -> None:
    assert compose_moves([(3, 1, 5), (1, 4, 5)]) == {1: (3, 5), 4: (3, 5)}  # 4 gets what 1 got: 3's
    assert compose_moves([(3, 1, -5)]) == {1: (3, 5), 3: (1, 5)}
    # compaction moves 4 into 1, then a swap of 1 and 2: 2 ends with 4's contents, 1 with 2's
    assert compose_moves([(4, 1, 2), (1, 2, -3)]) == {1: (2, 3), 2: (4, 3)}
    assert compose_moves([(2, 2, 4), (0, 1, 0)]) == {}


def test_a_swap_exchanges_two_slots_in_either_layout() -> None:
    for stacked in (True, False):
        cache = filled_cache(stacked=stacked)
        before = [b.clone() for b in (*cache.keys, *cache.values)]
        cache.apply_moves([(1, 5, -4)])
        for old, new in zip(before, (*cache.keys, *cache.values)):
            assert torch.equal(new[5, :, :4], old[1, :, :4]) and torch.equal(new[1, :, :4], old[5, :, :4])
            assert torch.equal(new[0], old[0])

