"""A real run's checkpoints (tiny model, GAE: actor and critic) read back without trusting them:
a pickle payload planted in any file a resume reads never runs, whether the manifest gives it
away (the run falls back) or was rewritten to vouch for it (the run refuses in one line); pickles
planted beside a new checkpoint are never opened; a damaged newest checkpoint resumes from the
previous one, exactly; zeroed or NaN weights are refused; the old format is refused until
`asyncrl convert-checkpoint` rewrites it, and then resumes to the same state."""

from __future__ import annotations

import asyncio
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.errors import CheckpointError
from asyncrl.pipelines import pipeline_module
from asyncrl.pipelines.checkpoint import load_checkpoint, load_checkpoint_state
from asyncrl.pipelines.context import RunContext
from asyncrl.pipelines.manifest import MANIFEST, damage, write_manifest
from asyncrl.pipelines.rundir import prepare_run
from asyncrl.state_io import load_state
from tests.pipelines.helpers import make_context, read_jsonl, run_pipeline
from tests.pipelines.test_manifest import flip_middle_byte
from tests.test_state_io import Payload

RUN = ["trainer.val_before_train=false", "trainer.test_freq=0", "rollout.n=2", "actor.ppo_mini_batch_size=2",
       "data.train_batch_size=2", "data.max_response_length=16", "trainer.save_freq=1",
       "algorithm.adv_estimator=gae", "trainer.total_training_steps=2", "data.val_size=2"]
READ_AT_RESUME = ("state.json", "pipeline.json", "trainer.json", "actor/model.safetensors", "actor/actor_state.json",
                  "actor/actor_state.safetensors", "critic/critic_state.json", "critic/critic_state.safetensors")
OLD_FILES = {"pipeline.json": "pipeline.pkl", "actor/actor_state.json": "actor/actor_state.pt",
             "critic/critic_state.json": "critic/critic.pt"}


@pytest.fixture(scope="module")
def trained(tiny_cache, tmp_path_factory) -> tuple[Path, list[dict]]:
    """A run of two updates with a checkpoint after each, and its metrics."""
    out = tmp_path_factory.mktemp("trained")
    return out, run_pipeline(out, *RUN)


@pytest.fixture(scope="module")
def loader(trained, tmp_path_factory) -> RunContext:
    """A run's context (same config, its own directory) to load checkpoints into, as a resume does."""
    return make_context(tmp_path_factory.mktemp("loader"), *RUN, "trainer.resume_mode=disable")


def copy_run(trained: tuple[Path, list[dict]], dst: Path) -> Path:
    shutil.copytree(trained[0], dst, ignore=shutil.ignore_patterns("run.lock"))
    return dst


def resume(ctx: RunContext, out: Path, log=lambda _: None) -> Path:
    """What a resume of `out` does: pick and verify a checkpoint, then load it."""
    _, path = prepare_run(load_config(None, [f"trainer.output_dir={out}", *RUN]), log)
    assert path is not None
    asyncio.run(load_checkpoint(ctx, path))
    return path


def plant(path: Path, marker: Path) -> None:
    """A payload that creates `marker` when loaded: as `torch.save` writes it for `.pt`, else a bare pickle."""
    if path.suffix == ".pt":
        torch.save(Payload(marker), path)
    else:
        path.write_bytes(pickle.dumps(Payload(marker)))


def test_a_payload_in_any_file_a_resume_reads_never_runs(trained, loader, tmp_path):
    out = copy_run(trained, tmp_path / "run")
    newest, marker = out / "checkpoints" / "global_step_2", tmp_path / "ran"
    refused = []
    for rel in READ_AT_RESUME:  # the manifest rewritten to vouch for the payload: the loaders see it
        original = (newest / rel).read_bytes()
        plant(newest / rel, marker)
        write_manifest(newest)
        try:
            assert resume(loader, out) == newest
        except CheckpointError as exc:
            assert "\n" not in str(exc) and (rel in str(exc) or "global_step_2" in str(exc)), exc
            refused.append(rel)
        (newest / rel).write_bytes(original)
    assert not marker.exists() and refused == list(READ_AT_RESUME)
    write_manifest(newest)
    plant(newest / MANIFEST, marker)  # the manifest itself: damage, the previous checkpoint is resumed
    said: list[str] = []
    assert resume(loader, out, said.append).name == "global_step_1" and len(said) == 1 and MANIFEST in said[0]
    assert not marker.exists()


