"""The real pipelines on the modelled cluster: every pipeline and mode runs, loses no sample,
keeps its staleness bound, and writes the same metrics and trace a real run writes."""

import json
import statistics

import pytest

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.errors import ConfigError
from asyncrl.sim.compare import compare, modes
from asyncrl.sim.run import simulate

SMALL = ["data.train_batch_size=32", "actor.ppo_mini_batch_size=8", "rollout.n=4", "data.max_response_length=4096",
         "rollout.tensor_model_parallel_size=2", "rollout.nnodes=1", "rollout.n_gpus_per_node=8",
         "trainer.nnodes=1", "trainer.n_gpus_per_node=8", "trainer.total_training_steps=4", "trainer.test_freq=2",
         "trainer.logger=[jsonl]", "sim.length_median=300", "data.val_size=8"]
MODES = modes(load_config(None, SMALL))  # (b)-(d) sync every 4 updates here
VARIANTS = {"colocated": "pipeline=colocated", **MODES}


def run(tmp_path, extra: str):
    cfg = load_config(None, [*SMALL, *extra.split(), f"trainer.output_dir={tmp_path}"])
    summary = simulate(cfg, log=lambda _: None)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return cfg, summary, [r for r in rows if "timing_s/step" in r]


@pytest.mark.parametrize("label", list(VARIANTS))
def test_every_pipeline_and_mode_trains_every_sample(tmp_path, label):
    cfg, summary, steps = run(tmp_path, VARIANTS[label])
    assert sum(r["training/responses"] for r in steps) == 32 * 4 * 4  # prompts x n x steps, none lost
    assert summary.total_s > 0 and summary.samples_per_s > 0
    assert 0 <= summary.trainer_idle <= 1 and 0 <= summary.rollout_idle <= 1
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert {e["name"] for e in trace["traceEvents"]} >= {"gen", "train", "sync"}
    assert any("val/score/mean" in json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines())


def test_staleness_is_what_each_pipeline_promises(tmp_path):
    _, colocated, _ = run(tmp_path / "c", "pipeline=colocated")
    _, one_step, steps = run(tmp_path / "o", "pipeline=one_step_off")
    _, on_policy, _ = run(tmp_path / "a", MODES["fully_async (a)"])
    _, stale, _ = run(tmp_path / "s", MODES["fully_async (c)"])
    _, partial, _ = run(tmp_path / "d", MODES["fully_async (d)"])
    assert colocated.version_lag_max == 0 and on_policy.version_lag_max == 0
    assert all(r["staleness/version_lag_mean"] == (0 if r["training/global_step"] == 1 else 1) for r in steps)
    assert stale.version_lag_max <= 1  # threshold 0.5 < 1: at most one version behind
    assert partial.partial_ratio > 0 and stale.partial_ratio == 0


def test_a_strict_lag_cap_holds_in_the_simulator_too(tmp_path):
    _, summary, _ = run(tmp_path, MODES["fully_async (d)"] + " async_training.max_version_lag=0")
    assert summary.version_lag_max == 0


def test_more_rollout_gpus_shorten_a_generation_bound_run(tmp_path):
    few = run(tmp_path / "few", "pipeline=one_step_off rollout.n_gpus_per_node=2")[1]
    many = run(tmp_path / "many", "pipeline=one_step_off rollout.n_gpus_per_node=8")[1]
    assert many.total_s < few.total_s


