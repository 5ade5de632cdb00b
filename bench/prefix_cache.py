"""Benchmark: TorchEngine's prefix cache on scripted multi-turn conversations with tool waits.

Workload: N conversations at once through one `TorchEngine` (the built-in tiny model's size,
`bench/engine.py`'s "tiny", random weights), each `--turns` model turns. Turn 1's prompt is a
shared system prompt (`--system` tokens, as a tool schema would be) plus the conversation's own
question (`--question` tokens); each turn samples `--response` tokens (T=1, seeded, EOS ignored,
so every mode generates the same tokens); between turns a simulated tool runs (an asyncio
sleep drawn from a lognormal, median `--tool-ms`) and its message (`--tool-tokens` tokens) is
appended; the next turn's prompt is the whole conversation so far (as a multi-turn episode
sends it).

Modes:
- none: the prefix cache off (`rollout.multi_turn.enable=false`): every turn prefills its whole conversation;
- release: the cache on (what `rollout.multi_turn.enable` turns on), entries evictable during
  the tool wait (`rollout.multi_turn.keep_slot=release`);
- keep: the cache on, each turn's entry pinned during the tool wait (`TorchEngine.pin`,
  `keep_slot=keep`) with a timeout of `--pin-s`.

Scenarios (`--scenarios`): "roomy", 32 slots for the 24 conversations (every entry fits beside
the running turns); "pressure", 16 slots (turns compete for slots: release loses entries to other
conversations' turns, keep holds its slots through the wait, and the turns it blocks wait);
"slow_tools", 16 slots and tools of median 500 ms. Reported per scenario and mode (medians of
`--repeats` runs, modes alternating): prompt tokens prefilled, prefix-cache hit tokens, entries
evicted, wall time, and the mean time of a model turn (generate call to its result). Writes
bench/results/prefix_cache.json.

    PYTHONPATH=. python bench/prefix_cache.py

It measures prefill work and time only; correctness (outputs equal with and without the cache)
lives in tests/rollout/test_rollout_multi_turn.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaForCausalLM

from asyncrl.config.schema import MultiTurnConfig, RolloutConfig
from asyncrl.rollout import TorchEngine, engine_settings
from asyncrl.types import GenerationRequest, SamplingParams
from bench.engine import ForeignLoad, build_model

MODES = ("none", "release", "keep")
SCENARIOS: dict[str, dict[str, Any]] = {
    "roomy": dict(max_num_seqs=32),
    "pressure": dict(max_num_seqs=16),
    "slow_tools": dict(max_num_seqs=16, tool_ms=500.0),
}


def tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(1, vocab) for _ in range(n)]


async def conversation(eng: TorchEngine, i: int, mode: str, args: argparse.Namespace, vocab: int,
                       system: list[int]) -> list[float]:
    """One scripted conversation; returns each model turn's seconds."""
    rng = random.Random(1000 + i)  # the same script in every mode
    ids = system + tokens(rng, args.question, vocab)
    turn_s = []
    for turn in range(args.turns):
        params = SamplingParams(max_tokens=args.response, temperature=1.0, seed=i * 100 + turn, ignore_eos=True)
        start = time.perf_counter()
        out = await eng.generate(GenerationRequest(f"c{i}t{turn}", tuple(ids), params))
        turn_s.append(time.perf_counter() - start)
        if turn == args.turns - 1:
            break
        ids += out.response_ids
        if mode == "keep":
            eng.pin(ids, timeout_s=args.pin_s)
        await asyncio.sleep(rng.lognormvariate(math.log(args.tool_ms / 1000), 0.5))  # the tool runs
        ids += tokens(rng, args.tool_tokens, vocab)
    return turn_s


def run_mode(model: LlamaForCausalLM, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    vocab = model.config.vocab_size
    system = tokens(random.Random(0), args.system, vocab)
    rollout = RolloutConfig(max_num_seqs=args.max_num_seqs, kv_budget_tokens=args.kv_budget,
                            multi_turn=MultiTurnConfig(enable=mode != "none"))
    settings = engine_settings(rollout, seed=0, num_threads=args.threads)

    async def main() -> tuple[list[list[float]], TorchEngine]:
        eng = TorchEngine(model, 0, settings)
        turns = await asyncio.gather(*(conversation(eng, i, mode, args, vocab, system)
                                       for i in range(args.conversations)))
        return list(turns), eng

    with ForeignLoad() as load:
        start = time.perf_counter()
        turns, eng = asyncio.run(main())
        wall = time.perf_counter() - start
    stats = eng.stats()
    evictions = eng._prefix.evictions if eng._prefix is not None else 0
    eng.close()
    return dict(mode=mode, wall_s=wall, prefill_tokens=stats.prefill_tokens,
                prefix_hit_tokens=stats.prefix_cache_hit_tokens, prefix_queries=stats.prefix_cache_queries,
                evictions=evictions, generated_tokens=stats.generated_tokens,
                mean_turn_s=statistics.fmean(t for conv in turns for t in conv), foreign_cores=load.cores)


def summary(scenario: str, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode: the token counts (the same in every run but for eviction timing: the median) and
    the median wall time and turn time."""
    rows = []
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        row: dict[str, Any] = {"scenario": scenario, "mode": mode, "runs": len(mine)}
        for key in ("wall_s", "mean_turn_s", "prefill_tokens", "prefix_hit_tokens", "evictions", "foreign_cores"):
            row[key] = statistics.median(r[key] for r in mine)
        rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| scenario | mode | prompt tokens prefilled | hit tokens | evictions | wall s | vs none | mean turn s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = next(b for b in rows if b["mode"] == "none" and b["scenario"] == r["scenario"])
        lines.append(f"| {r['scenario']} | {r['mode']} | {r['prefill_tokens']:.0f} | {r['prefix_hit_tokens']:.0f} | "
                     f"{r['evictions']:.0f} | {r['wall_s']:.2f} | {r['wall_s'] / base['wall_s']:.2f}x | "
                     f"{r['mean_turn_s']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system", type=int, default=256, help="shared system-prompt tokens")
    ap.add_argument("--question", type=int, default=32)
    ap.add_argument("--response", type=int, default=32, help="tokens sampled per turn")
    ap.add_argument("--tool-tokens", type=int, default=24)
    ap.add_argument("--tool-ms", type=float, default=50.0, help="median simulated tool time")
    ap.add_argument("--pin-s", type=float, default=5.0, help="keep: how long a pin holds at most")
    ap.add_argument("--max-num-seqs", type=int, default=16, help="overridden by each scenario")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma list of " + ", ".join(SCENARIOS))
    ap.add_argument("--kv-budget", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (2 oversubscribe a loaded 2-core machine)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/prefix_cache.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = build_model(args.model)
    runs, rows = [], []
    for scenario in args.scenarios.split(","):
        settings = argparse.Namespace(**(vars(args) | SCENARIOS[scenario]))
        mine = []
        for _ in range(args.repeats):
            for mode in MODES:
                mine.append(dict(scenario=scenario, **run_mode(model, mode, settings)))
                print(json.dumps(mine[-1]), flush=True)
        runs += mine
        rows += summary(scenario, mine)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(torch=torch.__version__, python=platform.python_version(), cpus=os.cpu_count(), args=vars(args))
    out.write_text(json.dumps(dict(meta=meta, rows=rows, runs=runs), indent=2) + "\n")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
