"""The Python API for TRL users (`asyncrl.Trainer`): GRPOConfig names and dotted keys become the
config, TRL-format rows become a verl-layout file, TRL reward functions score a real run."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api import Trainer, driver_host, function_spec
from asyncrl.config.load import load_train_config
from asyncrl.config.schema import Config
from asyncrl.data.dataset import load_rows
from asyncrl.data.tasks import make_task
from asyncrl.errors import ConfigError, DataError
from asyncrl.rewards.batch_functions import trl_arguments
from asyncrl.rewards.driver_calls import RemoteFunction
from tests.trl_rewards import pid_reward


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # datasets go to the session's cache (conftest), runs to tmp_path


def exact(prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """A module-level TRL reward function: importable by name."""
    return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]


def test_grpo_config_names_and_dotted_keys_make_the_config() -> None:
    trainer = Trainer(reward_funcs=exact, train_dataset=[{"prompt": "1+1=", "answer": "2"}], learning_rate=1e-5,
                      num_generations=4, max_completion_length=12, beta=0.04, config={"actor.ppo_epochs": 2})
    cfg = trainer.cfg
    assert (cfg.actor.lr, cfg.rollout.n, cfg.data.max_response_length, cfg.actor.ppo_epochs) == (1e-5, 4, 12, 2)
    assert (cfg.actor.use_kl_loss, cfg.actor.kl_loss_coef, cfg.actor.kl_loss_type) == (True, 0.04, "k3")
    assert cfg.reward.functions == ("tests.test_api:exact",)  # importable: named, runs in any process
    with pytest.raises(ConfigError, match=r"GRPOConfig\(num_generation=...\): .* did you mean num_generations\?"):
        Trainer(train_dataset=[{"prompt": "x"}], num_generation=4)


def test_a_lambda_is_served_from_this_process_to_workers_elsewhere() -> None:
    fn = lambda prompts, completions, **_: [0.5] * len(prompts)  # noqa: E731 - the case under test
    assert function_spec(fn).startswith("driver:") and function_spec(pid_reward) == "tests.trl_rewards:pid_reward"
    local = Trainer(reward_funcs=[fn, pid_reward], train_dataset=[{"prompt": "x"}])
    assert local.cfg.reward.functions[0].startswith("driver:") and "@" not in local.cfg.reward.functions[0]
    served = Trainer(reward_funcs=fn, train_dataset=[{"prompt": "x"}], config={"backend": "processes"})
    spec = served.cfg.reward.functions[0]
    assert spec.startswith("driver:") and "@127.0.0.1:" in spec  # the driver's address, for a worker
    assert RemoteFunction(spec)(prompts=["a", "b"], completions=["c", "d"]) == [0.5, 0.5]  # over the socket


def test_the_driver_serves_on_loopback_unless_ray_may_span_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert driver_host("processes") == driver_host("ray") == "127.0.0.1"  # asyncrl's own Ray: this node alone
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.2")
    assert driver_host("ray") == "10.0.0.2"


def test_rows_keep_their_format_and_columns() -> None:
    rows = [{"prompt": "3+4=", "answer": "7"}, {"prompt": [{"role": "user", "content": "2+3?"}], "answer": "5"}]
    trainer = Trainer(reward_funcs=exact, train_dataset=rows)
    loaded = load_rows(trainer.cfg.data.train_files[0])
    assert (loaded[0].text, loaded[0].messages) == ("3+4=", ())  # TRL's standard format: raw text
    assert loaded[1].messages == ({"role": "user", "content": "2+3?"},) and loaded[1].text == ""
    assert trl_arguments(loaded, ["7", "5"])["answer"] == ["7", "5"]
    assert Trainer(reward_funcs=exact, train_dataset=rows).cfg.data.train_files == trainer.cfg.data.train_files
    with pytest.raises(DataError, match="train_dataset: row 0 has no 'prompt' column"):
        Trainer(train_dataset=[{"question": "x"}])
    with pytest.raises(DataError, match=r"column 'blob': bytes is not JSON-serialisable"):
        Trainer(train_dataset=[{"prompt": "x", "blob": b"\x00"}])


def test_the_same_model_gets_the_same_defaults_however_its_path_is_spelled() -> None:
    """verl's defaults follow the model (issue 27): the Python API's `model=`, our key, verl's key, a
    trailing slash; only the tiny toy keeps asyncrl's own."""
    rows = [{"prompt": "1+1=", "answer": "2"}]
    api = Trainer(model="/models/qwen", train_dataset=rows).cfg
    files = f"data.train_files=[{api.data.train_files[0]}]"
    spellings = [load_train_config(None, [f"{key}={path}", files]) for key, path in (
        ("model.path", "/models/qwen"), ("actor_rollout_ref.model.path", "/models/qwen"),
        ("actor_rollout_ref.model.path", "/models/qwen/"))]

    def unpathed(cfg: Config) -> Config:
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=""))

    assert all(unpathed(cfg) == unpathed(api) for cfg in spellings)
    a = api.actor
    assert (a.lr, a.weight_decay, api.data.max_response_length, api.rollout.val_n) == (1e-6, 0.01, 512, 1)
    tiny = Trainer(model="tiny", train_dataset=rows).cfg
    assert unpathed(tiny) == unpathed(load_train_config(None, ["actor_rollout_ref.model.path=tiny", files]))
    assert tiny.actor.lr != api.actor.lr  # the toy's own defaults


