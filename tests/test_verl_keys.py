"""verl's key names in asyncrl: the seed recipes' command lines (tests/data/verl_recipes, copied
from verl) become the config the scripts say, value by value, and run under `asyncrl sim`; the
table covers every key of verl's own config; unknown keys get hints that exist and fit."""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl import cli
from asyncrl import config as C
from asyncrl.config import load_config, resolve
from asyncrl.config.keys import leaf_keys, suggestions, value_at
from asyncrl.config.verl import NOT_MODELLED, TABLE, VERL_DEFAULTS, is_verl_key, renamed_keys
from asyncrl.config.verl_reference import BEGIN, END, key_class, reference
from asyncrl.data.dataset import write_parquet
from asyncrl.data.tasks import make_task
from asyncrl.errors import ConfigError

RECIPES = Path(__file__).parent / "data" / "verl_recipes"


def recipe_command(script: Path, env: dict[str, str]) -> tuple[str, list[str]]:
    """(the `python -m` module, its arguments) of a recipe script, with the script's own variable
    assignments substituted by bash itself: `python`/`python3` become functions printing their
    arguments, so nothing but the command line is taken from the script."""
    prelude = "python() { printf '%s\\n' \"$@\"; }; python3() { python \"$@\"; }; source \"$0\""
    out = subprocess.run(["bash", "-c", prelude, str(script)], env={"PATH": os.environ["PATH"], **env},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "-m", out[:3]
    return out[1], out[2:]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The scripts' environment: HOME in tmp (their defaults live under ~/verl), data files that
    exist (their ${TRAIN_FILE:-...} overrides, the way a user points a recipe at their data);
    runs in tmp (a recipe without trainer.default_local_dir writes to ./outputs)."""
    monkeypatch.chdir(tmp_path)
    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    write_parquet(make_task("arithmetic", 3000, seed=0, split="train"), str(train))
    write_parquet(make_task("arithmetic", 8, seed=0, split="test"), str(test))
    return {"HOME": str(tmp_path), "TRAIN_FILE": str(train), "TEST_FILE": str(test)}


def dapo(env: dict[str, str], exp: str, **more: Any) -> dict[str, Any]:
    """What the DAPO scripts (one-step-off and fully async) share."""
    home = env["HOME"]
    return {"data.train_files": (env["TRAIN_FILE"],), "data.val_files": (env["TEST_FILE"],),
            "data.max_prompt_length": 2048, "data.max_response_length": 8192,
            "algorithm.adv_estimator": "grpo", "algorithm.use_kl_in_reward": False, "algorithm.kl_ctrl.kl_coef": 0.0,
            "actor.use_kl_loss": False, "actor.kl_loss_coef": 0.0, "actor.clip_ratio_low": 0.2,
            "actor.clip_ratio_high": 0.28, "actor.clip_ratio_c": 10.0, "actor.ppo_micro_batch_tokens": 20480,
            "actor.log_prob_micro_batch_tokens": 30720,
            "model.path": f"{home}/verl/models/Qwen2.5-Math-7B", "actor.lr": 1e-6, "actor.warmup_steps": 10,
            "actor.weight_decay": 0.1, "actor.ppo_mini_batch_size": 32, "actor.entropy_coeff": 0.0,
            "actor.grad_clip": 1.0, "actor.loss_agg_mode": "token-mean", "rollout.temperature": 1.0,
            "rollout.top_p": 1.0, "rollout.top_k": -1, "rollout.val_temperature": 1.0, "rollout.val_n": 1,
            "trainer.logger": ("console", "tensorboard"), "trainer.project_name": "DAPO",
            "trainer.experiment_name": exp, "trainer.val_before_train": True, "trainer.save_freq": 0,
            "trainer.output_dir": f"{home}/verl/ckpts/DAPO/{exp}", "trainer.resume_mode": "auto",
            "model.enable_gradient_checkpointing": True, "critic.lr": 1e-5, **more}


def fully_async(env: dict[str, str], exp: str, **more: Any) -> dict[str, Any]:
    return dapo(env, exp, **{"pipeline": "fully_async", "data.train_batch_size": 32 * 4, "rollout.n": 16,
                             "async_training.trigger_parameter_sync_step": 4, "async_training.require_batches": 4,
                             "async_training.partial_rollout": True, **more})


EXPECTED = {
    "one_step_off__dapo_7b_math_fsdp2_4_12.sh": lambda env: dapo(
        env, "DAPO-Qwen2.5-7b-MATH-0527a1-fsdp2-one-step-off-4-12", **{
            "pipeline": "one_step_off", "data.train_batch_size": 512, "rollout.n": 12,
            "rollout.tensor_model_parallel_size": 2, "trainer.test_freq": 10, "trainer.total_training_steps": 100,
            "trainer.nnodes": 2, "trainer.n_gpus_per_node": 6, "rollout.nnodes": 2, "rollout.n_gpus_per_node": 2,
            "async_training.use_rollout_log_probs": True}),
    "one_step_off__grpo_0.6b_gsm8k_fsdp2_2_6.sh": lambda env: {
        "pipeline": "one_step_off", "algorithm.adv_estimator": "grpo", "data.train_files": (env["TRAIN_FILE"],),
        "data.val_files": (env["TEST_FILE"],), "data.train_batch_size": 1152, "data.max_prompt_length": 512,
        "data.max_response_length": 1024, "model.path": f"{env['HOME']}/verl/models/Qwen3-0.6B", "actor.lr": 1e-6,
        "actor.warmup_steps": -1, "actor.warmup_ratio": 0.0, "actor.weight_decay": 0.01,
        "actor.ppo_mini_batch_size": 192, "actor.ppo_micro_batch_tokens": 32 * (512 + 1024),
        "actor.log_prob_micro_batch_tokens": 32 * (512 + 1024),
        "actor.use_kl_loss": True, "actor.kl_loss_coef": 0.001, "actor.kl_loss_type": "low_var_kl",
        "actor.entropy_coeff": 0.0, "model.enable_gradient_checkpointing": True,
        "rollout.tensor_model_parallel_size": 2, "rollout.n": 5, "algorithm.use_kl_in_reward": False,
        "trainer.val_before_train": True, "trainer.logger": ("console", "tensorboard"),
        "trainer.project_name": "GRPO", "trainer.experiment_name": "GRPO-Qwen3-0.6b-gsm8k-fsdp2-one-step-off-2-6",
        "trainer.save_freq": 0, "trainer.test_freq": 5, "trainer.total_training_steps": 60, "trainer.nnodes": 1,
        "trainer.n_gpus_per_node": 6, "rollout.nnodes": 1, "rollout.n_gpus_per_node": 2,
        "rollout.val_temperature": 0.0, "rollout.val_n": 1},
    "fully_async__dapo_7b_math_fsdp2_4_12.sh": lambda env: fully_async(
        env, "DAPO-Qwen2.5-7b-MATH-0527a1-fsdp2-fully-async-4-12", **{
            "rollout.tensor_model_parallel_size": 1, "rollout.total_rollout_steps": 512 * 100,
            "trainer.test_freq": 10, "rollout.test_freq": 0, "async_training.staleness_threshold": 0.1,
            "trainer.nnodes": 2, "trainer.n_gpus_per_node": 6, "rollout.nnodes": 2, "rollout.n_gpus_per_node": 2,
            "async_training.use_rollout_log_probs": True}),
    "fully_async__dapo_7b_math_fsdp2_8_8.sh": lambda env: fully_async(
        env, "DAPO-Qwen2.5-7b-MATH-0527a1-fsdp2-fully-async-8-8", **{
            "rollout.tensor_model_parallel_size": 1, "rollout.total_rollout_steps": 512 * 100,
            "trainer.test_freq": 0, "rollout.test_freq": 10, "async_training.staleness_threshold": 0.1,
            "trainer.nnodes": 1, "trainer.n_gpus_per_node": 8, "rollout.nnodes": 1, "rollout.n_gpus_per_node": 8,
            "async_training.use_rollout_log_probs": True}),
    "fully_async__dapo_7b_math_fsdp2_64_64_mis.sh": lambda env: fully_async(
        env, "dapo_qwen2-7B-math_28k_fsdp2_fully-async_64-64", **{
            "data.max_response_length": 28 * 1024, "actor.ppo_micro_batch_tokens": (2048 + 28 * 1024) * 2,
            "actor.log_prob_micro_batch_tokens": (2048 + 28 * 1024) * 3,
            "rollout.tensor_model_parallel_size": 4, "rollout.total_rollout_steps": 512 * 400,
            "trainer.test_freq": 0, "rollout.test_freq": 20, "async_training.staleness_threshold": 0.5,
            "trainer.nnodes": 8, "trainer.n_gpus_per_node": 8, "rollout.nnodes": 8, "rollout.n_gpus_per_node": 8,
            "async_training.use_rollout_log_probs": False, "actor.off_policy_correction": "token",
            "actor.is_cap": 2.0}),
}
"""Each recipe's config, written by hand from its script (units converted where ours differ:
-1 'never' is 0, a micro-batch is tokens, fully async's train_batch_size=0 is one update's prompts)."""

NOT_MODELLED_IN_EVERY_RECIPE = ("actor_rollout_ref.rollout.name", "actor_rollout_ref.ref.fsdp_config.param_offload",
                                "actor_rollout_ref.actor.fsdp_config.param_offload")


@pytest.mark.parametrize("recipe", sorted(EXPECTED))
def test_a_recipe_becomes_the_config_its_script_says(recipe: str, env: dict[str, str],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    entry, args = recipe_command(RECIPES / recipe, env)
    with caplog.at_level(logging.WARNING, logger="asyncrl.config"):
        cfg = load_config(None, args)
    got = {key: value_at(cfg, key) for key in EXPECTED[recipe](env)}
    assert got == EXPECTED[recipe](env)
    warnings = [r.getMessage() for r in caplog.records if r.name == "asyncrl.config"]
    knobs = [w for w in warnings if w.startswith("verl engine and memory knobs with no effect here")]
    assert len(knobs) == 1 and len(warnings) <= 2, warnings  # a line per class: knobs, and what changes training
    for key in NOT_MODELLED_IN_EVERY_RECIPE:
        assert key in knobs[0]
    assert load_config(None, args, entry=entry) == cfg  # the module says the same pipeline as the keys


@pytest.mark.parametrize("recipe", sorted(EXPECTED))
def test_no_key_of_a_recipe_is_silently_dropped(recipe: str, env: dict[str, str]) -> None:
    _, args = recipe_command(RECIPES / recipe, env)
    translation = resolve(None, args)
    for arg in args:
        key = arg.partition("=")[0].lstrip("+")
        assert key in TABLE or key in leaf_keys() or key in translation.not_modelled, key
    mapped = {key for key in translation.not_modelled if key in TABLE}
    assert mapped <= {"actor_rollout_ref.actor.ulysses_sequence_parallel_size",  # values asyncrl does not have
                      "algorithm.rollout_correction.rollout_rs", "algorithm.rollout_correction.rollout_rs_threshold"}


SPEED = {"one_step_off": ["trainer.total_training_steps=2"], "fully_async": ["rollout.total_rollout_steps=256"]}
"""Only for test time: two updates instead of the recipe's hundreds."""


