"""data.task_options: read as the task's keyword arguments, reaching the run's train and validation
prompts (and the simulator's), and refused in one line naming the key when the task cannot use them."""

from __future__ import annotations

import json

import pytest

from asyncrl.config.load import load_config
from asyncrl.data.held_out import val_rows
from asyncrl.data.tasks import task_options, task_rows
from asyncrl.errors import ConfigError
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.sim.workload import sim_rows
from asyncrl.workers.factory import load_data

COUNTDOWN = ["data.task=countdown", 'data.task_options=["counts=[2]", max_number=5, max_target=30]',
             "data.max_prompt_length=192", "data.task_size=64", "data.val_size=16", "data.train_batch_size=16"]


def test_entries_are_read_as_yaml_values() -> None:
    assert task_options("countdown", ["counts=[2, 3]", "max_number=5"]) == {"counts": [2, 3], "max_number": 5}
    assert task_options("longtail", ["median=12.5", "letters=ab"]) == {"median": 12.5, "letters": "ab"}
    assert task_options("arithmetic", []) == {}


def test_options_reach_the_runs_train_and_validation_prompts() -> None:
    cfg = load_config(overrides=COUNTDOWN)
    train, val = load_data(cfg, build_char_tokenizer(), lambda _: None)
    held_out, sources = val_rows(cfg.data, cfg.seed, build_char_tokenizer(), lambda _: None)
    assert len(train) == 64 and len(val) == len(held_out) == 16 and sources == ["data.task=countdown (test split)"]
    for row in [*train, *val]:
        numbers = json.loads(row.ground_truth)["numbers"]
        assert len(numbers) == 2 and max(numbers) <= 5
    assert {r.extra_info["split"] for r in train} == {"train"} and {r.extra_info["split"] for r in val} == {"test"}


def test_without_options_the_task_keeps_its_defaults() -> None:
    cfg = load_config(overrides=["data.task=countdown", "data.task_size=64", "data.val_size=4"])
    sizes = {len(json.loads(r.ground_truth)["numbers"]) for r in task_rows(cfg.data, 64, seed=0, split="train")}
    assert sizes == {3, 4}


def test_the_simulator_reads_them_too() -> None:
    cfg = load_config(overrides=["data.task=longtail", "data.task_options=[median=3, sigma=0]", "data.task_size=8",
                                 "data.val_size=8"])
    train, val = sim_rows(cfg)
    assert {r.extra_info["length"] for r in [*train, *val]} == {3}


@pytest.mark.parametrize("options, words", [
    ("[max_numbr=5]", "'max_numbr=5' is not name=value with a name data.task=countdown takes (counts, max_number"),
    ("[max_number]", "'max_number' is not name=value"),
    ('["counts=[2"]', "the value is not valid YAML"),
])
def test_a_bad_entry_is_one_line_naming_the_key(options: str, words: str) -> None:
    cfg = load_config(overrides=["data.task=countdown", f"data.task_options={options}"])
    with pytest.raises(ConfigError) as err:
        task_rows(cfg.data, 4, seed=0, split="test")
    assert str(err.value).startswith("data.task_options: ") and words in str(err.value) and "\n" not in str(err.value)


def test_a_value_the_task_refuses_is_one_line_naming_the_key() -> None:
    cfg = load_config(overrides=["data.task=longtail", "data.task_options=[median=-1]"])
    with pytest.raises(ConfigError, match=r"^data.task_options=\['median=-1'\] do not make data.task=longtail "
                                          r"prompts: longtail needs .*median > 0") as err:
        task_rows(cfg.data, 4, seed=0, split="train")
    assert "\n" not in str(err.value)


def test_options_with_training_files_are_refused() -> None:
    with pytest.raises(ConfigError, match="data.task_options .* data.train_files replace: remove data.task_options"):
        load_config(overrides=["data.train_files=[x.parquet]", "data.task_options=[high=9]"])


def test_countdown_ops_restrict_the_constructed_solutions() -> None:
    cfg = load_config(overrides=["data.task=countdown", "data.task_options=[ops=+-, max_number=9]"])
    solutions = [r.extra_info["solution"] for r in task_rows(cfg.data, 100, seed=0, split="train")]
    assert {c for s in solutions for c in s if not c.isdigit()} == {"+", "-"}
    bad = load_config(overrides=["data.task=countdown", "data.task_options=[ops=^]"])
    with pytest.raises(ConfigError, match=r"countdown ops must be some of \+-\*/, got '\^'"):
        task_rows(bad.data, 4, seed=0, split="train")


def test_countdown_short_prompt_words_the_same_puzzle() -> None:
    """prompt=short: the same numbers and target as the full wording, the numbers just before the
    answer; an unknown style is refused by name."""
    options = '"counts=[2]", max_number=9'
    full = load_config(overrides=["data.task=countdown", f"data.task_options=[{options}]"])
    short = load_config(overrides=["data.task=countdown", f"data.task_options=[{options}, prompt=short]"])
    for a, b in zip(task_rows(full.data, 20, seed=3, split="test"), task_rows(short.data, 20, seed=3, split="test")):
        puzzle = json.loads(a.ground_truth)
        assert b.ground_truth == a.ground_truth
        assert b.messages[0]["content"] == f"Make {puzzle['target']} from {puzzle['numbers']}."
    bad = load_config(overrides=["data.task=countdown", "data.task_options=[prompt=tiny]"])
    with pytest.raises(ConfigError, match="countdown prompt must be one of full, short, got 'tiny'"):
        task_rows(bad.data, 4, seed=0, split="train")
