"""Checkpoints are verified against their manifest at resume: a damaged newest one is named in
one line, set aside, and the previous complete one is resumed; none left is refused naming them
all; a checkpoint named outright is refused if damaged; the old pickle format is refused naming
`asyncrl convert-checkpoint`. Fast: the scripted trainer of test_checkpoint, no model."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.errors import CheckpointError
from asyncrl.pipelines.checkpoint import checkpoint_root, latest_checkpoint, load_checkpoint_state
from asyncrl.pipelines.manifest import MANIFEST, damage, resume_point
from asyncrl.pipelines.rundir import prepare_run
from tests.pipelines.test_checkpoint import fake_ctx, save_at


def flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garble_json(path: Path) -> None:
    """The same size, no longer JSON: a brace in the middle."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] = ord("}") if data[len(data) // 2] != ord("}") else ord("{")
    path.write_bytes(bytes(data))


DAMAGE: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "one_byte_in_the_middle": ("actor/model.safetensors", flip_middle_byte, "differs from its manifest"),
    "truncated_safetensors": ("actor/model.safetensors", truncate, "has 50 bytes, its manifest says 100"),
    "garbled_state_json": ("state.json", garble_json, "state.json differs from its manifest"),
    "deleted_weights": ("actor/model.safetensors", Path.unlink, "actor/model.safetensors is missing"),
    "garbled_manifest": (MANIFEST, garble_json, "manifest.json is "),
}


def two_checkpoints(out: Path) -> tuple[Path, Path]:
    ctx = fake_ctx(out)
    return save_at(ctx, 2), save_at(ctx, 4)


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_in_one_line(tmp_path, kind):
    older, newest = two_checkpoints(tmp_path)
    rel, spoil, said = DAMAGE[kind]
    spoil(newest / rel)
    lines: list[str] = []
    cfg, resume = prepare_run(load_config(None, [f"trainer.output_dir={tmp_path}"]), lines.append)
    assert resume == older and load_checkpoint_state(resume)["step"] == 2
    assert len(lines) == 1 and "global_step_4" in lines[0] and said in lines[0] and "\n" not in lines[0]
    aside = newest.parent / "global_step_4.damaged"
    assert not newest.exists() and (aside / rel).exists() is (kind != "deleted_weights")
    assert latest_checkpoint(tmp_path) == older


def test_every_checkpoint_damaged_is_refused_naming_them(tmp_path):
    older, newest = two_checkpoints(tmp_path)
    flip_middle_byte(older / "actor" / "model.safetensors")
    (newest / "state.json").unlink()
    with pytest.raises(CheckpointError) as info:
        resume_point(checkpoint_root(tmp_path), lambda _: None)
    message = str(info.value)
    assert "global_step_4 (state.json is missing)" in message and "global_step_2 (actor/model.safetensors" in message
    assert "trainer.resume_mode=disable" in message and "\n" not in message


def test_a_damaged_checkpoint_named_outright_is_refused_naming_the_previous(tmp_path):
    older, newest = two_checkpoints(tmp_path)
    truncate(newest / "actor" / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"global_step_4 is damaged.*trainer.resume_mode={older}"):
        prepare_run(load_config(None, [f"trainer.resume_mode={newest}"]))
    assert newest.exists()  # named by the user: left where it is


def test_an_intact_checkpoint_passes_and_extra_files_are_not_damage(tmp_path):
    _, newest = two_checkpoints(tmp_path)
    (newest / "notes.txt").write_text("added after the save")
    assert damage(newest) is None
    manifest = json.loads((newest / MANIFEST).read_text())
    assert set(manifest["files"]) == {"actor/model.safetensors", "pipeline.json", "state.json"}


def test_the_old_pickle_format_is_refused_naming_the_converter(tmp_path):
    _, newest = two_checkpoints(tmp_path)
    (newest / MANIFEST).unlink()
    (newest / "pipeline.pkl").write_bytes(pickle.dumps({"queue": []}))
    with pytest.raises(CheckpointError) as info:
        prepare_run(load_config(None, [f"trainer.output_dir={tmp_path}"]))
    assert f"asyncrl convert-checkpoint {newest}" in str(info.value) and "\n" not in str(info.value)


def test_a_manifest_naming_files_outside_the_checkpoint_is_damage(tmp_path):
    _, newest = two_checkpoints(tmp_path)
    manifest = json.loads((newest / MANIFEST).read_text())
    manifest["files"]["../../config.yaml"] = {"size": 1, "sha256": "0" * 64}
    (newest / MANIFEST).write_text(json.dumps(manifest))
    assert "unreadable" in (damage(newest) or "")
