"""Benchmark: the episode endpoint (`rollout.agent.entrypoint`) against the direct episode path.

Workload: the tiny-tools model on `data.task=long_addition`, `--rows` prompts x `--n` episodes
(64 by default) at once through one rollout host (`build_rollout_server`: the torch engine with
its prefix cache), each episode at most two model turns around one calculator call. Arms:
- endpoint: `AGENT` below, an agent on the `openai` client (no asyncrl in it) through the
  in-process endpoint: call, run the calculator on the returned tool call, call again;
- endpoint_sdk: the same agent on a `with_options` copy of its client, which takes the SDK's own
  path (its request transform, HTTP through the in-process app), as streamed calls do;
- direct: the built-in tool episode (`rollout.multi_turn.enable`), the same turns as token ids.

Reported per arm (medians of `--repeats` runs, arms alternating): model calls/s, generated
tokens/s (the model's tokens), wall time; for the endpoint: the added latency per call (the
agent's wall time of a `create` minus the engine's time generating that call, median), the
client library's share of it (the agent's wall time minus the endpoint handler's) and the share
of calls the in-process client answered on its direct path (`client.EpisodeOpenAI`), the goal
being at most 5 ms or 10% of a call's wall time, whichever is larger; `agent/chains` per
episode and `agent/retokenized_tokens` (goals: 1 and 0); the prefix cache's hit rate on chains
(engine hit tokens over the cacheable tokens of every call after a chain's first, i.e. its
`usage.prompt_tokens_details.cached_tokens`; goal: 1.0). Writes bench/results/agent_gateway.json.

    PYTHONPATH=. python bench/agent_gateway.py                 # 8 rows x 8 episodes, 3 repeats
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncrl.config import load_config  # noqa: E402
from asyncrl.models import load_model  # noqa: E402
from asyncrl.workers.factory import build_rollout_server, load_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AGENT = "bench.agent_gateway:agent"
"""This module (registered under that name in `main`, so the agent shares its globals)."""
TASK = ["model.path=tiny-tools", "data.task=long_addition", "data.max_prompt_length=80", "data.max_response_length=96",
        "rollout.multi_turn.format=compact", "rollout.multi_turn.max_assistant_turns=2", "num_threads=1"]
CALC = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
SDK_PATH = [False]
"""Whether the agent takes the SDK's own path (the endpoint_sdk arm)."""
CALLS: list[dict[str, float]] = []
"""The endpoint arm's calls: the agent's wall time, the engine's and the handler's (seconds), cached tokens."""
ENGINE_S: dict[Any, float] = {}
HANDLER_S: dict[Any, float] = {}
"""Per asyncio task (the in-process transport runs the app in the agent's task): the last call's times."""


async def agent(row: dict[str, Any], client: Any) -> None:
    """Two calls around one calculator call, on the `openai` client only."""
    client = client.with_options(max_retries=0) if SDK_PATH[0] else client
    messages = list(row["prompt"])
    for turn in range(2):
        start = time.perf_counter()
        done = await client.chat.completions.create(model="policy", messages=messages, tools=[CALC])
        task = asyncio.current_task()
        cached = float(done.usage.prompt_tokens_details.cached_tokens)
        CALLS.append({"wall_s": time.perf_counter() - start, "engine_s": ENGINE_S.pop(task, 0.0),
                      "handler_s": HANDLER_S.pop(task, 0.0), "cached": cached, "later": float(turn > 0)})
        msg = done.choices[0].message
        if not msg.tool_calls:
            return
        messages += [msg.model_dump(), {"role": "tool", "tool_call_id": msg.tool_calls[0].id,
                                        "content": calculate(msg.tool_calls[0].function.arguments)}]


def calculate(arguments: str) -> str:
    try:
        a, b = json.loads(arguments)["expression"].split("+")
        return str(int(a) + int(b))
    except (ValueError, KeyError, TypeError):
        return "error: not a+b"


