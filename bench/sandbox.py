"""Benchmark: sandboxed code-reward runs per second for each available backend.

A trivial correct program (`f(x) = 3x + 1`) scored against 5 tests by `code_score`, which streams
all 5 tests through one sandbox run; "per-test runs" scores the same 5 tests as 5 separate runs
(the alternative design, what verl does over HTTP) for comparison. Sequential and 4x concurrent
(threads). Backends: bwrap (if installed), rlimit, and http with `--url` (a SandboxFusion
`/run_code` endpoint).

    PYTHONPATH=. python bench/sandbox.py [--n 40] [--url http://host:8080/run_code]

Writes bench/results/sandbox.json and prints a markdown table. Timing only; containment lives in
tests/rewards/test_sandbox.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.rewards.code_exec import code_score
from asyncrl.rewards.sandbox import Sandbox, make_sandbox
from asyncrl.rewards.sandbox.bwrap import available

SOLUTION = "```python\ndef f(x):\n    return x*3+1\n```"
TESTS = [{"input": [x], "output": 3 * x + 1} for x in range(5)]
FIVE = json.dumps({"fn_name": "f", "tests": TESTS})
SINGLES = [json.dumps({"fn_name": "f", "tests": [t]}) for t in TESTS]
OUT = Path(__file__).parent / "results" / "sandbox.json"


def score_streamed(sandbox: Sandbox) -> None:
    assert code_score(SOLUTION, FIVE, 5.0, sandbox=sandbox)["score"] == 1.0


def score_per_test(sandbox: Sandbox) -> None:
    for truth in SINGLES:
        assert code_score(SOLUTION, truth, 5.0, sandbox=sandbox)["score"] == 1.0


def rate(fn: Any, sandbox: Sandbox, n: int, threads: int) -> float:
    """Scored responses (5 tests each) per second."""
    fn(sandbox)  # warm-up
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: fn(sandbox), range(n)))
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--url", default="")
    args = parser.parse_args()
    backends = (["bwrap"] if available() else []) + ["rlimit"] + (["http"] if args.url else [])
    rows = []
    for backend in backends:
        sandbox = make_sandbox(SandboxConfig(backend=backend, url=args.url))
        for mode, fn in (("streamed", score_streamed), ("per-test runs", score_per_test)):
            row = {"backend": backend, "mode": mode, "seq_per_s": rate(fn, sandbox, args.n, 1),
                   "x4_per_s": rate(fn, sandbox, args.n, 4)}
            rows.append(row)
            print(row, flush=True)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"host": platform.node(), "cpus": os.cpu_count(), "tests_per_response": len(TESTS),
                               "n": args.n, "unit": "scored responses per second", "rows": rows}, indent=2) + "\n")
    print("\n| backend | mode | responses/s sequential | responses/s 4x concurrent |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['mode']} | {r['seq_per_s']:.1f} | {r['x4_per_s']:.1f} |")


if __name__ == "__main__":
    main()
