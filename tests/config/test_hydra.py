"""Hydra's rules on a verl command line: the last occurrence wins (refusals included), `+`/`++`/`~`,
and `${...}` resolved by OmegaConf against the command line's keys."""

from __future__ import annotations

import pytest

from asyncrl.config.hydra import DELETE, apply_hydra
from asyncrl.config.load import load_config, load_train_config
from asyncrl.errors import ConfigError

A = "actor_rollout_ref.actor."
MODEL = "actor_rollout_ref.model.path=/models/qwen"


def test_the_last_occurrence_wins_for_refusals_too() -> None:
    cfg = load_train_config(None, [MODEL, f"{A}ulysses_sequence_parallel_size=4",
                                   "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
                                   f"{A}ulysses_sequence_parallel_size=1", "rollout.n=4", "rollout.n=6"])
    assert (cfg.rollout.n, cfg.rollout.tensor_model_parallel_size) == (6, 4)  # docs/migrating.md's recipe
    with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size=4 changes what is trained"):
        load_train_config(None, [MODEL, f"{A}ulysses_sequence_parallel_size=1", f"{A}ulysses_sequence_parallel_size=4"])


def test_refusals_of_one_command_line_come_together() -> None:
    with pytest.raises(ConfigError) as err:
        load_train_config(None, [MODEL, f"{A}ulysses_sequence_parallel_size=4", "algorithm.use_pf_ppo=true"])
    assert [line.split("=")[0] for line in str(err.value).splitlines()] == [
        f"{A}ulysses_sequence_parallel_size", "algorithm.use_pf_ppo"]


def test_plus_adds_tilde_deletes() -> None:
    assert apply_hydra([("+a.b", 1), ("++a.b", 2), ("c", 3), ("~c", DELETE)]) == [("++a.b", 2)]
    assert load_config(None, ["rollout.n=4", "~rollout.n"]).rollout.n == 8  # deleted: asyncrl's default
    assert load_config(None, ["rollout.n=4", "~rollout.n=4"]).rollout.n == 8
    with pytest.raises(ConfigError, match=r"~rollout.n=5: the key holds 4"):
        load_config(None, ["rollout.n=4", "~rollout.n=5"])
    with pytest.raises(ConfigError, match=r"~rollout.nn: could not delete rollout.nn: no such key"):
        load_config(None, ["~rollout.nn"])


def test_interpolation_is_omegaconfs_against_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUN_TAG", "exp7")
    cfg = load_config(None, ["data.max_response_length=300", f"{A}use_dynamic_bsz=true",
                             f"{A}ppo_max_token_len_per_gpu=${{data.max_response_length}}",
                             "trainer.experiment_name=${oc.env:RUN_TAG}_${data.max_response_length}"])
    assert (cfg.actor.ppo_micro_batch_tokens, cfg.trainer.experiment_name) == (300, "exp7_300")
    with pytest.raises(ConfigError, match=r"rollout.n=\$\{data.gen_n\}: cannot resolve .*'data.gen_n' not found"):
        load_config(None, ["rollout.n=${data.gen_n}"])


@pytest.mark.parametrize("value", ["abc", "null"])
def test_a_bad_length_beside_a_micro_batch_is_the_lengths_own_error(value: str) -> None:
    with pytest.raises(ConfigError, match="data.max_response_length"):
        load_config(None, [f"data.max_response_length={value}", f"{A}ppo_micro_batch_size_per_gpu=2",
                           "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2"])


def test_a_negative_micro_batch_names_the_key_the_user_typed() -> None:
    with pytest.raises(ConfigError, match=rf"^{A}ppo_micro_batch_size_per_gpu=-1: must be a whole number >= 1$"):
        load_config(None, [f"{A}ppo_micro_batch_size_per_gpu=-1"])
