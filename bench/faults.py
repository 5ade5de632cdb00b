"""What each fault costs on this machine with the tiny model: bench/results/faults.json.

Every training scenario is a separate `asyncrl train` process (the CLI with its signal handlers
and exit codes) on a small arithmetic config. The parent watches `metrics.jsonl`, injects the
fault (SIGTERM, SIGKILL, a reward function that starts failing), times what follows, reads the
checkpoint left behind, resumes the run to its end and checks `samples.jsonl`: every prompt of
the stream trained exactly once, and for colocated / one-step-off the same (step, prompt) list
as an uninterrupted run. Reward-pool faults are timed in-process on `RewardPool`. A full disk is
a real one (a small tmpfs in a private mount namespace, `unshare -m`) and, as the unit test does
it, an ENOSPC raised by the checkpoint's own file writes.

    python bench/faults.py                          # ~5 min; first waits for a 1-min load < 1.0
    python bench/faults.py --repeats 1 --only sigterm,reward_pool   # updates those parts only

Timings: median, min and max over --repeats. Nothing is asserted: each scenario records what it
saw, and `problems` lists whatever did not go as docs/reliability.md says it should.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from asyncrl.pipelines.checkpoint import latest_checkpoint, load_checkpoint_state  # noqa: E402

PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
BASE = ["trainer.logger=[jsonl]", "num_threads=1", "data.train_batch_size=8", "rollout.n=4",
        "actor.ppo_mini_batch_size=4", "trainer.test_freq=0", "trainer.val_before_train=false"]
TOTAL = 30
"""Updates of a colocated / one-step-off run (240 prompts)."""
PIPELINES = {
    "colocated": ["pipeline=colocated", f"trainer.total_training_steps={TOTAL}"],
    "one_step_off": ["pipeline=one_step_off", f"trainer.total_training_steps={TOTAL}"],
    "fully_async": ["pipeline=fully_async", "async_training.staleness_threshold=1.0",
                    "rollout.total_rollout_steps=4000"],
}
STOP_AT, KILL_AT, SAVE_FREQ = 5, 8, 5
"""SIGTERM once update 5 is logged; SIGKILL once update 8 is (with trainer.save_freq=5)."""
REWARD_TIMEOUT_S = 1.0
PARTS = ("sigterm", "sigkill", "reward_mid_run", "reward_pool", "disk_full")
_BREAKING = '''
import os, time
from asyncrl.rewards.registry import compute_score

def reward(data_source, solution_str, ground_truth, extra_info):
    if os.path.exists({flag!r}):
        if {hang}:
            time.sleep(1000)
        raise ConnectionError("reward service unreachable")
    return compute_score(data_source, solution_str, ground_truth, extra_info)
'''
_POOL_REWARDS = '''
import os, time

def reward(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "hang":
        time.sleep(1000)
    if solution_str == "busy":
        while True:
            pass
    if solution_str == "crash" or (solution_str == "crash_once" and not os.path.exists(extra_info["marker"])):
        open(extra_info.get("marker", os.devnull), "w").close()
        os._exit(1)
    return 1.0
'''


# ---- training processes ----

def train_cmd(out: Path, overrides: list[str]) -> list[str]:
    return [PY, "-m", "asyncrl.cli", "train", f"trainer.output_dir={out}", *BASE, *overrides]


def rows(out: Path) -> list[dict[str, Any]]:
    path, found = out / "metrics.jsonl", []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            found.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return found


def last_step(out: Path) -> int:
    return max((r["step"] for r in rows(out)), default=0)


class Train:
    """One `asyncrl train` process in `out` (its output in `out`.log). `first_step_s`: from the
    process start to the first update after `after` in metrics.jsonl (a resumed run first rolls
    the file back to its checkpoint, so an older line counts only once the file has changed)."""

    def __init__(self, out: Path, overrides: list[str], after: int = 0) -> None:
        self.out, self.after = out, after
        self.first_step_s: float | None = None
        self.log = out.with_suffix(".log")
        out.parent.mkdir(parents=True, exist_ok=True)
        self._mark = _stat(out / "metrics.jsonl")
        self.started = time.perf_counter()
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(train_cmd(out, overrides), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         env=ENV)

    def _poll(self) -> int:
        step = last_step(self.out)
        if self.first_step_s is None and step > self.after and _stat(self.out / "metrics.jsonl") != self._mark:
            self.first_step_s = time.perf_counter() - self.started
        return step

    def wait_step(self, step: int, timeout_s: float = 300) -> int:
        """Block until an update >= `step` is logged; the last one logged."""
        deadline = time.monotonic() + timeout_s
        while (last := self._poll()) < step:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"train ended ({self.proc.returncode}) before update {step}: {self.tail()}")
            time.sleep(0.02)
        return last

    def finish(self, timeout_s: float = 600) -> int:
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._poll()
            time.sleep(0.02)
        self._poll()
        return self.proc.wait(timeout=1)

    def tail(self, lines: int = 1) -> str:
        return "\n".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def ledger(out: Path) -> list[tuple[int, str]]:
    path = out / "samples.jsonl"
    return [(s["step"], s["prompt"]) for s in map(json.loads, path.read_text().splitlines())]


def check_ledger(out: Path, stream: list[str], total: int, same_as: list[tuple[int, str]] | None) -> dict[str, Any]:
    """Each of the stream's first `total` prompts trained once (and the whole ledger as `same_as`)."""
    got = ledger(out)
    counts = Counter(p for _, p in got)
    return {"trained": len(got), "twice": sum(c > 1 for c in counts.values()),
            "lost": len(set(stream[:total]) - set(counts)), "extra": len(set(counts) - set(stream[:total])),
            "same_as_uninterrupted": None if same_as is None else got == same_as}