def timed(owner: Any, name: str, into: dict[Any, float]) -> None:
    """Wrap `owner.name` (a coroutine function) to record its time under the running task."""
    inner = getattr(owner, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await inner(*args, **kwargs)
        finally:
            into[asyncio.current_task()] = time.perf_counter() - start

    setattr(owner, name, wrapper)


async def run_arm(arm: str, args: argparse.Namespace, model: Any, tok: Any) -> dict[str, float]:
    endpoint = arm.startswith("endpoint")
    SDK_PATH[0] = arm == "endpoint_sdk"
    keys = [*TASK, f"rollout.agent.entrypoint={AGENT}"] if endpoint else [*TASK, "rollout.multi_turn.enable=true"]
    cfg = load_config(None, [*keys, f"rollout.max_num_seqs={args.rows * args.n}", f"seed={args.seed}"])
    server = build_rollout_server(cfg, 0, model, tok)
    rows = load_data(cfg, tok, lambda _: None)[0][:args.rows]
    if endpoint:
        timed(server, "_sample", ENGINE_S)
        timed(server.episode.gateway, "answer", HANDLER_S)  # type: ignore[attr-defined]  # both client paths
    CALLS.clear()
    start = time.perf_counter()
    groups = await asyncio.gather(*(server.generate_scored(r, args.n, f"b{i}", score=False)
                                    for i, r in enumerate(rows)))
    wall = time.perf_counter() - start
    stats = await server.stats()
    server.close()
    trajs = [t for g in groups for t in g.trajectories]
    calls = sum(t.episode.get("num_turns", 0.0) for t in trajs)
    tokens = sum(sum(t.loss_mask) for t in trajs)
    out = {"wall_s": wall, "calls": calls, "calls_per_s": calls / wall, "tokens_per_s": tokens / wall,
           "episodes": len(trajs), "prefix_cache_hit_tokens": stats["prefix_cache/hit_tokens"]}
    if endpoint:
        out |= endpoint_metrics(trajs, stats)
        out["direct_path_share"] = server.episode.gateway.in_process_calls / len(CALLS)  # type: ignore[attr-defined]
    return out


def endpoint_metrics(trajs: list[Any], stats: dict[str, float]) -> dict[str, float]:
    added = [c["wall_s"] - c["engine_s"] for c in CALLS]
    client = [c["wall_s"] - c["handler_s"] for c in CALLS]
    cacheable = sum(c["cached"] for c in CALLS if c["later"])
    return {"added_latency_ms_median": 1e3 * statistics.median(added),
            "client_library_ms_median": 1e3 * statistics.median(client),
            "call_wall_ms_median": 1e3 * statistics.median(c["wall_s"] for c in CALLS),
            "chains_per_episode": sum(t.episode["agent/chains"] for t in trajs) / len(trajs),
            "retokenized_tokens": sum(t.episode["agent/retokenized_tokens"] for t in trajs),
            "prefix_cache_hit_rate": stats["prefix_cache/hit_tokens"] / cacheable if cacheable else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench/results/agent_gateway.json"))
    args = ap.parse_args()
    sys.modules["bench.agent_gateway"] = sys.modules[__name__]
    model, tok = load_model(load_config(None, TASK).model, lambda _: None)
    runs: dict[str, list[dict[str, float]]] = {"endpoint": [], "endpoint_sdk": [], "direct": []}
    for arm in runs:  # warm-up: imports, first allocations
        asyncio.run(run_arm(arm, argparse.Namespace(**{**vars(args), "rows": 1, "n": 2}), model, tok))
    for _ in range(args.repeats):
        for arm in runs:
            runs[arm].append(asyncio.run(run_arm(arm, args, model, tok)))
            print(arm, json.dumps(runs[arm][-1]), flush=True)
    summary = {arm: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for arm, rs in runs.items()}
    for arm in ("endpoint", "endpoint_sdk"):
        summary[arm]["added_latency_goal_ms"] = max(5.0, 0.1 * summary[arm]["call_wall_ms_median"])
    result = {"command": "PYTHONPATH=. python bench/agent_gateway.py " + " ".join(sys.argv[1:]),
              "machine": platform.processor() or platform.machine(), "episodes": args.rows * args.n,
              "repeats": args.repeats, "summary": summary, "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
