"""Benchmark: the OpenAI Agents SDK agent (examples/openai_agents_calculator.py) trained through
the episode endpoint against the built-in tool episode, paired on the same seeds (issue 37).

Each (arm, seed) cell is `bench/tool_task.py`'s cell (one `asyncrl train` process, the tool task
on tiny-tools, validation before training and every `--val-every` updates, tool-enabled and
sampled); the endpoint arm adds `rollout.agent.entrypoint`. Reported: each cell's initial and
final validation accuracy and their rise, and per seed the endpoint's rise minus the built-in's.
A finished cell appends one line to `--out` at once; a rerun skips the cells already there.

    PYTHONPATH=. python bench/agent_task.py --seeds 1 --steps 10 --batch 8 --val-size 32
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.tool_task import ROOT, parse, run_cell  # noqa: E402

AGENT = "rollout.agent.entrypoint=examples/openai_agents_calculator.py:agent"
ARMS = {"builtin": [], "endpoint": [AGENT]}


def main() -> None:
    argv = sys.argv[1:]
    args = parse([*argv, "--out", str(ROOT / "bench/results/agent_task.jsonl")] if "--out" not in argv else argv)
    done = [json.loads(line) for line in args.out.read_text().splitlines()] if args.out.exists() else []
    have = {(r["arm"], r["seed"]) for r in done if "error" not in r}
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    for seed in range(args.seeds):
        for arm, extra in ARMS.items():
            if (arm, seed) in have:
                continue
            cell_args = copy.copy(args)
            cell_args.override = [*args.override, *extra]
            result = {"arm": arm, **run_cell("colocated", seed, cell_args)}
            with args.out.open("a") as f:
                f.write(json.dumps(result) + "\n")
            done.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "points"}), flush=True)
    report(done)


def report(done: list[dict]) -> None:
    rise = {(r["arm"], r["seed"]): r["final"] - r["initial"] for r in done if r.get("final") is not None}
    for seed in sorted({s for _, s in rise}):
        if ("builtin", seed) in rise and ("endpoint", seed) in rise:
            print(f"seed {seed}: rise builtin {rise['builtin', seed]:+.3f}, endpoint {rise['endpoint', seed]:+.3f}, "
                  f"endpoint - builtin {rise['endpoint', seed] - rise['builtin', seed]:+.3f}")


if __name__ == "__main__":
    main()  # the flags are bench/tool_task.py's (`parse`)
