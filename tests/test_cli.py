"""The `asyncrl` command's errors: one line naming the fix and exit 2 for a user's mistake, one line
and exit 1 for anything else, the traceback only with --debug. No test here trains: each command
fails in the config or in preflight."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import pytest

from asyncrl import cli
from asyncrl.errors import RewardError


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_missing_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "nope.yaml"]) == 2
    assert one_error_line(capsys) == "asyncrl: error: config file nope.yaml not found"


def test_malformed_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.yaml").write_text("rollout:\n  n: 4\n bad: [\n")
    assert cli.main(["train", "run.yaml"]) == 2
    assert one_error_line(capsys).startswith("asyncrl: error: config file run.yaml is not valid YAML at line 3, "
                                             "column 2")


def test_nan_learning_rate(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "actor.lr=nan"]) == 2
    assert one_error_line(capsys) == "asyncrl: error: actor.lr=nan is not a finite number: set actor.lr > 0"


def test_unwritable_output_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as root: a 0o500 directory is writable anyway")
        assert cli.main(["train", f"trainer.output_dir={locked}/run"]) == 2
    finally:
        locked.chmod(0o700)
    assert "trainer.output_dir=" in one_error_line(capsys)


def test_output_dir_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("")
    assert cli.main(["train", "trainer.output_dir=afile/run"]) == 2
    line = one_error_line(capsys)
    assert line.startswith("asyncrl: error: trainer.output_dir='afile/run': ") and "is a file" in line


def test_missing_data_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "model.path=tiny", "data.train_files=[train.parquet]"]) == 2
    assert one_error_line(capsys) == "asyncrl: error: data.train_files: train.parquet not found"


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str], where: str) -> None:
    argv = ["--debug", "train", "actor.lr=nan"] if where == "before" else ["train", "actor.lr=nan", "--debug"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ConfigError" in err
    assert err.splitlines()[-1] == "asyncrl: error: actor.lr=nan is not a finite number: set actor.lr > 0"


def raising(exc: BaseException):
    """A command that fails with `exc`, in place of train/sim/config."""
    def command(args: list[str]) -> int:
        raise exc
    return command


@pytest.mark.parametrize(("exc", "needle"), [
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "weights.bin"),
     "no such file or directory: weights.bin"),
    (PermissionError(errno.EACCES, "Permission denied", "/data/train.parquet"),
     "permission denied: /data/train.parquet"),
    (OSError(errno.ENOSPC, "No space left on device", "outputs/run/ckpt.pt"),
     "no space left on device writing outputs/run/ckpt.pt: free space or set trainer.output_dir on another disk"),
])
def test_the_outside_worlds_errors_are_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                               exc: BaseException, needle: str) -> None:
    monkeypatch.setattr(cli, "show_config", raising(exc))
    assert cli.main(["config"]) == 2
    assert one_error_line(capsys) == f"asyncrl: error: {needle} (run with --debug for the traceback)"


def test_a_tokenizer_error_from_transformers_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    def from_transformers(args: list[str]) -> int:
        code = "raise OSError(\"Can't load tokenizer for 'm'.\\nMake sure 'm' is the correct path.\")"
        exec(compile(code, "tokenization_utils_base.py", "exec"), {"__name__": "transformers.tokenization_utils_base"})
        return 0

    monkeypatch.setattr(cli, "show_config", from_transformers)
    assert cli.main(["config"]) == 2
    assert one_error_line(capsys) == ("asyncrl: error: Can't load tokenizer for 'm'. Make sure 'm' is the correct "
                                      "path. (check model.path) (run with --debug for the traceback)")


def test_a_multi_line_error_of_ours_prints_its_first_line(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "show_config", raising(RewardError("6 of 8 rewards failed\nTraceback ...\n  boom")))
    assert cli.main(["config"]) == 2
    assert one_error_line(capsys) == ("asyncrl: error: 6 of 8 rewards failed "
                                      "(run with --debug for the full message)")


def test_an_unexpected_error_is_internal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "show_config", raising(KeyError("step")))
    assert cli.main(["config"]) == 1
    assert one_error_line(capsys) == ("asyncrl: internal error: KeyError: 'step' "
                                      "(run with --debug for the traceback)")


@pytest.mark.parametrize("command", ["train", "sim", "config", "eval", "convert-checkpoint"])
def test_every_command_has_help_listing_the_config_groups(capsys: pytest.CaptureFixture[str], command: str) -> None:
    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: asyncrl {command} ")
    groups = [("rollout.*", "Generation."), ("actor.*", "Policy optimisation."),
              ("pipeline", "One of: colocated, one_step_off, fully_async.")]
    for group, doc in groups:
        assert any(line.split()[:1] == [group] and doc in line for line in out.splitlines()), group
    assert "--log-level" in out


def test_top_level_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"    {c} " in out for c in ("train", "sim", "config", "eval", "convert-checkpoint"))


def test_log_level_warning_silences_progress_and_run_messages(capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny simulated run: at INFO the progress lines and the summary line come on stderr; at
    WARNING none of them (the results table stays on stdout)."""
    args = ["sim", "sim.profile=cpu-tiny", "trainer.total_training_steps=3", "trainer.logger=[console]",
            "trainer.output_dir=simrun"]
    assert cli.main(["--log-level", "INFO", *args]) == 0
    loud = capsys.readouterr()
    assert "step 3/3:" in loud.err and "simulated 3 steps" in loud.err
    assert cli.main([*args[:-1], "trainer.output_dir=simrun2", "--log-level=warning"]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and quiet.out.splitlines()[0] == loud.out.splitlines()[0]  # the table's header


def test_backend_ray_without_ray_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert cli.main(["train", "backend=ray", "trainer.output_dir=run"]) == 2
    assert one_error_line(capsys) == ("asyncrl: error: backend=ray needs Ray, which is not installed: "
                                      "pip install 'asyncrl[ray]' (or set backend=local)")


@pytest.mark.parametrize("logger", ["wandb", "mlflow", "swanlab"])
def test_a_logger_without_its_package_names_the_extra_and_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, logger: str) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == logger else find_spec(name, *a))
    assert cli.main(["train", f"trainer.logger=[console,{logger}]", "trainer.output_dir=run"]) == 2
    fix = f"pip install 'asyncrl[{logger}]', or drop {logger} from trainer.logger"
    line = f"asyncrl: error: trainer.logger={logger}: the {logger} package is not installed; {fix}"
    assert one_error_line(capsys) == line
    assert not (tmp_path / "run").exists()