def ledger_ok(check: dict[str, Any]) -> bool:
    clean = not check["twice"] and not check["lost"] and not check["extra"]
    return clean and check["same_as_uninterrupted"] is not False


def restored_groups(state: dict[str, Any]) -> int:
    """Finished groups a checkpoint holds (fully async: its queue; one-step-off: the next batch)."""
    pipeline = state["pipeline"]
    return len(pipeline.get("queue", pipeline.get("batch", [])))


def resume(out: Path, pipeline: str, state: dict[str, Any], extra: list[str]) -> tuple[Train, int]:
    """Run `out` to its end from its newest checkpoint; (the run, prompts it trains in all)."""
    overrides = [*PIPELINES[pipeline], *extra]
    total = TOTAL * 8
    if pipeline == "fully_async":
        total = state["trained"] + 16
        overrides.append(f"rollout.total_rollout_steps={total}")
    run = Train(out, overrides, after=state["step"])
    run.finish()
    return run, total


class Bench:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.part = tmp, ""
        tmp.mkdir(parents=True, exist_ok=True)
        self.problems: dict[str, list[str]] = {}
        self.reference: dict[str, list[tuple[int, str]]] = {}

    def problem(self, text: str) -> None:
        print("PROBLEM:", text, flush=True)
        self.problems.setdefault(self.part, []).append(text)

    def uninterrupted(self, pipeline: str) -> list[tuple[int, str]]:
        if pipeline not in self.reference:
            out = self.tmp / f"reference-{pipeline}"
            Train(out, PIPELINES[pipeline]).finish()
            self.reference[pipeline] = ledger(out)
        return self.reference[pipeline]

    @property
    def stream(self) -> list[str]:
        """The prompt stream's first 240 prompts, in order (the same in every pipeline)."""
        return [p for _, p in self.uninterrupted("colocated")]

    def after_resume(self, name: str, out: Path, pipeline: str, state: dict[str, Any],
                     extra: list[str] | None = None) -> dict[str, Any]:
        run, total = resume(out, pipeline, state, extra or [])
        same_as = None if pipeline == "fully_async" else self.uninterrupted(pipeline)
        check = check_ledger(out, self.stream, total, same_as)
        if run.proc.returncode != 0 or not ledger_ok(check):
            self.problem(f"{name}: resume exited {run.proc.returncode}, ledger {check}; run dir {out}")
        return {"resume_exit_code": run.proc.returncode, "resume_first_step_s": run.first_step_s,
                "ckpt_saves_s": [r["timing_s/save_checkpoint"] for r in rows(out)  # every save of the whole run
                                 if r.get("timing_s/save_checkpoint") is not None], "ledger": check}

    def sigterm(self, pipeline: str, i: int) -> dict[str, Any]:
        out = self.tmp / f"sigterm-{pipeline}-{i}"
        run = Train(out, PIPELINES[pipeline])
        logged = run.wait_step(STOP_AT)
        before, start, checkpointed_s = latest_checkpoint(out), time.perf_counter(), None
        run.proc.send_signal(signal.SIGTERM)
        while run.proc.poll() is None:  # when the stop's checkpoint appears, then the exit
            if checkpointed_s is None and latest_checkpoint(out) != before:
                checkpointed_s = time.perf_counter() - start
            time.sleep(0.01)
        code, exit_s = run.proc.returncode, time.perf_counter() - start
        ckpt = latest_checkpoint(out)
        if code != 128 + signal.SIGTERM or ckpt is None:
            self.problem(f"sigterm {pipeline}: exit {code}, checkpoint {ckpt}: {run.tail(3)}")
            return {"exit_code": code}
        state = load_checkpoint_state(ckpt)
        outstanding, restored = len(state["prompts"]["outstanding"]), restored_groups(state)
        return {"exit_code": code, "exit_s": exit_s, "checkpointed_s": checkpointed_s,
                "logged_at_signal": logged, "checkpoint_step": state["step"],
                "fresh_first_step_s": run.first_step_s, "last_line": run.tail(), "outstanding_prompts": outstanding,
                "restored_groups": restored, "prompts_redone": outstanding - restored,
                **self.after_resume(f"sigterm {pipeline} #{i}", out, pipeline, state)}

    def sigkill(self, pipeline: str, i: int) -> dict[str, Any]:
        out = self.tmp / f"sigkill-{pipeline}-{i}"
        save = [f"trainer.save_freq={SAVE_FREQ}"]
        run = Train(out, [*PIPELINES[pipeline], *save])
        run.wait_step(KILL_AT)
        run.proc.kill()
        run.proc.wait(timeout=60)
        logged = last_step(out)
        ckpt = latest_checkpoint(out)
        state = load_checkpoint_state(ckpt) if ckpt else {"step": 0, "pipeline": {}, "prompts": {"outstanding": []}}
        size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()) if ckpt else 0
        return {"logged_before_kill": logged, "checkpoint_step": state["step"], "updates_lost": logged - state["step"],
                "fresh_first_step_s": run.first_step_s, "ckpt_mb": size / 1e6,
                **self.after_resume(f"sigkill {pipeline} #{i}", out, pipeline, state, save)}

    def reward_mid_run(self, i: int, hang: bool = False) -> dict[str, Any]:
        """The reward function starts raising (or hanging) after update 3: how the run stops."""
        name = f"reward-{'hangs' if hang else 'raises'}-{i}"
        flag, fn = self.tmp / f"{name}.flag", self.tmp / f"{name}.py"
        fn.write_text(_BREAKING.format(flag=str(flag), hang=hang))
        extra = [f"reward.custom_function={fn}:reward", f"reward.timeout_s={REWARD_TIMEOUT_S}"]
        out = self.tmp / name
        run = Train(out, [*PIPELINES["colocated"], *extra])
        run.wait_step(3)
        flag.touch()
        start = time.perf_counter()
        code = run.finish()
        found: dict[str, Any] = {"exit_code": code, "stop_s": time.perf_counter() - start, "last_line": run.tail()}
        ckpt = latest_checkpoint(out)
        if code != 2 or "reward.max_failure_ratio" not in run.tail():
            self.problem(f"{name}: exit {code}: {run.tail(3)}")
        if ckpt is None:
            self.problem(f"{name}: no checkpoint after the reward failure")
            return found
        state = load_checkpoint_state(ckpt)
        found |= {"checkpoint_step": state["step"], "outstanding_prompts": len(state["prompts"]["outstanding"])}
        if hang:
            return found
        flag.unlink()
        return found | self.after_resume(name, out, "colocated", state, extra)


