"""bench/protocol.py and bench/study.py: a pre-registered protocol admits only its own cells, started
after its commit, and the study summary reports the protocol's verdicts on synthetic cells."""

from __future__ import annotations

import argparse
import json
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from bench.protocol import (
    Protocol,
    ProtocolError,
    check_model,
    content_hash,
    load,
    model_key,
    ready,
    refusal,
    set_field,
    sweep_hash,
)
from bench.study import (
    cell_args,
    cells,
    run,
    secondary_cells,
    settled,
    shard,
    summarize,
    table,
    with_val_lengths,
)

BODY = {
    "study": "synthetic", "budget_cpu_hours": 1,
    "model": {"path": "tiny", "cache_key": None, "weights_sha256": None},
    "task": {"name": "longtail_partial", "keys": ["data.val_size=32"]},
    "settings": {"steps": 20, "batch": 4, "n": 8, "val_every": 10, "val_size": 256},
    "lr": 1e-4,
    "arms": [{"name": "colocated", "mode": "colocated"}, {"name": "one_step_off", "mode": "one_step_off"},
             {"name": "fa_partial", "mode": "fa_partial", "keys": ["actor.ppo_mini_batch_size=2"]},
             {"name": "stream_trainer", "mode": "stream_trainer"}],
    "control": "stream_trainer", "seeds": 6,
    "endpoint": {"score": "val/score/mean", "window_prompts": [100, 200]},
    "margin": {"rise_fraction": 0.15, "fewer_samples": None},
    "test": {"alpha": 0.05, "planned_sd": 0.02, "looks": [{"seeds": 6, "alpha": 0.05}]},
    "partial_rollout": {"min_ratio": 0.3},
}
COMMITTED = datetime(2026, 11, 29, 4, 0, tzinfo=timezone.utc)
NOISE = [0.01, -0.012, 0.004, -0.006, 0.009, -0.003]


def protocol(body: dict = BODY) -> Protocol:
    return Protocol(Path("synthetic.yaml"), body, content_hash(body), "c0ffee", COMMITTED, sweep_hash(body), "c0ffee",
                    COMMITTED)


def cell(arm: str, seed: int, shift: float, **extra: object) -> dict:
    """A finished cell whose endpoint (the mean of its validations at 100 and 200 prompts) is
    colocated's 0.5 + NOISE[seed] plus `shift`, from 0.2 before training (a rise of ~0.3)."""
    end = 0.5 + NOISE[seed % 6] + shift
    p = protocol()
    return {"arm": arm, "seed": seed, "protocol_hash": p.hash, "protocol_commit": "c0ffee",
            "started_at": (COMMITTED + timedelta(minutes=5)).isoformat(), "partial_rollout": arm == "fa_partial",
            "partial_ratio": 0.5 if arm == "fa_partial" else 0.0, "version_lag_max": 2 if arm == "fa_partial" else 0,
            "points": [{"samples": x, "score": y, "wall_s": x / 10} for x, y in ((0, 0.2), (100, end), (200, end))],
            **extra}


def study_cells() -> list[dict]:
    out = []
    for s in range(6):
        out += [cell("colocated", s, 0.0), cell("stream_trainer", s, 0.0005 * (-1) ** s),
                cell("fa_partial", s, [0.004, -0.003, 0.002, -0.005, 0.003, 0.0][s]), cell("one_step_off", s, -0.1)]
    return out


def test_a_cell_counts_only_under_its_protocol_after_its_commit() -> None:
    p = protocol()
    assert refusal(cell("colocated", 0, 0.0), p) is None
    assert "another protocol" in str(refusal({**cell("colocated", 0, 0.0), "protocol_hash": "x"}, p))
    assert "another protocol" in str(refusal({k: v for k, v in cell("colocated", 0, 0.0).items()
                                              if k != "protocol_hash"}, p))  # an exploratory cell
    early = cell("colocated", 0, 0.0, started_at=(COMMITTED - timedelta(seconds=1)).isoformat())
    assert refusal(early, p) == "started before the protocol's commit"
    assert "failed" in str(refusal({**cell("colocated", 0, 0.0), "points": [], "error": "timeout"}, p))


def test_a_partial_rollout_cell_that_never_interrupted_is_rejected() -> None:
    never = cell("fa_partial", 0, 0.0, partial_ratio=0.0, version_lag_max=1)
    assert refusal(never, protocol()) == ("partial rollout did not fire: partial_ratio 0.00 < 0.3 "
                                          "(partial_rollout.min_ratio)")
    assert refusal(cell("fa_partial", 0, 0.0, partial_ratio=0.31), protocol()) is None
    # a task without the floor, or an arm without partial rollout, is not held to it
    assert refusal(cell("colocated", 0, 0.0), protocol()) is None