def test_a_trl_quickstart_script_runs_with_its_imports_changed(tiny_cache: Path, tmp_path: Path,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    """`from trl import ...` became `from asyncrl import ...`; nothing else changed. The reward function
    reads TRL's completion_ids and trainer_state; report_to="none" keeps console and metrics.jsonl."""
    from asyncrl import GRPOConfig, GRPOTrainer

    seen: list[tuple[list[list[int]], int]] = []

    def reward_len(completions: list[str], completion_ids: list[list[int]], trainer_state: Any,
                   **kwargs: Any) -> list[float]:
        seen.append((completion_ids, trainer_state.global_step))
        return [-abs(6 - len(ids)) for ids in completion_ids]

    dataset = [{"prompt": f"{i}+{i}="} for i in range(8)]
    args = GRPOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                      num_generations=4, max_completion_length=8, max_steps=2, logging_steps=1, report_to="none",
                      run_name="quickstart", push_to_hub=False)
    trainer = GRPOTrainer(model="tiny", reward_funcs=reward_len, args=args, train_dataset=dataset)
    assert (trainer.cfg.data.train_batch_size, trainer.cfg.actor.ppo_mini_batch_size) == (2, 2)
    out = trainer.train()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "critic/score/mean" in m] == [1, 2]
    assert len(seen) == 2 and len(seen[0][0]) == 8 and all(1 <= len(ids) <= 8 for ids in seen[0][0])
    assert [s[1] for s in seen] == [0, 1] and not (out / "tensorboard").exists()
    err = capfd.readouterr().err
    assert "step 2/2: critic/score/mean" in err  # the console stays
    assert "done: 2 steps in " in err and f"outputs in {out}" in err


def test_a_grpo_config_left_at_its_defaults_trains_like_asyncrl_train() -> None:
    from peft import LoraConfig

    from asyncrl import GRPOConfig, GRPOTrainer

    rows = [{"prompt": "1+1="}]
    plain = GRPOTrainer("tiny", exact, args=GRPOConfig(), train_dataset=rows).cfg
    assert plain == Trainer(reward_funcs=exact, train_dataset=rows).cfg
    lora = GRPOTrainer("tiny", exact, train_dataset=rows, peft_config=LoraConfig(r=4, lora_alpha=8,
                                                                                 target_modules=["q_proj", "v_proj"]))
    assert (lora.cfg.model.lora_rank, lora.cfg.model.lora_alpha, lora.cfg.model.target_modules) == (
        4, 8, ("q_proj", "v_proj"))


def test_a_model_directory_among_reward_funcs_is_the_learned_reward_model(tmp_path: Path) -> None:
    rows = [{"prompt": "x"}]
    both = Trainer(reward_funcs=[exact, str(tmp_path)], reward_weights=[1.0, 0.5], train_dataset=rows).cfg.reward
    assert (both.functions, both.model_path, both.model_weight, both.rule_weight) == (
        ("tests.test_api:exact",), str(tmp_path), 0.5, 1.0)
    alone = Trainer(reward_funcs="org/reward-model", train_dataset=rows).cfg.reward
    assert (alone.functions, alone.model_path, alone.rule_weight) == ((), "org/reward-model", 0.0)  # TRL: the model
    with pytest.raises(ConfigError, match="reward_weights: 1 weights for 2 reward_funcs"):
        Trainer(reward_funcs=[exact, str(tmp_path)], reward_weights=[1.0], train_dataset=rows)


@pytest.mark.slow
def test_trl_reward_functions_score_a_run_in_processes(tmp_path: Path) -> None:
    """backend=processes: the closure runs here, in the driver (it fills `seen` in this process); the
    importable function in the reward pool, a process of the rollout worker's process."""
    seen: list[dict[str, Any]] = []

    def right(prompts: list[Any], completions: list[Any], answer: list[str], **columns: Any) -> list[float]:
        seen.append({"prompts": prompts, "completions": completions, "answer": answer, "pid": os.getpid(), **columns})
        return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]

    pids = tmp_path / "pids.txt"
    rows = [{"prompt": list(r.messages), "answer": r.ground_truth, "pid_log": str(pids)}
            for r in make_task("arithmetic", 16)]
    out = Trainer(reward_funcs=[right, pid_reward], train_dataset=rows, max_steps=1, num_generations=4,
                  max_completion_length=8, output_dir=str(tmp_path / "run"), report_to=["jsonl"],
                  config={"backend": "processes", "data.train_batch_size": 4, "actor.ppo_mini_batch_size": 4,
                          "trainer.test_freq": 0, "trainer.val_before_train": False, "num_threads": 1,
                          "rollout.num_cpus": 1, "trainer.num_cpus": 1}).train()
    assert out == tmp_path / "run"
    assert len(seen) == 1 and len(seen[0]["prompts"]) == 16  # once per step's batch: 4 prompts x 4 responses
    assert {s["pid"] for s in seen} == {os.getpid()}  # the closure: in the driver
    pool = [tuple(map(int, line.split())) for line in pids.read_text().splitlines()]
    assert len(pool) == 1 and all(os.getpid() not in pair for pair in pool)  # neither the driver nor its child
    assert seen[0]["completions"][0][0]["role"] == "assistant" and seen[0]["prompts"][0][0]["role"] == "user"
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "critic/score/mean" in m] == [1]
    expected = sum(float(c[0]["content"].strip() == a) for c, a in zip(seen[0]["completions"], seen[0]["answer"]))
    assert metrics[0]["critic/score/mean"] == pytest.approx(expected / 16, abs=1e-12)
