"""Benchmark: packed attention's row groups on the CPU (`asyncrl.training.packed_attention`).

Two parts, each a forward and backward of causal sdpa at the tiny model's head shape (4 heads of
32, float32, 2 threads):
- the fit: one row per call at lengths 8..256; a least-squares line `a + b x length^2` gives one
  call's fixed cost `a` and a token pair's cost `b`, and `a / b` is what `CALL_COST` should be;
- the workloads: packed rows through `packed_attention` with each row its own group
  (`CALL_COST` 0), in `row_groups` at half, once and twice the default `CALL_COST`, and all in one
  padded call (`CALL_COST` huge), alternating (`--rounds`), median of each. `short` is the
  default run's mini-batch (128 rows of 20-32 tokens), `uniform` the forced-128 one (128 rows of
  140-144), `longtail` 64 rows, lognormal (median 64, sigma 1, cap 512).

    PYTHONPATH=. python bench/attention_groups.py     # writes bench/results/attention_groups.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from asyncrl.training import packed_attention

HEADS, DIM = 4, 32
LENGTHS = (8, 16, 32, 64, 128, 256)


def workloads(seed: int) -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(seed)
    tail = [min(512, max(2, round(math.exp(math.log(64) + float(torch.randn(1, generator=g)))))) for _ in range(64)]
    return {"short": torch.randint(20, 33, (128,), generator=g).tolist(),
            "uniform": torch.randint(140, 145, (128,), generator=g).tolist(), "longtail": tail}


def timed(fn: Callable[[], torch.Tensor], reps: int) -> float:
    """Median seconds of `reps` forward + backward passes of `fn`."""
    times = []
    for _ in range(reps + 1):  # the first warms up
        start = time.perf_counter()
        fn().sum().backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def fit(reps: int) -> dict[str, float]:
    """Seconds of one row per call at each length, and the line a + b x length^2 through them."""
    calls = 64
    seconds = []
    for n in LENGTHS:
        qkv = [torch.randn(1, HEADS, n, DIM, requires_grad=True) for _ in range(3)]

        def rows(qkv: list[torch.Tensor] = qkv) -> torch.Tensor:
            return torch.cat([torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=True)
                              for _ in range(calls)])
        seconds.append(timed(rows, reps) / calls)
    x = torch.tensor([float(n) ** 2 for n in LENGTHS], dtype=torch.float64)
    y = torch.tensor(seconds, dtype=torch.float64)
    b = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    a = float(y.mean() - b * x.mean())
    return dict(per_call_s={str(n): s for n, s in zip(LENGTHS, seconds, strict=True)}, call_s=a, pair_s=b,
                call_cost_pairs=a / b)


def attention(lengths: list[int], call_cost: float) -> Callable[[], torch.Tensor]:
    """Packed attention over rows of `lengths`, grouped as `CALL_COST = call_cost` groups them."""
    bounds = [0, *itertools.accumulate(lengths)]
    qkv = [torch.randn(1, HEADS, bounds[-1], DIM, requires_grad=True) for _ in range(3)]

    def run() -> torch.Tensor:
        packed_attention.CALL_COST = call_cost
        packed_attention._plan.cache_clear()
        return packed_attention._per_row(*qkv, bounds, 0.0, None)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results/attention_groups.json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    default = packed_attention.CALL_COST
    variants = {"one row per call": 0.0, **{f"groups at {c}": float(c) for c in (default // 2, default, default * 2)},
                "one padded call": 1e30}
    start = time.perf_counter()
    line = fit(args.reps)
    rows = []
    for name, lengths in workloads(args.seed).items():
        fns = {v: attention(lengths, cost) for v, cost in variants.items()}
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.rounds):
            for v, fn in fns.items():
                times[v].append(timed(fn, args.reps))
        packed_attention.CALL_COST = default
        packed_attention._plan.cache_clear()
        groups = len(packed_attention.row_groups(tuple(lengths)))
        row = dict(workload=name, rows=len(lengths), tokens=sum(lengths), longest=max(lengths), groups=groups,
                   **{f"{v} ms": 1e3 * statistics.median(t) for v, t in times.items()})
        print(json.dumps(row), flush=True)
        rows.append(row)
    meta = dict(torch=torch.__version__, python=platform.python_version(), wall_s=time.perf_counter() - start,
                call_cost=default, command="PYTHONPATH=. python bench/attention_groups.py " + " ".join(sys.argv[1:]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, fit=line, rows=rows), indent=2) + "\n")
    print(f"fit: a call costs {line['call_s'] * 1e3:.3f} ms = {line['call_cost_pairs']:.0f} token pairs; wrote {out}")


if __name__ == "__main__":
    main()
