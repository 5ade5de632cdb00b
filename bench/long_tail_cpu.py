"""RollPacker's long-tail remedies on this CPU: the tiny model, the real engine and trainer.

Two tables, each configuration a separate `asyncrl train` process (colocated pipeline, both
cores, `actor.ppo_mini_batch_size = data.train_batch_size` everywhere so every configuration
makes one optimizer step per batch), repeated `--repeats` times in alternation (ABCABC):

1. Long-tail workload (`data.task=longtail rollout.length_from_prompt=true`, as bench/pipelines.py:
   each response decodes exactly the lognormal length its prompt asks for, EOS ignored), the same
   trained samples: colocated vs tail batching vs tail batching + reward scheduler + stream trainer.
   Reported: rollout time per step (`timing_s/gen`), end-to-end time (sum of `timing_s/step`),
   the validation score at the end. Steps are a multiple of 5: with speculation 1.25 every 5th
   step is a long round, and the long-prompt queue is empty at the end.
2. Code rewards (the `code` task's rows: model-written programs run in the sandbox against unit
   tests): colocated vs + reward scheduler; how much reward time hides behind generation
   (`timing_s/reward` after generation, `reward/hidden_ratio`). The rows are written to a JSONL
   with a lognormal `extra_info.length` and run with `rollout.length_from_prompt=true`: the tiny
   model otherwise answers every code prompt in ~3 tokens, all responses end in the same decode
   step, and there is no generation left to hide rewards behind.

    PYTHONPATH=. python bench/long_tail_cpu.py          # bench/results/long_tail_cpu.json + tables

Run it on an idle machine: every number is wall-clock on 2 cores. The scores are not a learning
result (the tiny model was never taught either task).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncrl.data.tasks import make_task

ROOT = Path(__file__).resolve().parents[1]
ONE_STEP = ["pipeline=colocated", "num_threads=2", "trainer.test_freq=0", "trainer.val_before_train=false",
            "data.val_size=16", "trainer.logger=[jsonl]", "actor.ppo_epochs=1"]
REMEDIES = ["tail_batching.enable=true", "reward_scheduler.enable=true", "stream_trainer.enable=true"]
LONGTAIL = {
    "colocated": [],
    "tail batching": REMEDIES[:1],
    "tail batching + reward scheduler + stream trainer": REMEDIES,
}
CODE = {"colocated": [], "+ reward scheduler": ["reward_scheduler.enable=true"]}


def longtail_common(a: argparse.Namespace) -> list[str]:
    return [*ONE_STEP, "data.task=longtail", "rollout.length_from_prompt=true", f"data.max_response_length={a.max_len}",
            f"data.train_batch_size={a.prompts}", f"actor.ppo_mini_batch_size={a.prompts}", f"rollout.n={a.n}",
            f"trainer.total_training_steps={a.steps}"]


def code_common(a: argparse.Namespace, train: Path, val: Path) -> list[str]:
    return [*ONE_STEP, f"data.train_files=[{train}]", f"data.val_files=[{val}]", "rollout.length_from_prompt=true",
            "data.max_prompt_length=192", f"data.max_response_length={a.code_max_len}",
            f"data.train_batch_size={a.prompts}", f"actor.ppo_mini_batch_size={a.prompts}", f"rollout.n={a.n}",
            f"trainer.total_training_steps={a.code_steps}"]


def write_code_rows(path: Path, split: str, count: int, max_len: int) -> None:
    """The code task's rows, each with a lognormal `extra_info.length` (median max_len/4, sigma 1)."""
    rng = random.Random(f"code-lengths-{split}")
    with path.open("w") as fh:
        for row in make_task("code", count, seed=0, split=split):
            length = min(max(round(rng.lognormvariate(math.log(max_len / 4), 1.0)), 1), max_len)
            fh.write(json.dumps({"data_source": row.data_source, "prompt": list(row.messages),
                                 "ability": row.ability, "reward_model": {"ground_truth": row.ground_truth},
                                 "extra_info": {**row.extra_info, "length": length}}) + "\n")