# ---- reward pool, in this process ----

def timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def reward_pool(tmp: Path, i: int, problem: Callable[[str], None]) -> dict[str, Any]:
    from asyncrl.rewards.pool import RewardPool
    from asyncrl.rewards.runner import RewardCall

    fn = tmp / "pool_rewards.py"
    fn.write_text(_POOL_REWARDS)
    spec = f"{fn}:reward"

    def call(kind: str, **extra: str) -> RewardCall:
        return RewardCall("bench", kind, "1", dict(extra))

    found: dict[str, Any] = {}
    marker = tmp / f"crashed-once-{i}"
    marker.unlink(missing_ok=True)
    pool = RewardPool(1, REWARD_TIMEOUT_S, spec)
    try:
        found["cold_call_s"], _ = timed(pool.run_one, call("ok"))  # starts the worker
        found["warm_call_s"] = statistics.median(timed(pool.run_one, call("ok"))[0] for _ in range(20))
        for kind, extra in (("hang", {}), ("crash_once", {"marker": str(marker)}), ("crash", {})):
            seconds, outcome = timed(pool.run_one, call(kind, **extra))
            found[f"{kind}_call_s"], found[f"{kind}_status"] = seconds, outcome.result.status
            found[f"after_{kind}_call_s"], after = timed(pool.run_one, call("ok"))
            if after.result.status != "ok":
                problem(f"reward pool: the call after a '{kind}' call is {after.result}")
    finally:
        pool.close()
    expected = {"hang_status": "timeout", "crash_once_status": "ok", "crash_status": "error"}
    if any(found[k] != v for k, v in expected.items()):
        problem(f"reward pool statuses: {({k: found[k] for k in expected})}")
    pool = RewardPool(2, 10.0, spec)
    try:
        pool.run([call("ok")] * 2)
        seconds, _ = timed(pool.run, [call("ok")] * 2000)
        found["calls_per_s_2_workers"] = 2000 / seconds
    finally:
        pool.close()
    return found | busy_rewards(spec)


