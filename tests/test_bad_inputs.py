"""The bad-input suite: every input a TRL or verl user got wrong in issue 36's outside check, plus
the misspelled-key, wrong-type, missing-file, bad-YAML and out-of-range inputs (regression rows).
Each exits 2 with one line per refusal (`asyncrl: error: ...`), naming the key or file the user
typed, and no traceback; the command-line rows run `asyncrl train` in this process, the Python
rows build the TRL-named trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncrl import cli
from asyncrl.errors import AsyncRLError

A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
MODEL = "actor_rollout_ref.model.path=tiny"
ROW = b'{"data_source": "x", "prompt": "caf\xe9", "reward_model": {"ground_truth": "1"}}\n'


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("latin1.jsonl").write_bytes(ROW)
    Path("good.jsonl").write_text('{"data_source": "x", "prompt": "1+1=", "reward_model": {"ground_truth": "2"}}\n')
    Path("bad.yaml").write_text("rollout:\n  n: [1, 2\n")
    binary = pa.array([b"caf\xe9"], pa.binary())
    pq.write_table(pa.table({"data_source": ["x"], "prompt": binary, "reward_model": [{"ground_truth": "1"}]}),
                   "latin1.parquet")


COMMAND_LINES: list[tuple[str, list[str], list[str]]] = [
    # (row, the command line's arguments, what each error line names, in order)
    ("misspelled key", ["rollout.nn=4"], ["rollout.nn"]),
    ("wrong type", ["rollout.n=abc"], ["rollout.n"]),
    ("out of range", ["rollout.top_p=2"], ["rollout.top_p"]),
    ("override without =", ["rollout.n"], ["rollout.n"]),
    ("missing data file", ["model.path=tiny", "data.train_files=[nope.parquet]"], ["nope.parquet"]),
    ("missing config file", ["missing.yaml"], ["missing.yaml"]),
    ("bad YAML file", ["bad.yaml"], ["bad.yaml"]),
    ("non-UTF-8 JSONL", ["model.path=tiny", "data.train_files=[latin1.jsonl]"], ["latin1.jsonl row 0"]),
    ("non-UTF-8 parquet prompt", ["model.path=tiny", "data.train_files=[latin1.parquet]"],
     ["latin1.parquet row 0 (0-based): field 'prompt': not UTF-8"]),
    ("tool config without multi-turn", ["rollout.multi_turn.tool_config_path=tools.yaml"],
     ["rollout.multi_turn.tool_config_path"]),
    ("verl tool config without multi-turn", [MODEL, f"{R}multi_turn.tool_config_path=tools.yaml"],
     ["rollout.multi_turn.tool_config_path"]),
    ("episode without multi-turn", ["rollout.multi_turn.episode=my.mod:run"], ["rollout.multi_turn.episode"]),
    ("asyncrl data without a model", ["data.train_files=[good.jsonl]"], ["model.path"]),
    ("verl command line without a model", ["data.train_files=[good.jsonl]", f"{R}n=4"],
     ["actor_rollout_ref.model.path"]),
    ("a later refused value wins", [MODEL, f"{A}ulysses_sequence_parallel_size=1",
                                    f"{A}ulysses_sequence_parallel_size=4"], [f"{A}ulysses_sequence_parallel_size=4"]),
    ("refusals together", [MODEL, f"{A}ulysses_sequence_parallel_size=4", f"{R}tensor_model_parallel_size=4",
                           "algorithm.use_pf_ppo=true", "trainer.val_only=true"],
     [f"{A}ulysses_sequence_parallel_size=4", "algorithm.use_pf_ppo=True", "trainer.val_only=True"]),
    ("interpolation of an unset key", [MODEL, f"{R}n=${{data.gen_n}}"], [f"{R}n=${{data.gen_n}}: cannot resolve"]),
    ("interpolation resolving to a bad length", [MODEL, "data.max_response_length=${trainer.experiment_name}",
                                                 f"{A}ppo_micro_batch_size_per_gpu=2"], ["data.max_response_length"]),
    ("length abc beside a micro-batch", [MODEL, "data.max_response_length=abc", f"{A}ppo_micro_batch_size_per_gpu=2"],
     ["data.max_response_length"]),
    ("length null beside a micro-batch", [MODEL, "data.max_response_length=null",
                                          f"{R}log_prob_micro_batch_size_per_gpu=2"], ["data.max_response_length"]),
    ("negative verl micro-batch", [MODEL, f"{A}ppo_micro_batch_size_per_gpu=-2"], [f"{A}ppo_micro_batch_size_per_gpu"]),
    ("hydra delete of no key", ["~rollout.nn"], ["rollout.nn"]),
    ("hydra delete of another value", ["rollout.n=4", "~rollout.n=5"], ["~rollout.n=5"]),
    ("unknown reward function", ["reward.custom_function=nowhere.py:score"], ["reward.custom_function"]),
]


@pytest.mark.parametrize("args,named", [pytest.param(a, n, id=i) for i, a, n in COMMAND_LINES])
def test_a_bad_command_line_is_one_line_per_refusal(args: list[str], named: list[str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", *args]) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "Traceback" not in err and "internal error" not in err
    assert len(lines) == len(named), err
    for line, name in zip(lines, named):
        assert line.startswith("asyncrl: error: ") and name in line, line


def quickstart_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return [0.0] * len(completions)


DATA = [{"prompt": "1+1="}]
PYTHON_ROWS: list[tuple[str, dict[str, Any], str]] = [
    # (row, GRPOTrainer's keyword arguments, with "args" a dict for GRPOConfig, what the error names)
    ("unknown GRPOConfig field", {"args": {"num_generation": 4}}, "num_generation"),
    ("refused GRPOConfig value", {"args": {"fp16": True}}, "fp16=True"),
    ("report_to an integration asyncrl lacks", {"args": {"report_to": "comet_ml"}}, "report_to='comet_ml'"),
    ("batch without whole groups", {"args": {"per_device_train_batch_size": 3}}, "num_generations (8)"),
    ("missing prompt column", {"train_dataset": [{"question": "x"}]}, "train_dataset: row 0 has no 'prompt'"),
    ("a file path as the dataset", {"train_dataset": "train.jsonl"}, "config={'data.train_files'"),
    ("a callback", {"callbacks": [object()]}, "GRPOTrainer(callbacks=...)"),
    ("a model object", {"model": object()}, "GRPOTrainer(model=...)"),
    ("two reward models", {"reward_funcs": ["org/rm-a", "org/rm-b"]}, "reward_funcs: 2 reward models"),
    ("a verl key in config=", {"config": {f"{A}ulysses_sequence_parallel_size": 2}},
     "ulysses_sequence_parallel_size=2"),
]


@pytest.mark.parametrize("kwargs,named", [pytest.param(k, n, id=i) for i, k, n in PYTHON_ROWS])
def test_a_bad_trl_script_is_one_line_naming_the_argument(kwargs: dict[str, Any], named: str) -> None:
    from asyncrl import GRPOConfig, GRPOTrainer

    given = {"model": "tiny", "reward_funcs": quickstart_reward, "train_dataset": DATA, **kwargs}
    with pytest.raises(AsyncRLError) as err:
        if "args" in given:
            given["args"] = GRPOConfig(**given["args"])
        GRPOTrainer(**given)
    assert len(str(err.value).splitlines()) == 1 and named in str(err.value), str(err.value)
