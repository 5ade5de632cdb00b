"""docs/benchmarks.md and docs/img/*.png from bench/results/*.json (written by bench/run_all.py).

Every number in the sections this writes is read from a results file here; nothing is typed in by
hand. A part that has not been run yet is listed as such. The page's other `## ` sections (results
written up with their commands: accuracy parity, the tool task, before/after comparisons) are kept
where they are (`merge`).

    python bench/report.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS, IMG = ROOT / "bench/results", ROOT / "docs/img"
PIPELINE_ORDER = ("colocated", "one_step_off", "fully_async")
TRAINER_TEXT = [
    "## Trainer throughput, one configuration at a time (`bench/trainer_throughput.py`)", "",
    "`Actor.train_step` on random long-tailed rows, the actor built by the run's own factory from the device's "
    "defaults plus each configuration's overrides (so it runs the budget, attention path and precision a run "
    "resolves). The defaults run first whatever `--time-budget-s`; the A/B configurations (grouped attention at "
    "CALL_COST 8192, budget 8192, autocast, compiled or eager: whichever the device's defaults are not, "
    "checkpointing, padded) run while the longest configuration so far (less its compile, paid once per process) "
    "still fits, else they are listed as skipped, as is one whose key this tree lacks; one that raises is listed "
    "as failed with its error, and the next runs. MFU (verl) is verl's "
    "estimate (6 x params with embedding and head x tokens + 12 x sum s^2 attention) over the GPU's bf16 peak; "
    "MFU (executed) counts what runs (no embedding, the head on response tokens only, causal attention pairs, "
    "recomputation under checkpointing: `telemetry.perf.executed_training_flops`). Forward is the step minus every "
    "`Tensor.backward` and `optimizer.step` (CUDA events on a GPU). On a CPU, memory is the process's peak RSS. "
    "The GPU table comes from `bash bench/gpu_session.sh trainer` (docs/gpu.md).",
]


def load(name: str) -> Any:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def last_run(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The newest run in a JSON-lines results file (appended run after run): its meta line and
    the rows after it; None when the file is absent."""
    path = RESULTS / f"{name}.jsonl"
    if not path.exists():
        return None
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    start = max((i for i, r in enumerate(lines) if "meta" in r), default=None)
    if start is None:  # a run stopped before its meta line
        return None
    return lines[start]["meta"], lines[start + 1:]