def test_pickles_planted_beside_a_new_checkpoint_are_never_opened(trained, loader, tmp_path):
    out = copy_run(trained, tmp_path / "run")
    newest, marker = out / "checkpoints" / "global_step_2", tmp_path / "ran"
    for name in OLD_FILES.values():
        plant(newest / name, marker)
    assert resume(loader, out) == newest and loader.step == 2
    assert not marker.exists()
    torch.load(newest / "actor" / "actor_state.pt", weights_only=False)  # what the old loader did
    assert marker.exists()


@pytest.mark.parametrize("value", [0.0, float("nan")])
def test_weights_zeroed_or_not_finite_are_refused_at_load(trained, loader, tmp_path, value):
    out = copy_run(trained, tmp_path / "run")
    newest = out / "checkpoints" / "global_step_2"
    weights = load_file(newest / "actor" / "model.safetensors")
    save_file({k: torch.full_like(t, value) for k, t in weights.items()}, newest / "actor" / "model.safetensors")
    write_manifest(newest)  # damage its checksums cannot see (the trainer wrote it so)
    with pytest.raises(CheckpointError, match="model.safetensors: weight .* (all zero|NaN)") as info:
        resume(loader, out)
    assert "\n" not in str(info.value)


def test_a_damaged_newest_checkpoint_resumes_exactly_from_the_previous(trained, tmp_path):
    out = copy_run(trained, tmp_path / "run")
    flip_middle_byte(out / "checkpoints" / "global_step_2" / "actor" / "model.safetensors")
    said: list[str] = []
    cfg = load_config(None, [f"trainer.output_dir={out}", "trainer.logger=[jsonl]", "num_threads=1", *RUN])
    from asyncrl.pipelines.setup import build_context

    ctx = build_context(cfg, log=said.append)
    assert ctx.resume_from is not None and ctx.resume_from.name == "global_step_1"
    damaged = [line for line in said if line.startswith("warning: checkpoint")]
    assert len(damaged) == 1 and "global_step_2" in damaged[0] and "model.safetensors" in damaged[0]
    asyncio.run(pipeline_module(ctx.cfg.pipeline).run(ctx))
    again = [r for r in read_jsonl(out / "metrics.jsonl") if r["step"] == 2][-1]
    before = [r for r in trained[1] if r["step"] == 2][0]
    for key in ("critic/score/mean", "actor/pg_loss", "critic/vf_loss"):
        assert again[key] == before[key], key
    assert damage(out / "checkpoints" / "global_step_2") is None


def test_the_old_format_is_refused_then_converted_once(trained, loader, tmp_path):
    out = copy_run(trained, tmp_path / "run")
    for ckpt in sorted((out / "checkpoints").glob("global_step_*")):
        make_old_format(ckpt)
    with pytest.raises(CheckpointError, match="old format.*asyncrl convert-checkpoint") as info:
        resume(loader, out)
    assert "\n" not in str(info.value)
    assert main(["convert-checkpoint", str(out)]) == 0
    newest = resume(loader, out)
    assert newest.name == "global_step_2" and not (newest / "pipeline.pkl").exists()
    converted = load_state(newest / "actor" / "actor_state.json")
    original = load_state(trained[0] / "checkpoints" / "global_step_2" / "actor" / "actor_state.json")
    assert converted["version"] == original["version"] and converted["scheduler"] == original["scheduler"]
    moments = [(a, b) for k in original["optimizer"]["state"]
               for a, b in zip(converted["optimizer"]["state"][k].values(), original["optimizer"]["state"][k].values())]
    assert moments and all(torch.equal(a, b) for a, b in moments)
    assert load_checkpoint_state(newest)["pipeline"] == load_checkpoint_state(trained[0] / "checkpoints" /
                                                                              "global_step_2")["pipeline"]


def make_old_format(ckpt: Path) -> None:
    """What a checkpoint looked like before format 2: pickles, no manifest."""
    for new, old in OLD_FILES.items():
        state = load_state(ckpt / new)
        (ckpt / new).unlink()
        (ckpt / new).with_suffix(".safetensors").unlink(missing_ok=True)
        if old.endswith(".pkl"):
            (ckpt / old).write_bytes(pickle.dumps(state))
        else:
            torch.save(state, ckpt / old)
    (ckpt / MANIFEST).unlink()