def test_the_summary_reports_each_arm_as_the_protocol_defines_it() -> None:
    results = study_cells() + [cell("fa_partial", 7, 0.0, partial_ratio=0.02),
                               {**cell("colocated", 8, 0.0), "protocol_hash": "older"}]
    s = summarize(protocol(), results)
    assert s["admitted"] == 24
    assert {(r["arm"], r["seed"]) for r in s["refused"]} == {("fa_partial", 7), ("colocated", 8)}
    assert s["look"] == {"seeds": 6, "alpha": 0.05, "final": True, "open": []}
    # colocated rises from 0.2 to 0.5 + mean(NOISE) = 0.500333: margin 0.15 x 0.300333
    assert s["margin"]["margin"] == pytest.approx(0.15 * 0.3003333, rel=1e-5, abs=1e-8)
    arms = s["arms"]
    assert (arms["fa_partial"]["verdict"], arms["one_step_off"]["verdict"]) == ("equivalent", "worse")
    assert arms["stream_trainer"]["verdict"] == "equivalent"
    assert s["control"]["contains_0"] and s["control"]["no_wider_than_margin"]
    assert s["trained"]["fa_partial"]["partial_ratio"] == pytest.approx(0.5, rel=1e-12, abs=1e-12)
    assert s["trained"]["fa_partial"]["version_lag_max"] == 2
    # one arm short of the look's seeds: no verdict yet
    short = summarize(protocol(), [c for c in results if not (c["arm"] == "one_step_off" and c["seed"] == 5)])
    assert short["look"] is None and "no look reached" in short["verdicts"]


TWO_LOOKS = {**BODY, "test": {**BODY["test"], "looks": [{"seeds": 4, "alpha": 0.005}, {"seeds": 6, "alpha": 0.045}]}}
WIDE = [0.05, -0.05, 0.04, -0.04, 0.0, 0.001]  # fa_partial's shifts: too spread for a verdict at 4 seeds


def two_look_cell(arm: str, seed: int) -> dict:
    shift = {"one_step_off": -0.1, "stream_trainer": 0.0005 * (-1) ** seed, "fa_partial": WIDE[seed]}.get(arm, 0.0)
    return {**cell(arm, seed, shift), "protocol_hash": protocol(TWO_LOOKS).hash}


def test_an_arm_conclusive_at_the_interim_look_stops_there_and_the_others_go_on() -> None:
    p = protocol(TWO_LOOKS)
    interim = [two_look_cell(a["name"], s) for s in range(4) for a in BODY["arms"]]
    s = summarize(p, interim)
    assert s["look"]["seeds"] == 4 and s["look"]["open"] == ["fa_partial"]  # the others: worse, equivalent
    assert s["arms"]["fa_partial"]["verdict"] == "inconclusive" and "continue" in s["arms"]["fa_partial"]["why"]
    assert settled(p, interim) == {"one_step_off", "stream_trainer"}
    # the final look needs seeds 4-5 of colocated and fa_partial only; Holm there is over fa_partial alone
    final = interim + [two_look_cell(arm, s) for s in (4, 5) for arm in ("colocated", "fa_partial")]
    s = summarize(p, final)
    assert s["look"] == {"seeds": 6, "alpha": 0.045, "final": True, "open": []}
    assert {arm: v["look"] for arm, v in s["arms"].items()} == {"one_step_off": 4, "stream_trainer": 4, "fa_partial": 6}
    assert s["arms"]["fa_partial"]["p_holm"] == s["arms"]["fa_partial"]["p_two_sided"]
    assert s["arms"]["one_step_off"]["verdict"] == "worse"
    assert "| worse (at the 4-seed look, margin 0.045) |" in table(s)
    # each interval at its own look's level: 1 - 2 x 0.005 at the interim look, 1 - 2 x 0.045 at the final one
    assert s["arms"]["one_step_off"]["ci_level"] == pytest.approx(0.99) and "| 99%: [" in table(s)
    assert s["arms"]["fa_partial"]["ci_level"] == pytest.approx(0.91) and "| 91%: [" in table(s)
    assert s["trained"]["one_step_off"]["partial_ratio"] == 0.0  # over its 4 seeds: no seed 4 needed
    assert settled(p, final) == {"colocated", "one_step_off", "fa_partial", "stream_trainer"}


