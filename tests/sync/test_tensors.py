"""Pure pieces of weight sync: export, meta, checksums, bucket plans, in-place loads."""

from __future__ import annotations

import pytest
import torch

from asyncrl.errors import SyncError
from asyncrl.models.tensors import checksum, export_named, first_difference, meta_nbytes, weight_meta
from asyncrl.models.weights import load_into
from asyncrl.sync import plan_buckets
from tests.sync.fakes import small_model

EMBED = "embed.weight"


def test_export_is_no_copy_and_ties_once() -> None:
    model = small_model(0)
    named = export_named(model)
    assert EMBED in named and "head.weight" not in named
    assert named[EMBED].data_ptr() == model.head.weight.data_ptr()
    dtypes = {str(t.dtype) for t in named.values()}
    assert dtypes == {"torch.float32", "torch.bfloat16"}


def test_meta_and_bytes() -> None:
    named = {"a": torch.zeros(2, 3), "b": torch.zeros(5, dtype=torch.bfloat16)}
    assert weight_meta(named) == [("a", (2, 3), "float32"), ("b", (5,), "bfloat16")]
    assert meta_nbytes(weight_meta(named)) == 2 * 3 * 4 + 5 * 2


def test_checksum_is_bit_exact_and_names_the_difference() -> None:
    named = export_named(small_model(0))
    same = {n: t.clone() for n, t in named.items()}
    assert checksum(named) == checksum(same)
    assert first_difference(checksum(named), checksum(same)) is None
    victim = "blocks.1.weight"  # bf16
    flipped = same[victim].view(-1).view(torch.int16)
    flipped[3] ^= 1  # one low bit
    assert first_difference(checksum(named), checksum(same)) == victim


def test_checksum_sees_dtype_and_missing_and_extra() -> None:
    a = {"x": torch.ones(3), "y": torch.zeros(2)}
    assert first_difference(checksum(a), checksum({**a, "x": a["x"].double()})) == "x"
    assert first_difference(checksum(a), checksum({"x": a["x"]})) == "y"
    assert first_difference(checksum({"x": a["x"]}), checksum(a)) == "y"


def test_bucket_plan_groups_dtypes_and_respects_the_limit() -> None:
    mb = 2**20
    meta = [("a", (mb // 8,), "float32"), ("b", (mb // 8,), "float32"), ("c", (3,), "bfloat16"),
            ("big", (mb,), "float32"), ("d", (1,), "float32")]
    buckets = plan_buckets(meta, bucket_mb=1.0)  # 1 MiB: a + b fit together (0.5 MiB each)
    layout = [(str(b.dtype), [s.name for s in b.slots]) for b in buckets]
    assert layout == [("torch.float32", ["a", "b"]), ("torch.float32", ["big"]),
                      ("torch.float32", ["d"]), ("torch.bfloat16", ["c"])]
    assert [s.offset for s in buckets[0].slots] == [0, mb // 8]
    assert buckets[0].nbytes == mb


def test_load_into_accepts_aliases_and_rejects_strangers() -> None:
    src, dst = small_model(0), small_model(1)
    pairs = [("head.weight", src.head.weight.detach())]
    assert load_into(dst, pairs) == 1
    assert torch.equal(dst.embed.weight, src.embed.weight)
    with pytest.raises(SyncError, match="no parameter named"):
        load_into(dst, {"nope": torch.zeros(1)})
    with pytest.raises(SyncError, match="shape"):
        load_into(dst, {EMBED: torch.zeros(2, 2)})