def busy_rewards(spec: str) -> dict[str, float]:
    """A fixed CPU loop in this process alone, beside two busy-looping rewards in the pool's
    processes, and beside two busy-looping threads (what the thread-based runner did)."""
    import torch

    from asyncrl.rewards.pool import RewardPool
    from asyncrl.rewards.runner import RewardCall

    torch.set_num_threads(1)
    a = torch.randn(64, 64)

    def torch_loop() -> None:  # many small ops, each releasing the GIL, as a tiny-model update is
        x = a
        for _ in range(200):
            x = torch.tanh(x @ a) * 0.5

    def python_loop() -> None:
        sum(i * i for i in range(3_000_000))

    def time_loops(tag: str, times: int = 3) -> dict[str, float]:
        return {f"{name}_loop_s/{tag}": statistics.median(timed(loop)[0] for _ in range(times))
                for name, loop in (("python", python_loop), ("torch", torch_loop))}

    found = time_loops("alone")
    pool = RewardPool(2, 600.0, spec)
    caller = threading.Thread(target=pool.run, args=([RewardCall("bench", "busy", "1", {})] * 2,))
    caller.start()
    while len(pool.pids()) < 2:
        time.sleep(0.05)
    time.sleep(1.0)  # both workers imported and spinning
    found |= time_loops("2_busy_reward_processes")
    pool.close()
    caller.join()
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinners = [threading.Thread(target=spin) for _ in range(2)]
    for t in spinners:
        t.start()
    found |= time_loops("2_busy_reward_threads", times=1)  # each GIL hand-back waits ~5-30 ms: slow
    stop.set()
    for t in spinners:
        t.join()
    return found


# ---- full disk ----

DISK_SIZES_MB = {"model_weights": 11, "optimizer_state": 14}
"""A tmpfs this small holds one checkpoint (9.7 MB) and fills during the second one's
model.safetensors (11 MB) or actor_state.safetensors (14 MB)."""
_DISK_RUN = ["pipeline=colocated", "trainer.total_training_steps=12", "trainer.save_freq=3"]
_PATCHED = '''
import errno, sys
import asyncrl.pipelines.checkpoint as C
real = C.atomic_write_text
def full(path, text):
    if ".partial" in str(path) and "global_step_3" not in str(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    real(path, text)
C.atomic_write_text = full
from asyncrl.cli import main
sys.exit(main(sys.argv[1:]))
'''


