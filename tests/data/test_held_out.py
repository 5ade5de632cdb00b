"""The held-out prompts: one loader for a run's validation and `asyncrl eval`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.data.dataset import write_jsonl
from asyncrl.data.held_out import val_rows
from asyncrl.data.tasks import make_task
from asyncrl.workers.factory import load_data
from tests.data.test_tokenization import tiny_tokenizer


def test_the_built_in_tasks_test_split_without_val_files() -> None:
    cfg = load_config(None, ["data.val_size=5", "seed=3"])
    rows, sources = val_rows(cfg.data, cfg.seed, tiny_tokenizer(), print)
    assert sources == ["data.task=arithmetic (test split)"]
    assert [r.uid for r in rows] == [r.uid for r in make_task("arithmetic", 5, seed=3, split="test")]
    assert all(r.prompt_ids for r in rows)


def test_val_files_tokenized_without_the_overlong(tmp_path: Path) -> None:
    short, long = tmp_path / "short.jsonl", tmp_path / "long.jsonl"
    write_jsonl(make_task("arithmetic", 3, seed=0, split="test"), str(short))
    rows = make_task("arithmetic", 2, seed=1, split="test")
    write_jsonl([dataclasses.replace(rows[0], messages=({"role": "user", "content": "x" * 80},)), rows[1]], str(long))
    cfg = load_config(None, [f"data.val_files=[{short},{long}]", "data.max_prompt_length=64"])
    logged: list[str] = []
    kept, sources = val_rows(cfg.data, cfg.seed, tiny_tokenizer(), logged.append)
    assert sources == [str(short), str(long)] and len(kept) == 4
    assert all(0 < len(r.prompt_ids) <= 64 for r in kept)
    assert len(logged) == 1 and "drops 1 of 2 prompts in " + str(long) in logged[0]


def test_a_run_validates_on_the_rows_eval_scores(tmp_path: Path) -> None:
    tok, train = tiny_tokenizer(), tmp_path / "train.jsonl"
    cfg = load_config(None, ["data.val_size=4", "data.task_size=64"])
    assert load_data(cfg, tok, print)[1] == val_rows(cfg.data, cfg.seed, tok, print)[0]
    write_jsonl(make_task("arithmetic", 64, seed=0), str(train))
    own_files = load_config(None, [f"data.train_files=[{train}]"])
    assert load_data(own_files, tok, print)[1] == []  # no val_files: a run on its own files does not validate