def run(overrides: list[str], out: Path) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)  # a fresh run, not a resume
    load = os.getloadavg()[0]
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "asyncrl.cli", "train", f"trainer.output_dir={out}", *overrides]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing_s/step" in r]
    return {"load_1min_before": load, "process_s": time.perf_counter() - start, "steps": len(steps),
            "train_s": sum(r["timing_s/step"] for r in steps), "gen_s": _mean(steps, "timing_s/gen"),
            "reward_s": _mean(steps, "timing_s/reward"), "hidden_ratio": _mean(steps, "reward/hidden_ratio"),
            "old_log_prob_s": _mean(steps, "timing_s/old_log_prob"),
            "update_actor_s": _mean(steps, "timing_s/update_actor"),
            "trained_responses": int(sum(r.get("training/responses", 0) for r in steps)),
            "trained_tokens": sum(r.get("response_length/mean", 0.0) * r.get("training/responses", 0) for r in steps),
            "long_rounds": sum(r.get("tail_batching/long_round", 0.0) for r in steps),
            "streamed_groups": _mean(steps, "stream_trainer/streamed_groups"),
            "final_val_score": next((r["val/score/mean"] for r in reversed(rows) if "val/score/mean" in r), None)}


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else None


def alternate(configs: dict[str, list[str]], common: list[str], repeats: int, root: Path) -> list[dict[str, Any]]:
    """Each config `repeats` times, in the order ABCABC; per config the runs and their mean/min/max."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for rep in range(repeats):
        for i, (name, extra) in enumerate(configs.items()):
            runs[name].append(run([*common, *extra], root / f"{i}-{rep}"))
            print(json.dumps({"config": name, "repeat": rep, **runs[name][-1]}), flush=True)
    return [{"config": name, "overrides": [*common, *configs[name]], "runs": rs,
             **{key: _stats([r[key] for r in rs]) for key in ("train_s", "gen_s", "reward_s", "hidden_ratio",
                                                              "old_log_prob_s", "update_actor_s",
                                                              "final_val_score", "trained_tokens")}}
            for name, rs in runs.items()]


def _stats(values: list[float | None]) -> dict[str, float] | None:
    xs = [v for v in values if v is not None]
    return {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs)} if xs else None


def spread(stat: dict[str, float] | None, digits: int = 1) -> str:
    """"12.3 (11.9-12.8)": mean (min-max) over the repeats."""
    if not stat:
        return "–"
    mean, lo, hi = (f"{stat[k]:.{digits}f}" for k in ("mean", "min", "max"))
    return mean if lo == hi else f"{mean} ({lo}-{hi})"


def tables(results: dict[str, Any]) -> str:
    lt, code = results["longtail"], results["code"]
    base = lt[0]["train_s"]["mean"]
    lines = ["| configuration | gen s/step | old_lp + update s/step | end-to-end s | speed-up | trained tokens "
             "| final val score |", "|---|---|---|---|---|---|---|"]
    for r in lt:
        train = sum(r[k]["mean"] for k in ("old_log_prob_s", "update_actor_s") if r[k])  # no pass: None
        lines.append(f"| {r['config']} | {spread(r['gen_s'], 2)} | {train:.2f} | {spread(r['train_s'])} "
                     f"| {base / r['train_s']['mean']:.2f}× | {r['trained_tokens']['mean']:.0f} "
                     f"| {spread(r['final_val_score'], 3)} |")
    lines += ["", "| configuration (code rewards) | gen s/step | reward s/step after gen | reward hidden "
              "| end-to-end s |", "|---|---|---|---|---|"]
    for r in code:
        lines.append(f"| {r['config']} | {spread(r['gen_s'], 2)} | {spread(r['reward_s'], 2)} "
                     f"| {spread(r['hidden_ratio'], 2)} | {spread(r['train_s'])} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="long-tail steps, a multiple of 5")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--code-steps", type=int, default=4)
    p.add_argument("--code-max-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "bench/results/long_tail_cpu.json"))
    a = p.parse_args()
    start, load_before = time.perf_counter(), _uptime()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train, val = root / "code_train.jsonl", root / "code_val.jsonl"
        write_code_rows(train, "train", a.code_steps * a.prompts * 2, a.code_max_len)
        write_code_rows(val, "test", 16, a.code_max_len)
        results: dict[str, Any] = {"longtail": alternate(LONGTAIL, longtail_common(a), a.repeats, root / "lt"),
                                  "code": alternate(CODE, code_common(a, train, val), a.repeats, root / "code")}
    cmd = "PYTHONPATH=. python bench/long_tail_cpu.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if k != "out")
    results |= {"command": cmd, "args": {k: v for k, v in vars(a).items() if k != "out"},
                "uptime_before": load_before, "uptime_after": _uptime(), "seconds": time.perf_counter() - start}
    Path(a.out).write_text(json.dumps(results, indent=1))
    print(tables(results))


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    main()
