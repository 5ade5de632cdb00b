"""Loading verl-layout parquet/JSONL/JSON rows, malformed-row errors, write/load round trips, and
the data.max_prompt_length report."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncrl.data.dataset import (
    check_prompt_lengths,
    fit_prompts,
    load_rows,
    row_from_record,
    write_jsonl,
    write_parquet,
)
from asyncrl.data.tasks import TASKS, make_task
from asyncrl.errors import ConfigError, DataError
from asyncrl.types import PromptRow


def _record(**overrides: Any) -> dict[str, Any]:
    rec = {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": "What is 2+3?"}],
        "ability": "math",
        "reward_model": {"ground_truth": "5", "style": "rule"},
        "extra_info": {"split": "train"},
    }
    rec.update(overrides)
    return rec


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_make_task_round_trips(tmp_path: Path, task: str, fmt: str) -> None:
    rows = make_task(task, 12, seed=3, split="test")
    path = str(tmp_path / f"{task}.{fmt}")
    (write_parquet if fmt == "parquet" else write_jsonl)(rows, path)
    assert load_rows(path, split_name="test") == rows


def test_uid_defaults_to_split_and_row_index(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [_record(), _record()])
    assert [r.uid for r in load_rows(path, split_name="val")] == ["val-0", "val-1"]


def test_uid_uses_extra_info_index(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [_record(extra_info={"index": 7})])
    assert load_rows(path)[0].uid == "train-7"


def test_duplicate_index_is_an_error(tmp_path: Path) -> None:
    recs = [_record(extra_info={"index": 1}), _record(extra_info={"index": 1})]
    with pytest.raises(DataError, match=r"row 1 \(0-based\): field 'extra_info.index'"):
        load_rows(_write_jsonl(tmp_path / "d.jsonl", recs))


@pytest.mark.parametrize(("truth", "expected"), [(42, "42"), (1.5, "1.5"), ([1, 2], "[1, 2]"), ("x", "x")])
def test_ground_truth_is_normalised_to_str(tmp_path: Path, truth: Any, expected: str) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [_record(reward_model={"ground_truth": truth})])
    assert load_rows(path)[0].ground_truth == expected


def test_parquet_rejects_a_prompt_neither_messages_nor_text_naming_file_row_field(tmp_path: Path) -> None:
    table = pa.Table.from_pylist([{**_record(), "prompt": 7}])
    path = str(tmp_path / "train.parquet")
    pq.write_table(table, path)
    msg = (r"train\.parquet row 0 \(0-based\): field 'prompt' must be a list of \{role, content\} messages or a "
           r"non-empty string \(raw text\), got int")
    with pytest.raises(DataError, match=msg):
        load_rows(path)


def test_parquet_missing_ground_truth_names_row(tmp_path: Path) -> None:
    recs = [_record(), _record(reward_model={"ground_truth": None, "style": "rule"})]
    path = str(tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(recs), path)
    with pytest.raises(DataError, match=r"row 1 \(0-based\): field 'reward_model.ground_truth'"):
        load_rows(path)


def test_parquet_missing_column(tmp_path: Path) -> None:
    path = str(tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist([{"data_source": "x", "prompt": "hi"}]), path)
    with pytest.raises(DataError, match="missing column 'reward_model'"):
        load_rows(path)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"prompt": [{"role": "user"}]}, "prompt[0]"),
        ({"prompt": []}, "prompt"),
        ({"prompt": 3}, "prompt"),
        ({"data_source": ""}, "data_source"),
        ({"reward_model": "5"}, "reward_model.ground_truth"),
        ({"extra_info": [1, 2]}, "extra_info"),
        ({"ability": 3}, "ability"),
    ],
)
def test_malformed_jsonl_row_names_file_row_field(tmp_path: Path, bad: dict[str, Any], field: str) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", [_record(), _record(), _record(**bad)])
    with pytest.raises(DataError, match=r"bad\.jsonl row 2 \(0-based\): field " + re.escape(f"'{field}'")) as info:
        load_rows(path)
    assert isinstance(info.value, ValueError)


def test_invalid_json_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_record()) + "\n\n{not json\n")
    with pytest.raises(DataError, match=r"row 1 \(0-based, line 3\): invalid JSON"):
        load_rows(str(path))


def test_missing_file_and_unknown_extension(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_rows(str(tmp_path / "nope.parquet"))
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported"):
        load_rows(str(tmp_path / "d.csv"))


@pytest.mark.parametrize("layout", ["array", "lines"])
def test_json_file_as_array_or_json_lines(tmp_path: Path, layout: str) -> None:
    recs = [_record(), _record(prompt="What is 1+1?")]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(recs) if layout == "array" else "".join(json.dumps(r) + "\n" for r in recs))
    rows = load_rows(str(path))
    assert [(r.messages[0]["content"] if r.messages else r.text) for r in rows] == ["What is 2+3?", "What is 1+1?"]


def test_json_array_bad_row_names_file_row_field(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([_record(), _record(data_source=None)]))
    with pytest.raises(DataError, match=r"d\.json row 1 \(0-based\): field 'data_source'"):
        load_rows(str(path))


def test_row_from_record_names_file_row_field() -> None:
    rec = _record(ability=3)
    with pytest.raises(DataError, match=r"x\.jsonl row 4 \(0-based\): field 'ability'"):
        row_from_record(rec, "x.jsonl", 4)


def test_prompt_lengths_all_dropped_is_an_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        check_prompt_lengths([212, 90, 70], 64, "train.parquet", log=_no_log)
    assert str(err.value) == ("data.max_prompt_length=64 drops 3 of 3 prompts in train.parquet "
                              "(longest 212 tokens); raise data.max_prompt_length")


def test_prompt_lengths_some_dropped_is_one_warning_line() -> None:
    lines: list[str] = []
    assert check_prompt_lengths([212, 90, 30], 64, "train.parquet", lines.append) == 2
    assert lines == ["warning: data.max_prompt_length=64 drops 2 of 3 prompts in train.parquet "
                     "(longest 212 tokens); raise data.max_prompt_length to keep them"]
    assert check_prompt_lengths([10, 64], 64, "train.parquet", lines.append) == 0 and len(lines) == 1


def test_filtering_keeps_the_prompts_that_fit() -> None:
    rows = [PromptRow(uid=f"t-{n}", data_source="x", messages=(), ground_truth="", prompt_ids=(1,) * n)
            for n in (3, 9, 5)]
    lines: list[str] = []
    assert [r.uid for r in fit_prompts(rows, 5, "f.jsonl", lines.append)] == ["t-3", "t-5"]
    assert "drops 1 of 3 prompts in f.jsonl (longest 9 tokens)" in lines[0]


@pytest.mark.parametrize(("truncation", "kept"), [("left", (3, 4, 5, 6)), ("right", (1, 2, 3, 4)),
                                                  ("middle", (1, 2, 5, 6))])
def test_truncation_cuts_as_verl_does_and_counts(truncation: str, kept: tuple[int, ...]) -> None:
    rows = [PromptRow("t-0", "x", (), "", prompt_ids=(1, 2, 3, 4, 5, 6)),
            PromptRow("t-1", "x", (), "", prompt_ids=(7,))]
    lines: list[str] = []
    out = fit_prompts(rows, 4, "f.jsonl", lines.append, filter_overlong=False, truncation=truncation)
    assert [r.prompt_ids for r in out] == [kept, (7,)]
    assert lines == [f"warning: data.truncation={truncation} cuts 1 of 2 prompts in f.jsonl to "
                     "data.max_prompt_length=4 tokens (longest 6)"]
    with pytest.raises(DataError, match=r"f.jsonl: prompt 't-0' has 6 tokens > data.max_prompt_length=4; .* "
                                        r"data.filter_overlong_prompts=true .* data.truncation=left\|right\|middle"):
        fit_prompts(rows, 4, "f.jsonl", lines.append, filter_overlong=False, truncation="error")


def _no_log(message: str) -> None:
    raise AssertionError(f"unexpected log line: {message}")


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_string_prompt_is_raw_text_in_every_format(tmp_path: Path, suffix: str) -> None:
    row = PromptRow("train-0", "x", (), "2", text="<|user|>1+1=<|assistant|>")
    path = str(tmp_path / f"train{suffix}")
    (write_parquet if suffix == ".parquet" else write_jsonl)([row], path)
    loaded = load_rows(path)[0]
    assert (loaded.text, loaded.messages) == (row.text, ())


def test_raw_text_is_tokenized_without_the_chat_template() -> None:
    from asyncrl.data.tokenization import tokenize_rows

    class Tok:
        chat_template = None  # raw text needs none

        def __call__(self, text: str, add_special_tokens: bool) -> dict[str, list[int]]:
            assert not add_special_tokens
            return {"input_ids": [ord(c) for c in text]}

    kept, dropped = tokenize_rows([PromptRow("u", "x", (), "", text="ab")], Tok(), 8)
    assert (kept[0].prompt_ids, dropped) == ((97, 98), 0)


def test_chat_template_kwargs_reach_the_template_and_verls_spelling_maps() -> None:
    from asyncrl.config import load_config
    from asyncrl.data.tokenization import template_kwargs, tokenize_rows

    cfg = load_config(None, ["+data.apply_chat_template_kwargs.enable_thinking=False"])
    assert cfg.data.chat_template_kwargs == ("enable_thinking=false",)
    assert template_kwargs(cfg.data.chat_template_kwargs) == {"enable_thinking": False}

    class Tok:
        chat_template = "t"

        def apply_chat_template(self, messages: list, chat_template: str, add_generation_prompt: bool,
                                tokenize: bool, **kwargs: Any) -> list[int]:
            return [1] if kwargs.get("enable_thinking") is False else [1, 2]  # Qwen3: no thinking block

    row = PromptRow("u", "x", ({"role": "user", "content": "hi"},), "")
    kept, _ = tokenize_rows([row], Tok(), 8, template_kwargs={"enable_thinking": False})
    assert kept[0].prompt_ids == (1,)
    with pytest.raises(ConfigError, match=r"data.chat_template_kwargs: 'thinking' must look like name=value"):
        template_kwargs(("thinking",))
