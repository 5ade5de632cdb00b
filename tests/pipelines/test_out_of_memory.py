"""CUDA running out of memory stops a run with one line naming the keys to lower, and the newest
complete checkpoint intact: `torch.cuda.OutOfMemoryError` injected into a real `asyncrl train`
(tiny model, CPU) in the update's micro-batch, in the old log-prob pass, and in the rollout
engine's step, once step 1's checkpoint is complete."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from asyncrl import cli
from asyncrl.pipelines.checkpoint import latest_checkpoint, load_checkpoint_state
from asyncrl.rollout.runner import StepRunner

pytestmark = pytest.mark.slow

RUN = ["trainer.val_before_train=false", "trainer.test_freq=0", "trainer.save_freq=1", "trainer.total_training_steps=2",
       "data.train_batch_size=2", "rollout.n=2", "actor.ppo_mini_batch_size=2", "trainer.logger=[jsonl]",
       "num_threads=1"]
TORCH_SAYS = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB."
KEYS = ("actor.ppo_micro_batch_tokens", "actor.log_prob_micro_batch_tokens", "rollout.gpu_memory_utilization",
        "model.enable_gradient_checkpointing=true")


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def out_of_memory_after_step_1(out: Path, before: dict[str, dict[str, bytes]],
                               when: Callable[[], bool] = lambda: True) -> Callable[..., Any]:
    """A replacement that raises torch's CUDA out-of-memory error once step 1's checkpoint is
    complete (and `when()`), keeping that checkpoint's files in `before` as they were then."""
    step_1 = out / "checkpoints" / "global_step_1"

    def fail(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if (step_1 / "COMPLETE").exists() and when():
                before.setdefault("step_1", files(step_1))
                raise torch.cuda.OutOfMemoryError(TORCH_SAYS)
            return original(*args, **kwargs)
        return call
    return fail


def train_until_out_of_memory(out: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> str:
    """`asyncrl train`'s exit status 2 and its one error line."""
    assert cli.main(["train", f"trainer.output_dir={out}", *RUN, *overrides]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("asyncrl: error")]
    assert len(errors) == 1, err
    return errors[0]


@pytest.mark.parametrize("where, grad, extra, first", [
    ("the update", True, (), "actor.ppo_micro_batch_tokens (now 8192)"),
    ("the forward-only passes", False, ("actor.old_log_probs=recompute",),
     "actor.log_prob_micro_batch_tokens (now 16384)"),
], ids=["update", "log_prob_pass"])
def test_the_trainer_running_out_is_one_line_and_keeps_the_checkpoint(tiny_cache, tmp_path, monkeypatch, capsys,
                                                                      where, grad, extra, first):
    before: dict[str, dict[str, bytes]] = {}
    fail = out_of_memory_after_step_1(tmp_path, before, lambda: torch.is_grad_enabled() == grad)
    monkeypatch.setattr(LlamaForCausalLM, "forward", fail(LlamaForCausalLM.forward))  # the trainer's model
    line = train_until_out_of_memory(tmp_path, capsys, *extra)
    assert line.startswith(f"asyncrl: error: out of device memory in {where}")
    assert "(tried to allocate 2.00 GiB)" in line
    assert line.index(first) < line.index("rollout.gpu_memory_utilization")
    assert all(key in line for key in KEYS), line
    # nothing saved inside the update: step 1's checkpoint is the newest and unchanged, byte for byte
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "global_step_1"
    assert files(tmp_path / "checkpoints" / "global_step_1") == before["step_1"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()) == ["global_step_1"]


def test_the_engine_running_out_is_one_line_and_keeps_the_checkpoint(tiny_cache, tmp_path, monkeypatch, capsys):
    before: dict[str, dict[str, bytes]] = {}
    monkeypatch.setattr(StepRunner, "run", out_of_memory_after_step_1(tmp_path, before)(StepRunner.run))
    line = train_until_out_of_memory(tmp_path, capsys)
    assert line.startswith("asyncrl: error: out of device memory in the rollout engine's step (tried to allocate")
    assert line.index("rollout.gpu_memory_utilization (now 0.5)") < line.index("actor.ppo_micro_batch_tokens")
    assert all(key in line for key in KEYS), line
    # a failure outside an update checkpoints the last finished one: step 1 again, the same weights
    newest = latest_checkpoint(tmp_path)
    assert newest == tmp_path / "checkpoints" / "global_step_1" and load_checkpoint_state(newest)["step"] == 1
    weights = "actor/model.safetensors"
    assert files(newest)[weights] == before["step_1"][weights]
