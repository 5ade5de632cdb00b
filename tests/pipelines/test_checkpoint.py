"""Checkpoints are atomic, complete and pruned; run directories and resume are explicit; the
sample ledger rolls back; a stop request ends a wait. Fast: a scripted trainer, no model."""

from __future__ import annotations

import asyncio
import errno
import json
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from asyncrl.config import load_config
from asyncrl.data import PromptIterator
from asyncrl.data.tasks import make_task
from asyncrl.errors import ConfigError
from asyncrl.pipelines.checkpoint import (
    COMPLETE,
    CheckpointError,
    latest_checkpoint,
    load_checkpoint_state,
    save_checkpoint,
)
from asyncrl.pipelines.ledger import SampleLedger
from asyncrl.pipelines.rundir import prepare_run
from asyncrl.pipelines.stopping import StopControl, Stopped


class ScriptedTrainer:
    """Writes a weights file; `fail_with` makes the next save raise mid-write (a full disk)."""

    def __init__(self) -> None:
        self.saves = 0
        self.fail_with: Exception | None = None

    async def save(self, path: Path) -> None:
        (path / "actor").mkdir(parents=True)
        (path / "actor" / "model.safetensors").write_bytes(b"w" * 100)
        if self.fail_with is not None:
            raise self.fail_with
        self.saves += 1


def fake_ctx(out: Path, keep: int = 0) -> SimpleNamespace:
    prompts = PromptIterator(make_task("arithmetic", 10), 2, seed=0)
    cfg = load_config(None, [f"trainer.max_ckpt_to_keep={keep}"])
    return SimpleNamespace(output_dir=out, resume_from=None, trainer=ScriptedTrainer(), tokenizer=None, cfg=cfg,
                           synchronizer=SimpleNamespace(version=0, behind=False), step=0, trained=0, prompts=prompts,
                           pipeline_state=lambda: {"queue": ["a group"]})


def save_at(ctx: SimpleNamespace, step: int) -> Path:
    ctx.step = step
    return asyncio.run(save_checkpoint(ctx))


def test_a_checkpoint_is_complete_and_holds_the_outstanding_prompts(tmp_path):
    ctx = fake_ctx(tmp_path)
    in_flight = ctx.prompts.next_batch()
    path = save_at(ctx, 3)
    assert latest_checkpoint(tmp_path) == path and (path / COMPLETE).exists()
    state = load_checkpoint_state(path)
    assert state["step"] == 3 and state["prompts"]["outstanding"] == [r.uid for r in in_flight]
    assert state["pipeline"] == {"queue": ["a group"]}
    assert (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert not list((tmp_path / "checkpoints").glob(".*"))


def test_a_full_disk_keeps_the_last_complete_checkpoint(tmp_path):
    ctx = fake_ctx(tmp_path)
    good = save_at(ctx, 2)
    ctx.trainer.fail_with = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(CheckpointError, match="step 4.*No space left on device.*global_step_2"):
        save_at(ctx, 4)
    assert latest_checkpoint(tmp_path) == good
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "global_step_2", "latest_checkpointed_iteration.txt"]


def test_a_full_disk_inside_a_library_writer_is_a_checkpoint_error(tmp_path):
    ctx = fake_ctx(tmp_path)
    good = save_at(ctx, 2)
    ctx.trainer.fail_with = RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos")  # torch.save
    with pytest.raises(CheckpointError, match="step 4.*RuntimeError.*unexpected pos.*MB free.*global_step_2"):
        save_at(ctx, 4)
    assert latest_checkpoint(tmp_path) == good and not list((tmp_path / "checkpoints").glob(".*"))


def test_a_save_cut_short_is_never_taken_for_a_checkpoint(tmp_path):
    ctx = fake_ctx(tmp_path)
    good = save_at(ctx, 2)
    torn = tmp_path / "checkpoints" / "global_step_5"  # a kill between the weights and the marker
    (torn / "actor").mkdir(parents=True)
    (torn / "state.json").write_text(json.dumps({"step": 5}))
    assert latest_checkpoint(tmp_path) == good


def test_retention_deletes_old_checkpoints_only_after_a_newer_one_is_complete(tmp_path):
    ctx = fake_ctx(tmp_path, keep=2)
    for step in (1, 2, 3):
        save_at(ctx, step)
    ctx.trainer.fail_with = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(CheckpointError):
        save_at(ctx, 4)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("global_step_*")) == [
        "global_step_2", "global_step_3"]