def inspect_run(out: Path) -> dict[str, Any]:
    """What a run left in its checkpoint directory, and whether the newest complete checkpoint loads."""
    from safetensors.torch import load_file

    from asyncrl.pipelines.manifest import damage
    from asyncrl.state_io import load_state

    root = out / "checkpoints"
    newest = latest_checkpoint(out)
    found: dict[str, Any] = {"complete": sorted(p.name for p in root.glob("global_step_*")),
                             "partial": sorted(p.name for p in root.glob(".*")),
                             "newest": newest.name if newest else None, "newest_loads": False}
    if newest is not None:
        load_checkpoint_state(newest)
        load_file(newest / "actor/model.safetensors")
        load_state(newest / "actor/actor_state.json")
        found["newest_loads"] = damage(newest) is None
    return found


def disk_full(tmp: Path, problem: Callable[[str], None]) -> dict[str, Any]:
    found: dict[str, dict[str, Any]] = {}
    for fills, size_mb in DISK_SIZES_MB.items():
        mnt, rc = tmp / f"disk-{fills}", tmp / f"disk-{fills}.rc"
        mnt.mkdir(parents=True, exist_ok=True)
        log = tmp / f"disk-{fills}.log"
        script = (f"mount -t tmpfs -o size={size_mb}m tmpfs {mnt} || exit 99; cd {ROOT}; "
                  f"{shlex.join(train_cmd(mnt / 'run', _DISK_RUN))} > {log} 2>&1; echo $? > {rc}; "
                  f"{shlex.join([PY, __file__, '--inspect', str(mnt / 'run')])}")
        done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                              capture_output=True, text=True, env=ENV)
        if done.returncode != 0 or not rc.exists():
            found[f"tmpfs_{fills}"] = {"skipped": f"no private tmpfs here ({done.stderr.strip()[-200:]})"}
            continue
        found[f"tmpfs_{fills}"] = {"tmpfs_mb": size_mb, "exit_code": int(rc.read_text()),
                                   "last_line": log.read_text().strip().splitlines()[-1].replace(str(mnt), "<tmpfs>"),
                                   **json.loads(done.stdout.strip().splitlines()[-1])}
    out = tmp / "disk-patched"
    cmd = [PY, "-c", _PATCHED, "train", f"trainer.output_dir={out}", *BASE, *_DISK_RUN]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=ENV)
    last = done.stderr.strip().splitlines()[-1].replace(str(out), "<run>")
    found["enospc_in_atomic_write"] = {"exit_code": done.returncode, "last_line": last,
                                       **inspect_run(out)}
    for name, r in found.items():
        if "skipped" in r:
            continue
        if (r["exit_code"] != 2 or "could not write the checkpoint" not in r["last_line"] or r["partial"]
                or r["newest"] != "global_step_3" or not r["newest_loads"]):
            problem(f"disk full ({name}): exit {r['exit_code']}, '{r['last_line']}', partial dirs {r['partial']}, "
                    f"newest complete {r['newest']} (loads: {r['newest_loads']}); expected exit 2, the one-line "
                    "CheckpointError, no partial dir, global_step_3 intact")
    return found


# ---- summary ----

def spread(values: list[float | None]) -> dict[str, float] | None:
    xs = [v for v in values if v is not None]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else None


