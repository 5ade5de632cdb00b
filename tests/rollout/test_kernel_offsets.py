"""Every Triton kernel that indexes the KV cache computes its slot offsets in int64.

A layer's cache view passes 2^31 elements at realistic sizes (128 slots of a 32K-position
Qwen2-7B cache: 128 x 4 KV heads x 32,768 x 128), and `tl.program_id` is int32: `row * k_slot` in
int32 wraps and writes into another slot, silently. Allocating such a cache to catch the wrap at
run time needs 4 GiB, so this reads the kernels' source: a kernel taking a slot stride (`*_slot`)
must widen its row index before it multiplies."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

from tests.rollout import triton_interpret  # noqa: F401  (imported before the kernel modules)

MODULES = ("asyncrl.rollout.kernels.elementwise", "asyncrl.rollout.kernels.decode_attention")


def cache_kernels() -> list[tuple[str, str]]:
    """(name, source) of every `@triton.jit` function in MODULES with a `*_slot` parameter."""
    found = []
    for name in MODULES:
        tree = ast.parse(inspect.getsource(importlib.import_module(name)))
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in fn.decorator_list) \
                    and any(a.arg.endswith("_slot") for a in fn.args.args):
                found.append((f"{name}.{fn.name}", ast.unparse(fn)))
    return found


def test_there_are_cache_kernels_to_check() -> None:
    names = [n.rsplit(".", 1)[1] for n, _ in cache_kernels()]
    assert {"_rope_cache_kernel", "_split_kv_kernel"} <= set(names)


@pytest.mark.parametrize(("name", "source"), cache_kernels(), ids=[name for name, _ in cache_kernels()])
def test_cache_kernels_widen_the_row_to_int64_before_the_slot_offset(name: str, source: str) -> None:
    assert "row = tl.program_id(0).to(tl.int64)" in source, f"{name}: row * *_slot in int32 wraps past 2^31"