def test_the_checkpoint_a_run_resumed_from_is_never_rewritten(tmp_path):
    ctx = fake_ctx(tmp_path)
    first = save_at(ctx, 5)
    assert save_at(ctx, 5) == first and ctx.trainer.saves == 2  # this run's own: rewritten (e.g. at a stop)
    resumed = fake_ctx(tmp_path)
    resumed.resume_from = first
    assert save_at(resumed, 5) == first and resumed.trainer.saves == 0


def test_no_output_dir_gives_a_new_directory_per_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["trainer.experiment_name=exp"])
    a, resume_a = prepare_run(cfg)
    Path(a.trainer.output_dir).mkdir(parents=True)
    b, _ = prepare_run(cfg)
    assert resume_a is None and a.trainer.output_dir != b.trainer.output_dir
    assert Path(a.trainer.output_dir).parent == Path("outputs") and "exp-" in a.trainer.output_dir


def test_resume_is_explicit_and_refuses_a_changed_config(tmp_path):
    from asyncrl.config import dump_config

    cfg = load_config(None, [f"trainer.output_dir={tmp_path}"])
    dump_config(cfg, tmp_path / "config.yaml")
    path = save_at(fake_ctx(tmp_path), 2)
    assert prepare_run(cfg)[1] == path
    assert prepare_run(load_config(None, [f"trainer.output_dir={tmp_path}", "trainer.resume_mode=disable"]))[1] is None
    longer = load_config(None, [f"trainer.output_dir={tmp_path}", "trainer.total_training_steps=99"])
    assert prepare_run(longer)[1] == path  # how long to run may change
    changed = [f"trainer.output_dir={tmp_path}", "actor.lr=0.5", "rollout.n=3"]
    with pytest.raises(ConfigError, match=r"actor.lr: 0.0002 -> 0.5; rollout.n: 8 -> 3.*allow_config_change"):
        prepare_run(load_config(None, changed))
    said: list[str] = []
    assert prepare_run(load_config(None, [*changed, "trainer.allow_config_change=true"]), said.append)[1] == path
    assert "actor.lr" in said[0]


def test_resume_from_a_checkpoint_path_writes_into_its_run(tmp_path):
    path = save_at(fake_ctx(tmp_path / "run"), 2)
    cfg, resume = prepare_run(load_config(None, [f"trainer.resume_mode={path}"]))
    assert resume == path and Path(cfg.trainer.output_dir) == tmp_path / "run"
    with pytest.raises(ConfigError, match="trainer.resume_mode"):
        prepare_run(load_config(None, [f"trainer.resume_mode={tmp_path}"]))


def test_the_ledger_rolls_back_to_the_checkpoint(tmp_path):
    from asyncrl.types import Group, Trajectory

    rows = make_task("arithmetic", 3)
    ledger = SampleLedger(tmp_path / "samples.jsonl")
    for step, row in enumerate(rows, start=1):
        traj = Trajectory(f"{row.uid}/0", row.prompt_ids, [1], [0.0], [step], "stop")
        ledger.record([Group(uid=row.uid, row=row, trajectories=[traj])], step, version=step)
    ledger.close()
    with (tmp_path / "samples.jsonl").open("a") as f:
        f.write('{"step": 4, "prom')  # a line cut by a kill
    ledger = SampleLedger(tmp_path / "samples.jsonl")
    assert ledger.rollback(2) == 2
    ledger.close()
    assert [json.loads(x)["prompt"] for x in (tmp_path / "samples.jsonl").read_text().splitlines()] == [
        rows[0].uid, rows[1].uid]


def test_a_stop_request_ends_a_wait_for_samples():
    async def main() -> None:
        stop = StopControl(timeout_s=60, log=lambda _: None)
        never = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, stop.request, signal.SIGTERM)
        with pytest.raises(Stopped) as info:
            await stop.race(never)
        assert info.value.exit_code == 143 and never.cancelled()
        assert await stop.race(asyncio.sleep(0, "ready")) == "ready"  # a finished wait still returns

    asyncio.run(main())


def test_a_second_signal_or_an_overdue_stop_exits_at_once(monkeypatch):
    exits: list[int] = []
    monkeypatch.setattr("asyncrl.pipelines.stopping.os._exit", exits.append)

    async def main() -> None:
        stop = StopControl(timeout_s=0.05, log=lambda _: None)
        stop.request(signal.SIGTERM)
        assert exits == [] and stop.requested
        stop.request(signal.SIGINT)
        assert exits == [128 + signal.SIGINT]
        await asyncio.sleep(0.2)  # nobody stopped within stop_timeout_s
        assert exits == [128 + signal.SIGINT, 128 + signal.SIGTERM]

    asyncio.run(main())
