"""BroadcastSender/Receiver over a real gloo group, its ranks as threads of this process."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import torch

from asyncrl.errors import SyncError
from asyncrl.models.tensors import checksum, export_named, weight_meta
from asyncrl.sync import destroy_collective, init_collective, recv_weights, send_weights
from asyncrl.sync.collective import free_port
from tests.sync.fakes import small_model


def run_ranks(world: int, body: Callable[[int, str], Any]) -> list[Any]:
    """Each rank in its own thread, its own group name (the registry is per process)."""
    port, tag = free_port(), uuid.uuid4().hex[:8]
    results: list[Any] = [None] * world

    def rank_main(rank: int) -> None:
        name = f"test-{tag}-{rank}"
        try:
            init_collective(name, rank, world, "gloo", "127.0.0.1", port, timeout_s=30)
            results[rank] = body(rank, name)
        except Exception as err:
            results[rank] = err
        finally:
            destroy_collective(name)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


def test_two_receivers_get_bit_identical_weights_twice() -> None:
    trainer = small_model(0)
    named = export_named(trainer)
    meta = weight_meta(named)

    def body(rank: int, name: str) -> list[str]:
        out = []
        for step in range(2):  # the second sync reuses the cached plan and buffers
            if rank == 0:
                if step == 1:
                    with torch.no_grad():
                        trainer.blocks[1].weight.add_(1.0)
                send_weights(name, export_named(trainer), bucket_mb=0.01)
                out.append(checksum(export_named(trainer)))
            else:
                got = recv_weights(name, meta, bucket_mb=0.01)
                assert list(got) == [m[0] for m in meta]
                out.append(checksum(got))
        return out

    results = run_ranks(3, body)
    for r in results:
        assert not isinstance(r, Exception), r
    assert results[0] == results[1] == results[2]
    assert results[0][0] != results[0][1]


def test_mismatched_meta_fails_on_every_rank() -> None:
    named = {"a": torch.ones(4), "b": torch.ones(3, dtype=torch.bfloat16)}
    wrong = [("a", (4,), "float32")]

    def body(rank: int, name: str) -> object:
        if rank == 0:
            return send_weights(name, named)
        return recv_weights(name, wrong)

    results = run_ranks(2, body)
    assert all(isinstance(r, SyncError) for r in results), results


def test_unknown_group_is_a_sync_error() -> None:
    with pytest.raises(SyncError, match="setup"):
        send_weights("never-joined", {"a": torch.ones(1)})