def test_gpu_profile_needs_gpus_and_a_dividing_tp(tmp_path):
    with pytest.raises(ConfigError, match="trainer.n_gpus_per_node"):
        simulate(load_config(None, [f"trainer.output_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match="tensor_model_parallel_size"):
        simulate(load_config(None, [*SMALL, "rollout.tensor_model_parallel_size=3", f"trainer.output_dir={tmp_path}"]))


def test_cli_compare_writes_a_table(tmp_path, capsys):
    assert main(["sim", *SMALL, f"trainer.output_dir={tmp_path}", "--compare", "modes"]) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + len(VARIANTS) and "fully_async (d)" in table
    assert "sync cycle of T = trigger_parameter_sync_step" in table
    assert len(json.loads((tmp_path / "compare.json").read_text())) == len(VARIANTS)


def test_bad_profile_name_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="sim.profile"):
        simulate(load_config(None, [*SMALL, "sim.profile=no-such", f"trainer.output_dir={tmp_path}"]))


LAG_CAP = "pipeline=fully_async async_training.trigger_parameter_sync_step=1 async_training.staleness_threshold=2.0 " \
          "async_training.max_version_lag=1"
"""The rollouter may run 3 versions ahead, the cap allows 1: some groups would pass it."""


def test_the_lag_cap_drops_stale_groups_and_regenerates_their_prompts(tmp_path):
    _, summary, steps = run(tmp_path, LAG_CAP + " async_training.version_lag_policy=drop")
    dropped = steps[-1]["fully_async/count/dropped_stale"]
    assert dropped > 0
    assert summary.version_lag_max <= 1
    ledger = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(ledger) == 32 * 4 and len({s["prompt"] for s in ledger}) == 32 * 4  # regenerated, not lost
    trained = statistics.fmean(x for s in ledger for x in s["lengths_G"])
    assert steps[-1]["fully_async/dropped/response_length_mean"] > trained  # dropping removes the long ones


def test_the_paced_lag_cap_trains_every_group_it_started(tmp_path):
    _, summary, steps = run(tmp_path, LAG_CAP)  # version_lag_policy=pace, the default
    assert steps[-1]["fully_async/count/dropped_stale"] == 0 and summary.version_lag_max <= 1
    ledger = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(ledger) == 32 * 4 and len({s["prompt"] for s in ledger}) == 32 * 4
    assert all(uid.endswith(f"@a{i + 1}") for i, uid in enumerate(sorted(
        (s["uid"] for s in ledger), key=lambda u: int(u.rsplit("@a", 1)[1]))))  # each prompt started once


def test_the_in_flight_cap_binds_and_loses_nothing(tmp_path):
    # 4 engines (8 GPUs at TP 2); the staleness budget alone would let 48 prompts start per version
    _, _, free = run(tmp_path / "free", MODES["fully_async (c)"])
    cap = " async_training.max_concurrent_samples_per_server=1"
    _, _, capped = run(tmp_path / "capped", MODES["fully_async (c)"] + cap)
    assert capped[-1]["fully_async/static/max_concurrent_samples"] == 4
    assert capped[-1]["rollouter/peak_in_flight"] == 4 < free[-1]["rollouter/peak_in_flight"]
    assert free[-1]["fully_async/static/max_concurrent_samples"] == 64  # verl's default: 16 per server
    assert sum(r["training/responses"] for r in capped) == 32 * 4 * 4


def test_fully_async_steps_are_sync_cycles_and_stale_counters_accumulate(tmp_path):
    _, summary, steps = run(tmp_path, MODES["fully_async (c)"])  # T = 4: 16 updates, 4 syncs
    assert (summary.steps, summary.updates) == (4, 16)
    per_update = sum(r["timing_s/update_actor"] for r in steps) / 16
    assert summary.phases["update_actor"] == pytest.approx(4 * per_update, rel=1e-9, abs=1e-9)
    samples = [r["fully_async/count/stale_samples_processed"] for r in steps]
    trajectories = [r["fully_async/count/stale_trajectory_processed"] for r in steps]
    assert samples == sorted(samples) and trajectories == sorted(trajectories) and samples[-1] > 0
    assert trajectories[-1] >= 4 * samples[-1]  # a stale group's 4 responses are all stale
    assert summary.stale_samples == samples[-1]
    assert [r["fully_async/count/current_param_version"] for r in steps] == [(r["training/global_step"] - 1) // 4
                                                                             for r in steps]


def test_partial_rollout_with_threshold_zero_runs_with_nothing_to_interrupt(tmp_path):
    _, summary, steps = run(tmp_path, MODES["fully_async (b)"] + " async_training.partial_rollout=true")
    assert sum(r["training/responses"] for r in steps) == 32 * 4 * 4
    assert summary.partial_ratio == 0 and summary.version_lag_max == 0


def test_the_run_plan_is_logged_once_saved_and_what_the_run_did(tmp_path):
    """The start line and plan.json carry the numbers the run then follows: the updates recorded
    are the plan's, for a pipeline that counts updates differently from steps (fully async)."""
    extra = "pipeline=fully_async async_training.trigger_parameter_sync_step=1"
    cfg = load_config(None, [*SMALL, *extra.split(), f"trainer.output_dir={tmp_path}"])
    lines: list[str] = []
    simulate(cfg, log=lines.append)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert (plan["prompts_per_update"], plan["total_prompts"], plan["updates"]) == (8, 128, 16)
    assert [line for line in lines if line.startswith("plan: ")] == [
        "plan: fully_async, 128 prompts = 16 updates x 8, 1 mini-batch(es) per update, 16 optimizer steps, "
        "at most 8 prompts started per version, old log-probs: rollout, micro-batches of 8192 tokens (default), "
        "16384 forward-only, precision float32, layers eager"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("training/global_step", 0) for r in rows) == plan["updates"]
    assert (tmp_path / "config.yaml").is_file()  # beside the config it came from


def test_a_long_simulated_run_traces_its_end_within_the_event_budget(tmp_path):
    """16 steps of 128 responses in a 1,500-event trace: every update is there, per-sample spans
    are sampled (stride > 1, said in otherData) and reach the last update, whose trained
    samples still have their flow arrows into it."""
    run(tmp_path, "pipeline=one_step_off trainer.total_training_steps=16 sim.trace_max_events=1500")
    trace = json.loads((tmp_path / "trace.json").read_text())
    events = trace["traceEvents"]
    assert sum(e["ph"] != "M" for e in events) <= 1500 and trace["otherData"]["sampling"]["stride"] > 1
    train = sorted((e for e in events if e["name"] == "train"), key=lambda e: e["ts"])
    assert [e["args"]["step"] for e in train] == list(range(1, 17))
    last = train[-1]
    assert any(e["ph"] == "f" and e["tid"] == last["tid"] and last["ts"] <= e["ts"] <= last["ts"] + last["dur"]
               for e in events)


MULTI_TURN = ["rollout.multi_turn.enable=true", "rollout.multi_turn.max_assistant_turns=4"]


@pytest.mark.parametrize("label", ["colocated", "one_step_off", "fully_async (d)"])
def test_every_pipeline_runs_episodes_and_trains_each_once(tmp_path, label):
    cfg, summary, steps = run(tmp_path, " ".join([VARIANTS[label], *MULTI_TURN]))
    assert sum(r["training/responses"] for r in steps) == 32 * 4 * 4
    assert summary.turns == 4 and steps[-1]["sim/prefilled_tokens"] > 0
    ledger = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(ledger) == 32 * 4 and len({s["prompt"] for s in ledger}) == 32 * 4
    if label == "fully_async (d)":  # episodes stopped by a sync continue under the new version
        assert summary.partial_ratio > 0


def test_fully_async_hides_most_of_the_tool_time_colocated_waits_for(tmp_path):
    """Tool results of 0 tokens (the same tokens to train): colocated waits for each batch's
    slowest episode's tool calls; fully async (d) decodes other episodes meanwhile."""
    mt = " ".join([*MULTI_TURN, "sim.tool_output_tokens=0", "sim.length_median=50", "trainer.total_training_steps=8"])
    short = "sim.length_median=50 trainer.total_training_steps=8"
    extra = {label: run(tmp_path / f"{label}m", f"{VARIANTS[label]} {mt}")[1].total_s
             - run(tmp_path / f"{label}s", f"{VARIANTS[label]} {short}")[1].total_s
             for label in ("colocated", "fully_async (d)")}
    assert extra["colocated"] > 8 * 5.0  # > 5 s a step: about the slowest of 128 episodes' 3 calls
    assert 0 < extra["fully_async (d)"] < extra["colocated"] / 2


def test_cli_compare_turns_prints_the_two_speedups(tmp_path, capsys):
    assert main(["sim", *SMALL, *MULTI_TURN, f"trainer.output_dir={tmp_path}", "--compare", "turns"]) == 0
    out = capsys.readouterr().out
    runs = {s["label"]: s["total_s"] for s in json.loads((tmp_path / "compare.json").read_text())}
    assert sorted(runs) == ["colocated", "colocated, single-turn", "fully_async (d)", "fully_async (d), single-turn"]
    multi = runs["colocated"] / runs["fully_async (d)"]
    single = runs["colocated, single-turn"] / runs["fully_async (d), single-turn"]
    assert f"fully_async (d) over colocated: {multi:.2f}x with 4-turn episodes, {single:.2f}x single-turn" in out


def test_compare_turns_needs_episodes(tmp_path):
    with pytest.raises(ConfigError, match="rollout.multi_turn.enable=true"):
        compare(None, [*SMALL, f"trainer.output_dir={tmp_path}"], ["turns"])