def f(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def pipelines_section(data: Any, sim: Any) -> list[str]:
    if not data:
        return ["_not run yet: `./run.sh bench --only pipelines`_"]
    rows = data["results"]
    base = next(r for r in rows if r["config"] == "colocated")["wall_s"]
    out = ["| pipeline | wall s | speed-up | samples/s | trainer idle | rollout idle | final val score |",
           "|---|---|---|---|---|---|---|"]
    by_sim = {r["config"]: r for r in (sim or {}).get("rows", [])}
    for r in rows:
        s = by_sim.get(r["config"])
        t_idle = s["measured"]["trainer_idle"] if s else r["trainer_idle_ratio"]
        r_idle = s["measured"]["rollout_idle"] if s else r["rollouter_idle_ratio"]
        out.append(f"| {r['config']} | {r['wall_s']:.1f} | {base / r['wall_s']:.2f}× | {r['samples_per_s']:.1f} "
                   f"| {f(t_idle)} | {f(r_idle)} | {f(r['final_val_score'])} |")
    a = data["args"]
    cmd = (f"python bench/pipelines.py --steps {a['steps']} --prompts {a['prompts']} --n {a['n']} "
           f"--max-len {a['max_len']}")
    _bar_plot("pipelines.png", [r["config"] for r in rows], [r["wall_s"] for r in rows], "wall-clock s (512 responses)")
    return [f"Command: `{cmd}`", "", *out, "", "![pipelines](img/pipelines.png)", "",
            "The validation score is not a learning result: the tiny model was never taught the long-tail task; "
            "learning per pipeline is asserted by the end-to-end tests on the arithmetic task.", "",
            "How to read it: on 2 cores, decoupling gives each side one core, so it beats colocated only "
            "where it hides enough waiting: one-step-off hides generation of batch k+1 behind training on batch "
            "k; mode (a) (on-policy, a sync after every small update) makes both sides wait on each other; a "
            "larger `trigger_parameter_sync_step` or `staleness_threshold` gives the rollouter room. Tail "
            "batching wins on this CPU because a tiny-model decode step costs about the same at batch 64 as "
            "at batch 1 (~1 ms of per-op overhead): cutting the longest responses cuts the step count. The "
            "decoupled sides are threads of one process here and slow each other down (the GIL, the caches); "
            "on GPUs the simulator's regime applies (below)."]


def sim_section(sim: Any) -> list[str]:
    if not sim:
        return ["_not run yet: `./run.sh bench --only pipelines,sim`_"]
    out = ["| pipeline | measured s | simulated s | error | measured trainer/rollout idle | simulated |",
           "|---|---|---|---|---|---|"]
    for r in sim["rows"]:
        m, p = r["measured"], r["predicted"]
        name = f"{r['config']} (fitted)" if r["config"] in sim["fitted_on"] else r["config"]
        out.append(f"| {name} | {m['total_s']:.1f} | {p['total_s']:.1f} | {r['wall_error']:+.0%} "
                   f"| {m['trainer_idle']:.2f} / {m['rollout_idle']:.2f} "
                   f"| {p['trainer_idle']:.2f} / {p['rollout_idle']:.2f} |")
    names = [r["config"] for r in sim["rows"]]
    _bar_plot("sim_vs_measured.png", names, [r["measured"]["total_s"] for r in sim["rows"]], "wall-clock s",
              second=[r["predicted"]["total_s"] for r in sim["rows"]], labels=("measured", "simulated"))
    return ["Command: `python bench/sim_vs_measured.py --write` (after `bench/pipelines.py --runs-dir bench/runs`).",
            f"Profile: `{sim['profile']}` fitted to the measured {' and '.join(sim['fitted_on'])} runs "
            "(efficiencies, the per-step vs per-token split of decoding, 1→2-core scaling); every other row is a "
            "prediction (errors explained in [simulator.md](simulator.md#profiles-and-calibration)).",
            "", *out, "", "![sim vs measured](img/sim_vs_measured.png)"]


def peer_section(vs: Any) -> list[str]:
    if not vs:
        return ["_not run yet: `./run.sh bench --only peer`_"]
    out = ["| workload | TRL s/step | asyncrl s/step | TRL completions/s | asyncrl completions/s "
           "| speed-up (median, range over pairs) | asyncrl gen / update s |", "|---|---|---|---|---|---|---|"]
    for name, r in vs["results"].items():
        phases = [statistics.median(x["phases"][k] for x in r["asyncrl"]) for k in ("gen", "update_actor")]
        out.append(f"| {name} | {r['trl_s_per_step']:.2f} | {r['asyncrl_s_per_step']:.2f} "
                   f"| {r['trl_completions_per_s']:.0f} | {r['asyncrl_completions_per_s']:.0f} "
                   f"| {r['speedup_median']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f}) "
                   f"| {phases[0]:.2f} / {phases[1]:.2f} |")
    return out + ["", f"Command: `python bench/vs_trl.py --pairs {vs['pairs']}` ({vs['pairs']} pairs per workload, "
                  "runs alternating, the order flipped every pair; medians; the first step of each run excluded)."]


def engine_section(engine: Any, sync: Any) -> list[str]:
    out = []
    if engine:
        out += ["| model | system | batch | tokens/s |", "|---|---|---|---|"]
        out += [f"| {r['model']} | {r['system']} | {r['batch']} | {r['tokens_per_s']:.0f} |" for r in engine["rows"]]
        out += ["", "Command: `python bench/engine.py --models tiny` (details: [engine.md](engine.md))", ""]
    if sync:
        out += ["| model | transport | MB | median s | GB/s |", "|---|---|---|---|---|"]
        out += [f"| {r['model']} | {r['transport']} | {r['bytes'] / 1e6:.1f} | {r['median_s']:.4f} "
                f"| {r['gb_per_s']:.2f} |"
                for r in sync["rows"]]
        out += ["", "Command: `python bench/weight_sync.py --models tiny,smollm2` "
                "(details: [weight_sync.md](weight_sync.md))"]
    return out or ["_not run yet_"]


def calibration_section(cal: Any) -> list[str]:
    if not cal:
        return ["_not run yet: `./run.sh bench --only calibrate`_"]
    out = ["| GPUs | fitted median length | phase | SPEC s | simulated s | error |", "|---|---|---|---|---|---|"]
    for r in cal["rows"]:
        for ph in ("gen", "old_log_prob", "update_actor", "step"):
            out.append(f"| {r['gpus']} | {r['length_median']} | {ph} | {r[ph + '_measured']:.1f} "
                       f"| {r[ph + '_sim']:.1f} | {r[ph + '_error']:+.1%} |")
    worst = max(abs(r[p + "_error"]) for r in cal["rows"] for p in ("gen", "old_log_prob", "update_actor"))
    pred = ["| decoupled run (predicted, not fitted) | predicted | reported | error | reported by |",
            "|---|---|---|---|---|"]
    for r in cal.get("predictions", []):
        pred.append(f"| {r['run']} | {r['predicted_speedup']:.2f}x | {r['reported_speedup']:.2f}x | {r['error']:+.0%} "
                    f"| {r['source']} |")
    return [f"Command: `{cal['command']}`. Largest per-phase error: {worst:.1%}.", "", *out, "",
            "Predictions from that profile, 16 steps at each row's fitted median (docs/simulator.md says which "
            "features drive each error):", "", *pred]


def sim_speed_section(speed: Any) -> list[str]:
    if not speed:
        return ["_not run yet: `./run.sh bench --only sim_speed`_"]
    out = [f"Command: `python bench/sim_speed.py` (target: under {speed['target_s']:.0f} s each on this VM; "
           f"a 10M-step Python loop took {speed['python_loop_10M_s']:.2f} s just before).", "",
           "| schedule | command | wall s | simulation s | steps | virtual h |", "|---|---|---|---|---|---|"]
    for name, r in speed.items():
        if isinstance(r, dict):
            out.append(f"| {name} | `{r['command']}` | {r['seconds']:.1f} | {r['simulation_s']:.1f} | {r['steps']} "
                       f"| {r['virtual_s'] / 3600:.1f} |")
    return out


def plan_section(plan: Any) -> list[str]:
    if not plan:
        return ["_not run yet: `./run.sh bench --only plan`_"]
    rows = plan["compare"]["rows"]
    sp = plan["speed"]
    out = [f"Speed: `{sp['command']}` (400 steps x 512 prompts x 16 responses = 3.3M responses on 128 modelled "
           f"GPUs): **{sp['simulation_s']:.0f} s** of simulation, {sp['seconds']:.0f} s for the whole command "
           f"(imports, trace export). The VM's speed drifts (the same 400 steps took 59-85 s over one session); "
           f"a 10M-step Python loop took {sp['python_loop_10M_s']:.2f} s just before this run.", "",
           f"Command: `{plan['compare']['command']}`", "",
           "| run | total (50 steps) | samples/s | trainer idle | rollout idle | lag mean/max | partial |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['label']} | {r['total_s'] / 3600:.1f} h | {r['samples_per_s']:.1f} | {r['trainer_idle']:.2f} "
                   f"| {r['rollout_idle']:.2f} | {r['version_lag_mean']:.2f}/{r['version_lag_max']:.0f} "
                   f"| {r['partial_ratio']:.2f} |")
    _bar_plot("plan128.png", [r["label"] for r in rows], [r["total_s"] / 3600 for r in rows], "hours for 50 steps")
    return [*out, "", "![plan](img/plan128.png)"]


def long_tail_sim_section(data: Any) -> list[str]:
    if not data:
        return ["_not run yet: `./run.sh bench --only long_tail_sim`_"]
    head = ["| setting | variant | step s | gen s | reward s | reward s, 1 pool | old_lp s | train h | speed-up "
            "| aborted tokens | resp. len | TP |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def rows(key: str) -> list[str]:
        out = []
        for res in data["settings"]:
            where = f"{res['setting']}, {res['max_response'] // 1024}K, {res['gpus']} GPUs"
            for r in res[key]:
                tp = "/".join(map(str, r["tp_sizes"])) or str(r["rollout_tp"])
                old_lp = "–" if r["old_log_prob_s"] is None else f"{r['old_log_prob_s']:.1f}"
                out.append(f"| {where} | {r['variant']} | {r['step_s']:.1f} | {r['gen_s']:.1f} | {r['reward_s']:.1f} "
                           f"| {r['reward_shared_pool_s']:.1f} "
                           f"| {old_lp} | {r['train_s'] / 3600:.2f} | {r['speedup']:.2f}× "
                           f"| {r['aborted_token_share']:.1%} | {r['response_length_mean']:.0f} | {tp} |")
        return out

    return [f"Command: `{data['command']}` ({data['steps']} steps per run; the whole script took "
            f"{data['seconds']:.0f} s). Variants are cumulative; speed-up = colocated's train time / the variant's; "
            "`reward s`: the reward still waited for after generation (without the scheduler the batch is scored "
            "on every rollout server's pool at once); `reward s, 1 pool`: the same if every response queued for one "
            "shared pool of the workers (a reward service of that size). "
            "Assumptions:", "", *[f"- {a}" for a in data["assumptions"]], "", *head, *rows("rows"), "",
            "Diagnostics (speed-up still vs the colocated row above): the same variants without the profile's "
            "~40 s fixed cost per log-prob pass (carried over from the H20 calibration, paid once per batch), and "
            "tail batching + reward scheduler at twice the rollout TP, fixed (the planner keeps the configured TP "
            "when nothing preempts). Details in [long_tail_bench.md](long_tail_bench.md).", "", *head,
            *rows("diagnostics")]


def long_tail_cpu_section(data: Any) -> list[str]:
    if not data:
        return ["_not run yet: `./run.sh bench --only long_tail_cpu`_"]

    def sp(stat: dict[str, float] | None, digits: int = 1) -> str:
        if not stat:
            return "–"
        mean, lo, hi = (f"{stat[k]:.{digits}f}" for k in ("mean", "min", "max"))
        return mean if lo == hi else f"{mean} ({lo}-{hi})"

    lt = data["longtail"]
    base = lt[0]["train_s"]["mean"]
    out = [f"Command: `{data['command']}`; mean (min-max) of {data['args']['repeats']} runs per configuration, "
           f"alternating. Load: `{data['uptime_before']}` before, `{data['uptime_after']}` after (the bench itself "
           "keeps both cores busy; a 1-min load above 1 *before* means other work ran: rerun on an idle machine). "
           "The scores are not a learning result: the tiny model was never taught the long-tail task.", "",
           "| configuration | gen s/step | old_lp + update s/step | end-to-end s | speed-up | final val score |",
           "|---|---|---|---|---|---|"]
    train = lambda r: sum(r[k]["mean"] for k in ("old_log_prob_s", "update_actor_s") if r[k])  # noqa: E731
    out += [f"| {r['config']} | {sp(r['gen_s'], 2)} | {train(r):.2f} "
            f"| {sp(r['train_s'])} | {base / r['train_s']['mean']:.2f}× "
            f"| {sp(r['final_val_score'], 3)} |" for r in lt]
    out += ["", "| code rewards | gen s/step | reward s/step after gen | reward hidden | end-to-end s |",
            "|---|---|---|---|---|"]
    out += [f"| {r['config']} | {sp(r['gen_s'], 2)} | {sp(r['reward_s'], 2)} | {sp(r['hidden_ratio'], 2)} "
            f"| {sp(r['train_s'])} |" for r in data["code"]]
    return out


def _spread(stat: dict[str, float] | None, unit: str = " s", digits: int = 2, scale: float = 1.0) -> str:
    """"1.04 s (0.96-1.27)": median (min-max) over the repeats, each value times `scale`."""
    if not stat:
        return "–"
    med, lo, hi = (f"{stat[k] * scale:.{digits}f}" for k in ("median", "min", "max"))
    return f"{med}{unit}" if lo == hi else f"{med}{unit} ({lo}-{hi})"


DISK_FAULTS = {"tmpfs_model_weights": "a tmpfs fills during model.safetensors",
               "tmpfs_optimizer_state": "a tmpfs fills during actor_state.pt (torch.save)",
               "enospc_in_atomic_write": "ENOSPC from the checkpoint's own writes (as the unit test)"}


def faults_section(data: Any) -> list[str]:
    if not data:
        return ["_not run yet: `./run.sh bench --only faults`_"]
    s, parts, cfg = data["summary"], data["parts"], data["config"]
    runs = [r for part in ("sigterm", "sigkill") for rs in parts.get(part, {}).values() for r in rs]
    runs += parts.get("reward_mid_run", {}).get("raises", [])
    exact = sum(r["ledger"]["twice"] == r["ledger"]["lost"] == r["ledger"]["extra"] == 0
                and r["ledger"]["same_as_uninterrupted"] is not False for r in runs if "ledger" in r)
    loads = ", ".join(f"{part} {v:.2f}" for part, v in data["load"].items() if isinstance(v, float) and part != "after")
    problems = [f"- {part}: {text}" for part, texts in data["problems"].items() for text in texts]
    return [f"Command: `{data['command']}` (median (min-max) of {cfg['repeats']} repeats; each scenario a separate "
            "`asyncrl train` on the arithmetic task, 8 prompts x 4 responses per step, `num_threads=1`; 1-min load "
            f"when each part started: {loads}). Resumed runs checked: {exact} of {len(runs)} trained every prompt "
            "exactly once (colocated and one-step-off: the same (step, prompt) list as an uninterrupted run). What "
            "each fault means and the tests that cover it: [reliability.md](reliability.md).", "",
            *_fault_rows(s, parts, cfg), "", *_busy_loop_rows(s.get("reward_pool")), "",
            "Problems found:" if problems else "Problems found: none.", *problems]


def _fault_rows(s: dict[str, Any], parts: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    out = ["| fault | what happens | cost: median (min-max) |", "|---|---|---|"]
    for pipeline, runs in parts.get("sigterm", {}).items():
        t, first = s[f"sigterm/{pipeline}"], runs[0]
        out.append(f"| SIGTERM after update {first['logged_at_signal']}, {pipeline} | exit {first['exit_code']}, "
                   f"checkpoint of update {first['checkpoint_step']} | signal → checkpoint "
                   f"{_spread(t['checkpointed_s'])}, → exit {_spread(t['exit_s'])}; prompts generated again on "
                   f"resume: {_spread(t['prompts_redone'], '', 0)} (handed out "
                   f"{_spread(t['outstanding_prompts'], '', 0)}, finished groups kept "
                   f"{_spread(t['restored_groups'], '', 0)}) |")
    for pipeline in parts.get("sigkill", {}):
        k, c = s[f"sigkill/{pipeline}"], s[f"checkpoint/{pipeline}"]
        out.append(f"| SIGKILL after update {cfg['kill_at']}, {pipeline}, `trainer.save_freq={cfg['save_freq']}` "
                   f"| resumes from the last scheduled checkpoint | updates lost: {_spread(k['updates_lost'], '', 0)};"
                   f" a save takes {_spread(c['save_s'], ' s', 3)}, {_spread(c['mb'], ' MB', 1)} |")
    for pipeline in PIPELINE_ORDER:
        if st := s.get(f"startup/{pipeline}"):
            out.append(f"| resume start-up, {pipeline} | process start → first update logged (step 1 warms up) | "
                       f"resumed {_spread(st['resume'])} vs fresh {_spread(st['fresh'])} |")
    for kind, what in (("raises", "RewardError in one line, exit 2, checkpoint of the last update"),
                       ("hangs", f"each call killed at `reward.timeout_s={cfg['reward_timeout_s']:g}`, then "
                                 "RewardError as above")):
        if r := s.get(f"reward_{kind}"):
            out.append(f"| reward function {kind} from update 4 on (colocated) | {what} | "
                       f"failure → exit {_spread(r['stop_s'])} |")
    if p := s.get("reward_pool"):
        out += [f"| a reward call past its deadline ({cfg['reward_timeout_s']:g} s) | status timeout; the worker "
                f"and its children are killed | {_spread(p['hang_call_s'])}; the next call starts a worker: "
                f"{_spread(p['after_hang_call_s'], ' ms', 1, 1e3)} "
                f"(warm: {_spread(p['warm_call_s'], ' ms', 2, 1e3)}) |",
                f"| a reward worker dies mid-call | replaced, the call retried once; a second death: status error | "
                f"retried call {_spread(p['crash_once_call_s'], ' ms', 1, 1e3)}; died twice "
                f"{_spread(p['crash_call_s'], ' ms', 1, 1e3)} |",
                f"| (throughput) a trivial reward through the pool, 2 workers | – | "
                f"{_spread(p['calls_per_s_2_workers'], ' calls/s', 0)} |"]
    for name, r in parts.get("disk_full", {}).items():
        if "skipped" not in r:
            left = ", ".join(r["partial"]) or "none"
            out.append(f"| full disk: {DISK_FAULTS.get(name, name)} | exit {r['exit_code']}: `{r['last_line'][:90]}…` "
                       f"| partial dirs left: {left}; {r['newest']} loads: {r['newest_loads']} |")
    return out


def trainer_section(run: tuple[dict[str, Any], list[dict[str, Any]]] | None, device: str) -> list[str]:
    """One run of bench/trainer_throughput.py: a row per configuration, skipped ones with why."""
    if run is None:
        return [f"_not run yet on {device}: `python bench/trainer_throughput.py --device {device}`_"]
    meta, rows = run
    w = meta["workload"]
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    out = [f"Command: `{meta['command']}` ({meta['device']}, torch {meta['torch']}): {w['rows']} rows, "
           f"{w['real_tokens']:,} real tokens (median row {w['row_tokens_median']:.0f}, "
           f"longest {w['row_tokens_max']}).", "",
           "| configuration | tokens/s | step s | forward / backward / optimizer s | MFU (verl) | MFU (executed) "
           "| TFLOP/s executed | peak GiB | micro-batch tokens | attention |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ran":
            out.append(f"| {r['config']} | {r['status']}: {r['reason']} | | | | | | | | |")
            continue
        split = " / ".join(f"{r[k]:.3f}" for k in ("forward_s_median", "backward_s_median", "optimizer_s_median"))
        memory = r.get("peak_memory_gb", r.get("peak_rss_gb"))
        out.append(f"| {r['config']} | {r['tokens_per_s']:,.0f} | {r['step_s_median']:.3f} | {split} | "
                   f"{pct(r['mfu_verl'])} | {pct(r['mfu_executed'])} | {r['tflops_executed']:.2f} | {memory:.2f} | "
                   f"{r['micro_batch_tokens']} | {r['attention_path']} |")
    return out


def _busy_loop_rows(p: dict[str, Any] | None) -> list[str]:
    if not p:
        return []
    out = ["A fixed CPU loop in the trainer's process (python: 3M-step generator sum; torch: 200 x "
           "`tanh(x @ a) * 0.5` on 64x64, one thread), alone and beside two busy-looping rewards:", "",
           "| loop | alone | 2 rewards in pool processes | 2 rewards in threads (the old runner) |",
           "|---|---|---|---|"]
    for loop in ("python", "torch"):
        alone = p[f"{loop}_loop_s/alone"]["median"]
        cells = [f"{_spread(p[f'{loop}_loop_s/{tag}'], ' ms', 1, 1e3)}, "
                 f"{p[f'{loop}_loop_s/{tag}']['median'] / alone:.1f}×"
                 for tag in ("2_busy_reward_processes", "2_busy_reward_threads")]
        out.append(f"| {loop} | {_spread(p[f'{loop}_loop_s/alone'], ' ms', 1, 1e3)} | {cells[0]} | {cells[1]} |")
    return out


def _bar_plot(name: str, names: list[str], values: list[float], ylabel: str, second: list[float] | None = None,
              labels: tuple[str, str] = ("", "")) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots need the bench environment
        return
    IMG.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = range(len(names))
    width = 0.4 if second else 0.7
    ax.bar([x - (width / 2 if second else 0) for x in xs], values, width, label=labels[0] or None)
    if second:
        ax.bar([x + width / 2 for x in xs], second, width, label=labels[1])
        ax.legend()
    ax.set_xticks(list(xs), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(IMG / name, dpi=100)
    plt.close(fig)


def sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """A page's preamble and its (`## ` heading, whole section) pairs, in order."""
    head, *rest = ("\n" + text).split("\n## ")
    return head[1:], [(part.split("\n", 1)[0], "## " + part) for part in rest]


def merge(generated: str, existing: str) -> str:
    """The page: the preamble and sections this report writes, each in place of the existing
    section of the same heading (new ones at the end); every other existing section kept where it is.

    Example: existing "A ## x(old) ## notes", generated "A ## x(new)" -> "A ## x(new) ## notes"."""
    preamble, own = sections(generated)
    fresh = dict(own)
    kept = [fresh.pop(h, body) for h, body in sections(existing)[1]]
    body = "\n".join(part.rstrip("\n") + "\n" for part in [*kept, *fresh.values()])
    return preamble.rstrip("\n") + "\n\n" + body


def main() -> None:
    sim = load("sim_vs_measured")
    parts = [
        "# Benchmarks", "",
        "Generated by `./run.sh bench` (`bench/run_all.py` → `bench/report.py`) from `bench/results/*.json`;",
        "rerun it to regenerate every number and plot. Machine: the 2-core project VM, no GPU, torch 2.13.0+cpu.",
        "Each CPU figure is one run on an otherwise idle machine: expect ±10% run to run.", "",
        "## Pipelines side by side (tiny model, long-tail workload, same 512 trained responses)", "",
        "`longtail` task with `rollout.length_from_prompt=true` (lognormal lengths, median ≈50, cap 256),",
        "16 prompts × 4 responses per step, 8 steps. Colocated uses both cores per phase; the decoupled",
        "pipelines give one core to rollout and one to training. Wall = sum of `timing_s/step`.", "",
        *pipelines_section(load("pipelines"), sim), "",
        "## The simulator's predictions for those runs", "", *sim_section(sim), "",
        "## Peer: TRL GRPOTrainer on the same model, task, group size and lengths (CPU)", "",
        *peer_section(load("vs_trl")), "",
        "## Engine vs HF generate; weight sync vs the memory-copy bound", "",
        *engine_section(load("engine"), load("weight_sync")), "",
        "## Simulator calibration: SPEC §6 colocated rows (Qwen2.5-Math-7B, H20, DAPO, n=16, 512 prompts)", "",
        *calibration_section(load("calibration")), "",
        "## Simulator speed: the 400-step, 128-GPU schedules", "",
        *sim_speed_section(load("sim_speed")), "",
        "## Planning 128 GPUs with the simulator (64 rollout + 64 trainer GPUs, every mode)", "",
        *plan_section(load("plan")), "",
        "## Faults: what a stop, a kill, a failing reward or a full disk costs (tiny model)", "",
        *faults_section(load("faults")), "",
        "## Long-tail remedies (RollPacker) in the simulator: 7B/14B/32B on 16/32/64 H800-class GPUs", "",
        *long_tail_sim_section(load("long_tail_sim")), "",
        "## Long-tail remedies on this CPU (tiny model, real engine)", "",
        *long_tail_cpu_section(load("long_tail_cpu")), "",
        *TRAINER_TEXT, "", *trainer_section(last_run("trainer_throughput_cpu"), "cpu"), "",
        *trainer_section(last_run("trainer_throughput"), "cuda"), "",
    ]
    page = ROOT / "docs/benchmarks.md"
    page.write_text(merge("\n".join(parts), page.read_text() if page.exists() else ""))


if __name__ == "__main__":
    main()