@pytest.mark.parametrize("recipe", sorted(EXPECTED))
def test_asyncrl_sim_runs_a_recipe(recipe: str, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    _, args = recipe_command(RECIPES / recipe, env)
    pipeline = value_at(load_config(None, args), "pipeline")
    code = cli.main(["sim", *args, *SPEED[pipeline]])
    err = capsys.readouterr().err
    assert code == 0, err
    assert re.search(r"simulated [1-9][0-9]* steps", err), err  # fully async counts sync cycles (verl's step)
    assert next(Path(env["HOME"]).rglob("metrics.jsonl")).stat().st_size > 0


def test_the_table_covers_every_key_of_verls_config() -> None:
    """Every leaf of verl's config (ppo_trainer plus the two recipes' configs, as of the saved
    copies) is mapped, ours, or listed as not modelled; every table key is verl's."""
    verl: set[str] = set()
    for name in ("_generated_ppo_trainer.yaml", "fully_async_ppo_trainer.yaml", "one_step_off_ppo_trainer.yaml"):
        tree = yaml.safe_load((RECIPES / "config" / name).read_text())
        verl |= set(_leaves({k: v for k, v in tree.items() if k not in ("hydra", "defaults")}))
    assert [k for k in sorted(verl) if not (is_verl_key(k) or k in leaf_keys())] == []
    classes = {key_class(k) for k in verl if k not in leaf_keys()}  # a key of ours under its own name is read as ours
    assert classes <= {"mapped", "fixed", "knob", "chat template", "model override"}, classes
    dapo_recipe = {"algorithm.filter_groups.enable", "algorithm.filter_groups.max_num_gen_batches",
                   "reward_model.reward_kwargs.max_resp_len"}
    # DAPO's YAML (reward_model.overlong_buffer.*) and its recipes' `+reward_model.reward_kwargs.overlong_buffer_cfg.*`
    dapo_recipe |= {f"{prefix}.{k}" for prefix in ("reward_model.overlong_buffer",
                                                   "reward_model.reward_kwargs.overlong_buffer_cfg")
                    for k in ("enable", "len", "penalty_factor", "log")}
    dapo_recipe.add("actor_rollout_ref.model.override_config.max_position_embeddings")  # `+` into an empty dict
    # read by verl's FSDP workers with `fsdp_config.get("mixed_precision")`, absent from its schema
    fsdp_workers = {f"actor_rollout_ref.actor.fsdp_config.mixed_precision.{k}"
                    for k in ("param_dtype", "reduce_dtype", "buffer_dtype")}
    assert set(TABLE) - verl <= dapo_recipe | fsdp_workers


def _leaves(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        if key != "_target_":
            out += _leaves(value, f"{prefix}{key}.") if isinstance(value, dict) and value else [prefix + key]
    return out


def test_every_target_of_the_table_exists() -> None:
    for verl_key, rule in TABLE.items():
        for ours in rule.ours:
            assert ours.startswith("@") or ours in leaf_keys(), (verl_key, ours)
    assert set(VERL_DEFAULTS) <= set(leaf_keys())
    assert not [k for k in TABLE if k in NOT_MODELLED]


@pytest.mark.parametrize("override, expected", [
    ("actor_rollout_ref.actor.clip_ratio=0.3", {"actor.clip_ratio_low": 0.3, "actor.clip_ratio_high": 0.3}),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1", {"actor.warmup_ratio": 0.1, "actor.warmup_steps": -1}),
    ("actor_rollout_ref.actor.optim.warmup_style=cosine", {"actor.lr_scheduler": "cosine"}),
    ("actor_rollout_ref.actor.optim.min_lr_ratio=0.1", {"actor.min_lr_ratio": 0.1}),
    ("actor_rollout_ref.model.lora_rank=8", {"model.lora_rank": 8}),
    ("actor_rollout_ref.rollout.gpu_memory_utilization=0.6", {"rollout.gpu_memory_utilization": 0.6}),
    ("actor_rollout_ref.model.target_modules=[q_proj,v_proj]", {"model.target_modules": ("q_proj", "v_proj")}),
    ("actor_rollout_ref.model.use_remove_padding=False", {"model.use_remove_padding": False}),
    ("trainer.test_freq=-1", {"trainer.test_freq": 0}),
    ("trainer.max_actor_ckpt_to_keep=null", {"trainer.max_ckpt_to_keep": 0}),
    ("actor_rollout_ref.rollout.val_kwargs.do_sample=False", {"rollout.val_temperature": 0.0}),
    ("custom_reward_function.path=my_reward.py", {"reward.custom_function": "my_reward.py:compute_score"}),
    ("reward_model.sandbox_fusion.url=http://sb:8080/run_code", {"sandbox.backend": "http"}),
    ("actor_rollout_ref.hybrid_engine=True", {"pipeline": "colocated"}),
    ("++actor_rollout_ref.actor.ppo_epochs=2", {"actor.ppo_epochs": 2}),
    ("+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
     {"model.dtype": "bfloat16", "model.mixed_precision": "param_dtype"}),
    ("actor_rollout_ref.actor.fsdp_config.dtype=bfloat16",
     {"model.dtype": "bfloat16", "model.mixed_precision": "param_dtype"}),
])
def test_verl_keys_map_to_ours(override: str, expected: dict[str, Any]) -> None:
    cfg = load_config(None, [override])
    assert {key: value_at(cfg, key) for key in expected} == expected


@pytest.mark.parametrize("overrides, tokens", [
    (["actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=9000",
      "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=7000"], 7000),  # one budget for both passes: the smaller
    (["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
      "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=9000"], 9000),
    (["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=9000"], 0),  # no dynamic batch size: not read
    (["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "data.max_prompt_length=100",
      "data.max_response_length=400"], 4 * 500),  # sequences x the longest row
    (["actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=5000"], 0),
    (["actor.log_prob_micro_batch_tokens=3000", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
      "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=9000"], 3000),  # ours wins over verl's
])
def test_verls_forward_only_budget_maps_to_ours(overrides: list[str], tokens: int) -> None:
    assert load_config(None, overrides).actor.log_prob_micro_batch_tokens == tokens


def test_verls_mixed_precision_maps_where_it_means_the_same() -> None:
    a = "actor_rollout_ref.actor.fsdp_config."
    ours = load_config(None, [f"+{a}mixed_precision.param_dtype=bf16", "model.mixed_precision=autocast"])
    assert (ours.model.dtype, ours.model.mixed_precision) == ("bfloat16", "autocast")  # ours wins
    kept = resolve(None, [f"+{a}mixed_precision.reduce_dtype=fp32", f"+{a}mixed_precision.buffer_dtype=fp32",
                          f"{a}model_dtype=fp32"])
    assert kept.not_modelled == [] and "model.mixed_precision" not in kept.values
    off = resolve(None, [f"+{a}mixed_precision.param_dtype=fp32", f"+{a}mixed_precision.reduce_dtype=bf16"])
    assert off.not_modelled == [f"{a}mixed_precision.param_dtype", f"{a}mixed_precision.reduce_dtype"]


def test_specific_clip_ratios_win_over_verls_clip_ratio() -> None:
    cfg = load_config(None, ["actor_rollout_ref.actor.clip_ratio_high=0.28", "actor_rollout_ref.actor.clip_ratio=0.1"])
    assert (cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high) == (0.1, 0.28)


def test_defaults_follow_the_model_not_the_spelling_of_its_key() -> None:
    assert load_config(None, ["rollout.n=4"]).actor.lr == C.Config().actor.lr  # the tiny model: ours
    assert load_config(None, ["rollout.n=4", "data.filter_overlong_prompts=True"]).actor.lr == C.Config().actor.lr
    ours, verls = (load_config(None, [f"{key}=/models/qwen"]) for key in ("model.path", "actor_rollout_ref.model.path"))
    assert ours == verls
    a = ours.actor
    assert (a.lr, a.warmup_steps, ours.rollout.val_n, ours.data.max_response_length) == (1e-6, -1, 1, 512)
    assert load_config(None, ["model.path=/models/qwen", "actor.lr=3e-6"]).actor.lr == 3e-6  # a key set wins


def test_a_ratio_of_warm_up_means_warm_up_by_ratio() -> None:
    cfg = load_config(None, ["actor.warmup_ratio=0.1"])
    assert (cfg.actor.warmup_ratio, cfg.actor.warmup_steps) == (0.1, -1)


def test_train_needs_a_verl_command_lines_model_and_its_step_counts_to_agree() -> None:
    from asyncrl.config.load import load_train_config

    with pytest.raises(ConfigError, match="a verl command line without actor_rollout_ref.model.path"):
        load_train_config(None, ["actor_rollout_ref.rollout.n=4"])
    assert load_config(None, ["actor_rollout_ref.rollout.n=4"]).rollout.n == 4  # sim and config still load it
    steps = ["pipeline=fully_async", "actor.ppo_mini_batch_size=8", "async_training.require_batches=2",
             "rollout.total_rollout_steps=160"]
    assert load_config(None, [*steps, "trainer.total_training_steps=10"]).rollout.total_rollout_steps == 160
    with pytest.raises(ConfigError, match=r"rollout.total_rollout_steps=160 \(10 updates of 16 prompts\) and "
                                          r"trainer.total_training_steps=3 disagree; set only one of them"):
        load_config(None, [*steps, "trainer.total_training_steps=3"])


def test_a_command_line_sized_in_gpus_runs_on_cuda_unless_it_says_otherwise() -> None:
    assert load_config(None, ["trainer.n_gpus_per_node=8", "actor_rollout_ref.rollout.n=4"]).trainer.device == "cuda"
    assert load_config(None, ["trainer.n_gpus_per_node=8", "actor_rollout_ref.rollout.n=4",
                              "trainer.device=cpu"]).trainer.device == "cpu"
    assert load_config(None, ["trainer.n_gpus_per_node=0", "actor_rollout_ref.rollout.n=4"]).trainer.device == "cpu"


def test_a_verl_yaml_file_is_read_too(tmp_path: Path) -> None:
    path = tmp_path / "verl.yaml"
    path.write_text("actor_rollout_ref:\n  actor:\n    optim: {lr: 2.0e-6}\n  rollout: {n: 4, name: vllm}\n"
                    "rollout: {n_gpus_per_node: 2}\n")
    cfg = load_config(path, ["actor_rollout_ref.rollout.n=6"])
    assert (cfg.actor.lr, cfg.rollout.n, cfg.rollout.n_gpus_per_node) == (2e-6, 6, 2)


def test_a_value_asyncrl_does_not_have_is_in_the_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="asyncrl.config"):
        load_config(None, ["data.prompt_key=prompt", "actor_rollout_ref.rollout.mode=async"])
        assert not caplog.records
        load_config(None, ["data.prompt_key=question"])
    assert "data.prompt_key" in caplog.records[0].getMessage()


@pytest.mark.parametrize("key, hint", [
    ("actor.clip_ratio", "did you mean actor.clip_ratio_low or actor.clip_ratio_high?"),
    ("trainer.lr", "did you mean actor.lr or critic.lr?"),
    ("rollout.nn", "did you mean rollout.n?"),
    ("actor_rollout_ref.actor.optim.lrr", "did you mean actor_rollout_ref.actor.optim.lr?"),
    ("actor_rollout_ref.rollout.nn", "did you mean actor_rollout_ref.rollout.n?"),
])
def test_an_unknown_key_gets_the_hint_that_fits(key: str, hint: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{key}=1"])
    assert str(err.value) == f"unknown config key {key}; {hint}"


@pytest.mark.parametrize("key, not_this", [
    ("actor.clip_ratio", "clip_ratio_c"), ("rollout.name", "rollout.n"), ("data.filter_overlong", "filter_overlong"),
    ("trainer.total_epoch", "total_training_steps"), ("actor.kl_loss", "kl_loss_"),
])
def test_a_hint_never_names_a_different_setting(key: str, not_this: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{key}=1"])
    hint = str(err.value).partition("did you mean")[2]
    assert not_this not in hint


@pytest.mark.parametrize("key", ["actor.clip_ratio", "trainer.lr", "rollout.nn", "data.filter_overlong",
                                 "algorithm.kl_ctrl.coef", "actor_rollout_ref.actor.optim.lrr", "actor.optim.lr",
                                 "critic.optim.lrr", "trainer.total_epoch", "reward.custom_fn"])
def test_every_hint_names_a_key_that_exists(key: str) -> None:
    known = set(leaf_keys()) | set(renamed_keys())
    assert all(s in known for s in suggestions(key, renamed_keys()))


def test_config_from_verl_prints_the_config_and_the_warning(env: dict[str, str], capsys: pytest.CaptureFixture[str],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    entry, args = recipe_command(RECIPES / "fully_async__dapo_7b_math_fsdp2_8_8.sh", env)
    with caplog.at_level(logging.WARNING, logger="asyncrl.config"):
        assert cli.main(["config", "--from-verl", "python", "-m", entry, *args]) == 0
    printed = capsys.readouterr().out
    assert C.config_from_dict(yaml.safe_load(printed)) == load_config(None, args)
    assert "staleness_threshold: 0.1  # " in printed
    assert "actor_rollout_ref.rollout.name" in caplog.text


def test_config_prints_every_key_with_its_doc(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "rollout.n=4"]) == 0
    printed = capsys.readouterr().out
    assert C.config_from_dict(yaml.safe_load(printed)) == load_config(None, ["rollout.n=4"])
    assert "  n: 4  # Responses sampled per prompt (the group size). Range: >= 1." in printed.splitlines()
    values = [line for line in printed.splitlines() if ":  # " not in line]  # sections are `name:  # doc`
    assert len(values) == len(leaf_keys())


@pytest.mark.parametrize(("arg", "fix"), [
    ("trainer.val_only=True", "run `asyncrl eval`"),
    ("actor_rollout_ref.rollout.multi_turn.interaction_config_path=x.yaml", "rollout.multi_turn.episode"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=4", "asyncrl has no sequence parallelism"),
    ("data.prompt_key=question", "asyncrl always runs it as 'prompt'"),
])
def test_a_key_that_changes_training_is_refused_by_train_and_named_by_sim(
        arg: str, fix: str, caplog: pytest.LogCaptureFixture) -> None:
    from asyncrl.config.load import load_train_config

    model = "actor_rollout_ref.model.path=tiny"
    with pytest.raises(ConfigError) as err:
        load_train_config(None, [model, arg])
    key, _, value = arg.partition("=")
    assert str(err.value).startswith(f"{key}=") and "changes what is trained and is not modelled" in str(err.value)
    assert fix in str(err.value)
    with caplog.at_level(logging.WARNING, logger="asyncrl.config"):
        load_config(None, [model, arg])  # sim and config plan the recipe as if it were unset
    assert any(r.getMessage().startswith("verl keys that change what is trained") and key in r.getMessage()
               for r in caplog.records)


def test_verls_multi_turn_keys_map() -> None:
    mt = "actor_rollout_ref.rollout.multi_turn."
    cfg = load_config(None, [f"{mt}enable=True", f"{mt}max_assistant_turns=3", f"{mt}max_user_turns=null",
                             f"{mt}tool_config_path=tools.yaml", f"{mt}format=hermes", f"{mt}max_parallel_calls=2",
                             f"{mt}max_tool_response_length=100", f"{mt}tool_response_truncate_side=left"])
    m = cfg.rollout.multi_turn
    assert (m.enable, m.max_assistant_turns, m.tool_config_path, m.format) == (True, 3, "tools.yaml", "hermes")
    assert (m.max_user_turns, m.max_parallel_calls, m.max_tool_response_length) == (1_000_000, 2, 100)
    assert key_class(f"{mt}enable") == "mapped" and key_class(f"{mt}interaction_config_path") == "fixed"
    assert key_class(f"{mt}tokenization_sanity_check_mode") == "knob"


def test_verls_overlong_prompt_keys_map() -> None:
    cfg = load_config(None, ["data.filter_overlong_prompts=False", "data.truncation=left"])
    assert (cfg.data.filter_overlong_prompts, cfg.data.truncation) == (False, "left")


def test_validation_sampling_keys_map_and_reach_the_requests() -> None:
    from asyncrl.workers.rollout import RequestBuilder

    val = "actor_rollout_ref.rollout.val_kwargs"
    cfg = load_config(None, [f"{val}.top_p=0.7", f"{val}.top_k=0", f"{val}.temperature=0.6"])
    params = RequestBuilder(cfg.rollout, max_tokens=8, seed=0).sampling_params("val")
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.7, -1)


def test_docs_list_every_verl_key_by_class_as_generated() -> None:
    text = (Path(__file__).parents[1] / "docs" / "migrating.md").read_text()
    assert text[text.index(BEGIN):text.index(END) + len(END)] == reference()
    assert key_class("trainer.val_only") == "fixed" and key_class("actor_rollout_ref.actor.optim.lr") == "mapped"
    assert key_class("actor_rollout_ref.rollout.name") == "knob"
    assert key_class("actor_rollout_ref.model.override_config.attention_dropout") == "model override"