def test_the_runner_skips_the_cells_of_an_arm_whose_verdict_is_in(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.study as study

    p, ran = protocol(TWO_LOOKS), []
    monkeypatch.setattr(study, "ready", lambda p: [])
    monkeypatch.setattr(study, "check_model", lambda p: [])

    def run_cell(mode: str, task: str, seed: int, args: object) -> dict:
        ran.append((mode, seed))
        return {k: v for k, v in two_look_cell(mode, seed).items() if k not in ("protocol_hash", "protocol_commit")}

    monkeypatch.setattr(study, "run_cell", run_cell)
    run(p, tmp_path / "cells.jsonl", tmp_path, 60)
    assert ran == cells(p)[:16] + [("colocated", 4), ("fa_partial", 4), ("colocated", 5), ("fa_partial", 5)]


def rows(*means: float) -> dict:
    """A sweep table's rows for the rates 1e-4, 2e-4 and 4e-4, each with both sweep seeds."""
    return {lr: {"seeds": 2, "mean": m} for lr, m in zip(("0.0001", "0.0002", "0.0004"), means)}


def test_a_swept_arm_found_worse_reruns_at_its_own_best_rate_as_a_secondary_analysis() -> None:
    body = {**BODY, "lr_sweep": {"arms": ["colocated", "fa_partial"], "values": [1e-4, 2e-4, 4e-4],
                                 "seeds": [100, 101]}}
    p = protocol(body)

    def stamped(c: dict) -> dict:
        return {**c, "protocol_hash": p.hash}

    results = [stamped(c) for c in study_cells() if c["arm"] != "fa_partial"]
    results += [stamped(cell("fa_partial", s, -0.1)) for s in range(6)]
    sweep = {"fa_partial": rows(0.30, 0.35, 0.32)}
    s = summarize(p, results)
    assert s["arms"]["fa_partial"]["verdict"] == "worse"
    assert secondary_cells(p, s, sweep) == [("fa_partial@0.0002", "fa_partial", 2e-4, seed) for seed in range(6)]
    # at its own best rate already, not worse, or its sweep incomplete: nothing to rerun
    assert secondary_cells(p, s, {"fa_partial": rows(0.4, 0.3, 0.3)}) == []
    assert secondary_cells(p, summarize(p, [stamped(c) for c in study_cells()]), sweep) == []
    assert secondary_cells(p, s, {"fa_partial": {**rows(0.30, 0.35, 0.32), "0.0004": {"seeds": 1, "mean": 0.3}}}) == []
    rerun = [{**stamped(cell("fa_partial", seed, 0.0)), "arm": "fa_partial@0.0002", "secondary_of": "fa_partial",
              "lr": 2e-4} for seed in range(6)]
    assert summarize(p, results + rerun[:3])["secondary"] == {
        "fa_partial@0.0002": {"verdict": "running", "seeds": 3, "needs": 6}}
    s = summarize(p, results + rerun)
    assert s["secondary"]["fa_partial@0.0002"]["verdict"] == "equivalent"
    assert s["arms"]["fa_partial"]["verdict"] == "worse"  # the primary verdict stands
    assert "| fa_partial@0.0002 (secondary) | 0.500 | +0.000 |" in table(s)


def test_an_arm_found_worse_that_the_sweep_did_not_cover_is_swept_then_rerun_at_its_best(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.study as study
    import bench.sweep as sweep

    p = protocol({**BODY, "lr_sweep": {"arms": ["colocated"], "values": [1e-4, 2e-4], "seeds": [100, 101],
                                       "tuning_split": {"size": 16, "seed": 7}}})
    main, ran = {(c["arm"], c["seed"]): c for c in study_cells()}, []  # one_step_off: -0.1, "worse"

    def run_cell(mode: str, task: str, seed: int, args: argparse.Namespace) -> dict:
        ran.append((mode, args.lr, seed))
        best = args.lr == 2e-4  # one_step_off's own best rate: at par there
        c = {**cell(mode, 0, 0.05 if best else 0.0), "seed": seed} if seed >= 100 else \
            cell(mode, seed, 0.0) if best else main[(mode, seed)]
        return {k: v for k, v in c.items() if k not in ("arm", "protocol_hash", "protocol_commit")}

    for module in (study, sweep):
        monkeypatch.setattr(module, "ready", lambda p, sweep=False: [])
        monkeypatch.setattr(module, "check_model", lambda p: [])
        monkeypatch.setattr(module, "run_cell", run_cell)
    monkeypatch.setattr(sweep, "tuning_file", lambda p, runs_dir: runs_dir / "tune.jsonl")
    out = tmp_path / "study_synthetic.jsonl"
    run(p, out, tmp_path, 60)
    swept = [("one_step_off", lr, seed) for seed in (100, 101) for lr in (1e-4, 2e-4)]
    assert ran == [(arm, 1e-4, seed) for arm, seed in cells(p)] + swept + [("one_step_off", 2e-4, s) for s in range(6)]
    assert sweep.sweep_table(p, tmp_path / "study_synthetic_sweep.jsonl")["one_step_off"]["0.0002"]["seeds"] == 2
    s = summarize(p, sweep.load(out))
    assert s["arms"]["one_step_off"]["verdict"] == "worse"  # the primary verdict stands
    assert s["secondary"]["one_step_off@0.0002"]["verdict"] == "equivalent"


def test_the_summary_sets_each_arm_s_lengths_against_colocated_s() -> None:
    def lengths(c: dict, trained: float, val: float) -> dict:
        hist = {"0": [0, 4]} if c["arm"] == "fa_partial" else {"0": [4, 0]}
        ledger = {"length_mean": trained, "length_p90": 2 * trained, "lag_length_corr": 0.1, "length_hist_by_lag": hist}
        return {**c, "ledger": ledger, "points": [{**p, "length": val + p["samples"] / 100} for p in c["points"]]}

    results = [lengths(c, 110.0 if c["arm"] == "fa_partial" else 100.0, 60.0 if c["arm"] == "fa_partial" else 50.0)
               for c in study_cells()]
    s = summarize(protocol(), results)
    t = s["trained"]
    assert "| 0.50 | 2 | +10% | 1.000 | +19% |" in table(s)  # fa_partial's row: every length one bucket up
    # validation lengths over the window (100 and 200 prompts): 51 and 52 -> 51.5; fa_partial 61.5
    assert t["colocated"]["val_length_mean"] == pytest.approx(51.5, rel=1e-12)
    assert t["fa_partial"]["val_length_shift"] == pytest.approx(61.5 / 51.5 - 1, rel=1e-12)
    assert t["fa_partial"]["length_shift"] == pytest.approx(0.1, rel=1e-12)
    assert t["fa_partial"]["lag_length_corr"] == pytest.approx(0.1, rel=1e-12)
    assert (t["fa_partial"]["ks_pooled_vs_colocated"], t["stream_trainer"]["ks_pooled_vs_colocated"]) == (1.0, 0.0)
    # a cell without the validation's lengths: none reported for its arm, the others still are
    results[0] = study_cells()[0]
    assert "val_length_mean" not in summarize(protocol(), results)["trained"]["colocated"]


def test_an_arm_s_lengths_are_set_against_colocated_s_on_the_same_seeds() -> None:
    def ledger(c: dict) -> dict:
        length = 200.0 if c["arm"] == "colocated" and c["seed"] >= 4 else 100.0  # colocated's seeds 4-5 run long
        return {**c, "ledger": {"length_mean": length, "length_p90": length}}

    interim = [two_look_cell(a["name"], s) for s in range(4) for a in BODY["arms"]]
    final = interim + [two_look_cell(arm, s) for s in (4, 5) for arm in ("colocated", "fa_partial")]
    t = summarize(protocol(TWO_LOOKS), [ledger(c) for c in final])["trained"]
    # one_step_off stopped at 4 seeds: against colocated's seeds 0-3 (100), not 0-5 (133.3)
    assert t["one_step_off"]["length_shift"] == pytest.approx(0.0, abs=1e-12)
    assert t["fa_partial"]["length_shift"] == pytest.approx(100.0 / (800.0 / 6) - 1, rel=1e-12)


def test_a_recorded_cell_gets_its_validation_lengths_from_its_run(tmp_path: Path) -> None:
    rows = [{"val/score/mean": 0.2, "val/response_length/mean": 40.0}, {"timing_s/step": 1.0},
            {"timing_s/step": 1.0, "val/score/mean": 0.4, "val/response_length/mean": 30.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    old = {"dir": str(tmp_path), "settings": {"batch": 4, "n": 2},
           "points": [{"samples": 0, "score": 0.2}, {"samples": 8, "score": 0.4}]}
    assert [p["length"] for p in with_val_lengths(old)["points"]] == [40.0, 30.0]
    gone = {**old, "dir": str(tmp_path / "gone")}
    assert with_val_lengths(gone) == gone
    with pytest.raises(AssertionError, match="another run"):
        with_val_lengths({**old, "points": [{"samples": 0, "score": 0.2}, {"samples": 8, "score": 0.5}]})


def test_shards_split_the_missing_cells_between_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.study as study

    assert shard("1/2") == (1, 2)
    for bad in ("2/2", "a/2", "1"):
        with pytest.raises(argparse.ArgumentTypeError, match="I/K"):
            shard(bad)
    ran: list[tuple[str, int]] = []
    monkeypatch.setattr(study, "ready", lambda p: [])
    monkeypatch.setattr(study, "check_model", lambda p: [])
    monkeypatch.setattr(study, "run_cell", lambda mode, task, seed, args: ran.append((mode, seed)) or {"seed": seed})
    out = tmp_path / "cells.jsonl"
    out.write_text(json.dumps(cell("colocated", 0, 0.0)) + "\n")
    run(protocol(), out, tmp_path, 60, (1, 2))
    assert ran == [cells(protocol())[i] for i in range(1, 24, 2)]
    ran.clear()
    run(protocol(), out, tmp_path, 60, (0, 2))  # the recorded cell (index 0) is skipped
    assert ran == [cells(protocol())[i] for i in range(2, 24, 2)]


def test_an_arm_runs_the_protocol_settings_with_its_own_keys_last() -> None:
    from bench.convergence import overrides

    args = cell_args(protocol(), "fa_partial", Path("/tmp/x"), 60)
    keys = overrides("fa_partial", "longtail_partial", 3, args)
    assert keys[-3:] == ["data.val_size=32", "actor.ppo_mini_batch_size=2", "actor.lr=0.0001"]
    assert "data.train_batch_size=4" in keys and "rollout.total_rollout_steps=80" in keys
    assert cells(protocol())[:4] == [("colocated", 0), ("one_step_off", 0), ("fa_partial", 0), ("stream_trainer", 0)]


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_the_protocol_commit_survives_a_comment_fix_and_readiness_names_the_fixes(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(BODY))
    assert load(path).commit is None
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "p.yaml")
    git(tmp_path, "commit", "-qm", "protocol")
    first = load(path)
    assert first.commit is not None and first.hash == content_hash(BODY)
    problems = ready(first)
    assert len(problems) == 1 and "bench/protocol.py pin" in problems[0]
    path.write_text("# a comment fixed later\n" + path.read_text())
    assert any("commit" in p for p in ready(load(path)))
    git(tmp_path, "commit", "-qam", "comment")
    assert load(path).commit == first.commit  # the content, hence the protocol, did not change
    set_field(path, "cache_key", "tiny-abc")
    git(tmp_path, "commit", "-qam", "pin")
    pinned = load(path)
    assert pinned.commit != first.commit and pinned.sweep_commit == pinned.commit
    # the sweep's pick written into lr: a new protocol for the main cells, the same one for the sweep's
    set_field(path, "lr", "0.0002")
    git(tmp_path, "commit", "-qam", "lr")
    picked = load(path)
    assert picked.commit != pinned.commit and picked.hash != pinned.hash
    assert (picked.sweep_commit, picked.sweep_hash) == (pinned.sweep_commit, pinned.sweep_hash)


def test_pinning_rewrites_the_field_and_keeps_comments(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("model:\n  path: tiny\n  cache_key: null   # filled by pin\n  weights_sha256: null\n")
    set_field(path, "cache_key", "tiny-0123")
    assert path.read_text().splitlines()[2] == "  cache_key: tiny-0123   # filled by pin"
    with pytest.raises(ProtocolError, match="no line `lr:`"):
        set_field(path, "lr", "1e-4")
    # a pin made before the warm-up changed: refused from the key alone (torch never imported)
    model = {"path": "tiny-longtail", "cache_key": "tiny_longtail-000000000000", "weights_sha256": "ab"}
    assert model_key("tiny-longtail").startswith("tiny_longtail-")
    assert "the warm-up changed since the pin" in check_model(protocol({**BODY, "model": model}))[0]


def test_a_protocol_missing_a_key_or_overspending_alpha_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in BODY.items() if k != "margin"}))
    with pytest.raises(ProtocolError, match="missing margin"):
        load(path, git=False)
    looks = {**BODY["test"], "looks": [{"seeds": 3, "alpha": 0.03}, {"seeds": 6, "alpha": 0.03}]}
    path.write_text(yaml.safe_dump({**BODY, "test": looks}))
    with pytest.raises(ProtocolError, match="spend alpha 0.06"):
        load(path, git=False)
