"""verl's recipes under `asyncrl train`, at tiny sizes: each trains with every key it sets honoured,
or exits 2 with one line naming the key asyncrl cannot honour; none ignores a key that changes
what is trained, none is an internal error (issue 27's "done when")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl import cli
from tests.test_verl_keys import EXPECTED, RECIPES, env, recipe_command  # noqa: F401, F811 (env: a fixture)

pytestmark = pytest.mark.slow

TINY = ["actor_rollout_ref.model.path=tiny", "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=0",
        "rollout.nnodes=1", "rollout.n_gpus_per_node=0", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.max_prompt_length=64",
        "data.max_response_length=8", "actor.ppo_micro_batch_tokens=0", "actor.log_prob_micro_batch_tokens=0",
        "trainer.val_before_train=false", "trainer.test_freq=0",
        "rollout.test_freq=0", "trainer.logger=[jsonl]", "async_training.require_batches=1",
        "async_training.trigger_parameter_sync_step=1", "reward.overlong_max_len=8", "reward.num_workers=1"]
SEQUENCE_PARALLEL = {"fully_async__dapo_7b_math_fsdp2_64_64_mis.sh", "one_step_off__dapo_7b_math_fsdp2_4_12.sh"}


@pytest.mark.parametrize("recipe", sorted(EXPECTED))
def test_a_recipe_trains_at_tiny_sizes_or_names_the_key_it_cannot_honour(
        recipe: str, env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    _, args = recipe_command(RECIPES / recipe, env)
    out = tmp_path / "run"
    fully_async = "fully_async" in recipe
    length = ["rollout.total_rollout_steps=4"] if fully_async else ["trainer.total_training_steps=1"]
    overlong = ["reward.overlong_buffer=4"] if "dapo" in recipe else []
    code = cli.main(["train", *args, *TINY, *length, *overlong, f"trainer.output_dir={out}"])
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err, err
    if recipe in SEQUENCE_PARALLEL:  # ulysses_sequence_parallel_size=4: asyncrl has none
        assert code == 2
        lines = err.strip().splitlines()  # every refusal of the command line, together, one line each
        assert all(line.startswith("asyncrl: error: ") for line in lines), err
        assert any(line.startswith("asyncrl: error: actor_rollout_ref.actor.ulysses_sequence_parallel_size=4 "
                                   "changes what is trained") for line in lines), err
        return
    assert code == 0, err
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("critic/score/mean" in m for m in metrics)
    if "dapo" in recipe:  # the overlong punishment the recipe asks for is a part of every trained reward
        lines = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
        trained = [g for g in lines if g["split"] == "train"]
        assert trained and all("overlong_penalty" in g["reward_parts"] for g in trained)
        # 8 tokens fill the 4-token buffer (max 8): a full-length response loses the whole factor
        assert all(g["reward_parts"]["overlong_penalty"] == -1.0 for g in trained if g["response_tokens"] == 8)