def test_a_verl_recipe_sized_in_gpus_names_trainer_device_on_a_machine_without_cuda(
        capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the recipe would run on it")
    assert cli.main(["train", "actor_rollout_ref.model.path=tiny", "trainer.n_gpus_per_node=8"]) == 2
    line = one_error_line(capsys)
    assert "trainer.device=cuda but torch sees no CUDA device" in line and "set trainer.device=cpu" in line


def test_a_verl_command_line_without_its_model_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "actor_rollout_ref.rollout.n=4"]) == 2
    assert "without actor_rollout_ref.model.path" in one_error_line(capsys)


def test_ctrl_c_while_a_worker_thread_builds_ends_the_process_at_once(tmp_path: Path) -> None:
    """The first Ctrl-C stops: a build still running in a non-daemon thread is not waited for."""
    import subprocess
    import sys
    import time

    script = ("import threading, time\nfrom asyncrl import cli\n"
              "def train(args):\n    threading.Thread(target=time.sleep, args=(60,)).start()\n"
              "    raise KeyboardInterrupt\n"
              "cli.train = train\nraise SystemExit(cli.main(['train']))\n")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50,
                          cwd=Path(__file__).parents[1])
    assert (done.returncode, done.stderr.strip()) == (130, "asyncrl: interrupted")
    assert time.perf_counter() - start < 30  # not the 60 s of the thread


def test_the_start_line_names_the_run_directory() -> None:
    from asyncrl.config import load_config
    from asyncrl.config.keys import settings_line
    from asyncrl.pipelines.rundir import with_run_dir

    cfg = with_run_dir(load_config(None, ["trainer.experiment_name=exp"]))
    assert cfg.trainer.output_dir.startswith("outputs/exp-") and not Path(cfg.trainer.output_dir).exists()
    assert settings_line(cfg).endswith(f"; run directory {cfg.trainer.output_dir}")
    resumed = dataclasses.replace(cfg.trainer, output_dir="", resume_mode="ckpt/global_step_2")
    assert with_run_dir(dataclasses.replace(cfg, trainer=resumed)).trainer.output_dir == ""  # the checkpoint's run