def summarise(parts: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for pipeline, runs in parts.get("sigterm", {}).items():
        s[f"sigterm/{pipeline}"] = {k: spread([r.get(k) for r in runs]) for k in
                                    ("exit_s", "checkpointed_s", "prompts_redone", "outstanding_prompts",
                                     "restored_groups", "resume_first_step_s", "fresh_first_step_s")}
    for pipeline, runs in parts.get("sigkill", {}).items():
        s[f"sigkill/{pipeline}"] = {k: spread([r.get(k) for r in runs]) for k in
                                    ("updates_lost", "resume_first_step_s", "fresh_first_step_s", "ckpt_mb")}
        saves = [x for r in runs for x in r.get("ckpt_saves_s", [])]
        s[f"checkpoint/{pipeline}"] = {"save_s": spread(saves), "mb": spread([r.get("ckpt_mb") for r in runs])}
    for pipeline in PIPELINES:
        runs = [r for part in ("sigterm", "sigkill") for r in parts.get(part, {}).get(pipeline, [])]
        if runs:
            s[f"startup/{pipeline}"] = {k: spread([r.get(f"{k}_first_step_s") for r in runs])
                                        for k in ("fresh", "resume")}
    for kind, runs in parts.get("reward_mid_run", {}).items():
        s[f"reward_{kind}"] = {k: spread([r.get(k) for r in runs]) for k in ("stop_s", "resume_first_step_s")}
    if runs := parts.get("reward_pool"):
        s["reward_pool"] = {k: spread([r[k] for r in runs]) for k, v in runs[0].items() if isinstance(v, float)}
    return s


def wait_for_quiet(limit: float, max_wait_s: float = 600, poll_s: float = 30) -> dict[str, float]:
    start = time.monotonic()
    while (load := os.getloadavg()[0]) >= limit and time.monotonic() - start < max_wait_s:
        print(f"1-min load {load:.2f} >= {limit}: waiting {poll_s:.0f} s", flush=True)
        time.sleep(poll_s)
    return {"load_1m": load, "waited_s": time.monotonic() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help=f"comma list of parts: {','.join(PARTS)}")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/faults.json")
    ap.add_argument("--runs-dir", default="", help="keep the runs here (default: a temp dir)")
    ap.add_argument("--max-load", type=float, default=1.0, help="wait until the 1-min load average is below this")
    ap.add_argument("--inspect", type=Path, help=argparse.SUPPRESS)  # inside the tmpfs namespace
    args = ap.parse_args()
    if args.inspect:
        print(json.dumps(inspect_run(args.inspect)))
        return
    wanted = [p for p in PARTS if not args.only or p in args.only.split(",")]
    old = json.loads(args.out.read_text()) if args.only and args.out.exists() else {}
    parts: dict[str, Any] = old.get("parts", {})
    load: dict[str, Any] = old.get("load", {}) | {"before": wait_for_quiet(args.max_load)}
    with tempfile.TemporaryDirectory() as tmpdir:
        bench = Bench(Path(args.runs_dir or tmpdir))
        steps: dict[str, Callable[[], Any]] = {
            "sigterm": lambda: {p: [bench.sigterm(p, i) for i in range(args.repeats)] for p in PIPELINES},
            "sigkill": lambda: {p: [bench.sigkill(p, i) for i in range(args.repeats)]
                                for p in ("colocated", "fully_async")},
            "reward_mid_run": lambda: {"raises": [bench.reward_mid_run(i) for i in range(args.repeats)],
                                       "hangs": [bench.reward_mid_run(0, hang=True)]},
            "reward_pool": lambda: [reward_pool(bench.tmp, i, bench.problem) for i in range(args.repeats)],
            "disk_full": lambda: disk_full(bench.tmp, bench.problem),
        }
        problems: dict[str, list[str]] = old.get("problems", {})
        for name in wanted:  # the file is rewritten after each part: a long run keeps what it measured
            start, bench.part = time.perf_counter(), name
            load[name] = os.getloadavg()[0]
            parts[name] = steps[name]()
            problems[name] = bench.problems.get(name, [])
            load["after"] = os.getloadavg()[0]
            write(args, parts, problems, load)
            print(f"== {name}: {time.perf_counter() - start:.0f} s", flush=True)
    print(json.dumps(summarise(parts), indent=1))
    print("problems:", *[f"{k}: {p}" for k, ps in problems.items() for p in ps] or ["none"], sep="\n  ")


def write(args: argparse.Namespace, parts: dict[str, Any], problems: dict[str, list[str]],
          load: dict[str, Any]) -> None:
    import torch

    result = {"command": "python bench/faults.py" + (f" --repeats {args.repeats}" if args.repeats != 3 else ""),
              "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "python": sys.version.split()[0]},
              "config": {"base": BASE, "pipelines": PIPELINES, "stop_at": STOP_AT, "kill_at": KILL_AT,
                         "save_freq": SAVE_FREQ, "reward_timeout_s": REWARD_TIMEOUT_S, "repeats": args.repeats},
              "load": load, "summary": summarise(parts), "problems": problems, "parts": parts}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))

if __name__ == "__main__":
    main()
