"""What the model generated, readable: which responses a step logs (whole groups, seeded), the
fields of each line, generations.jsonl rolled back on resume, TensorBoard's and W&B's tables, and
`trainer.log_generations=0` logging nothing. The end-to-end lines of a real run:
tests/pipelines/test_colocated.py (resume) and tests/test_eval.py (`asyncrl eval`)."""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest

from asyncrl.config import load_config
from asyncrl.pipelines.common import log_generations
from asyncrl.telemetry.generations import FIELDS, markdown_table, pick, records
from asyncrl.telemetry.loggers import make_tracker
from asyncrl.types import Group, PromptRow, Trajectory


def group(uid: str, n: int, reward: float = 1.0) -> Group:
    row = PromptRow(uid=uid, data_source="arithmetic", messages=(), ground_truth="5", prompt_ids=(7, 8))
    trajs = [Trajectory(f"{uid}/{i}", (7, 8), [1, 2, 3], [0.0] * 3, [2, 2, 3], "stop", reward=reward,
                        reward_details={"score": reward, "format": float("nan")}, reward_status="ok")
             for i in range(n)]
    return Group(uid, row, trajs)


def decode(ids) -> str:
    return " ".join(f"t{i}" for i in ids)


def test_pick_takes_whole_groups_in_a_seeded_order_until_k_responses():
    groups = [group(f"g{i}", 4) for i in range(5)]
    picked = pick(groups, 6, "0/train/3")
    assert [len(ts) for _, ts in picked] in ([4, 2], [2, 4])  # one group whole, two of another
    assert [g.uid for g, _ in picked] == sorted(g.uid for g, _ in picked)  # in batch order
    assert pick(groups, 6, "0/train/3") == picked  # seeded: the same every time
    assert len({tuple(g.uid for g, _ in pick(groups, 4, f"0/train/{s}")) for s in range(20)}) > 1  # varies by step
    assert sum(len(ts) for _, ts in pick(groups, -1, "k")) == 20 and pick(groups, 0, "k") == []


def test_a_record_holds_the_texts_the_reward_and_its_parts_and_the_versions():
    [line] = records(pick([group("p@1", 1, reward=0.5)], 1, "s"), 1, "train", decode)
    assert tuple(line) == FIELDS
    assert line == {"step": 1, "split": "train", "group": "p@1", "sample": "p@1/0", "data_source": "arithmetic",
                    "prompt": "t7 t8", "response": "t1 t2 t3", "ground_truth": "5", "reward": 0.5,
                    "reward_parts": {"score": 0.5, "format": None}, "reward_status": "ok", "finish_reason": "stop",
                    "response_tokens": 3, "start_version": 2, "end_version": 3}
    json.dumps(line, allow_nan=False)  # strict JSON: a non-finite part is null


def test_markdown_table_escapes_cells():
    [line] = records(pick([group("p", 1)], 1, "s"), 1, "val", lambda ids: "a|b\nc")
    table = markdown_table([line])
    assert table.splitlines()[0] == "1 of 1 responses"
    assert "| p/0 | 1.0 | score=1 format=null | 2-3 | a\\|b<br>c | a\\|b<br>c |" in table


def tracker(tmp_path, names, initial_step=0):
    paths = {"train": tmp_path / "generations.jsonl", "val": tmp_path / "generations.jsonl"}
    return make_tracker(names, tmp_path, total_steps=10, initial_step=initial_step, project="p", experiment="e",
                        config={}, log=lambda _: None, generations=paths)


def lines(path) -> list[tuple[str, int]]:
    return [(r["split"], r["step"]) for r in map(json.loads, path.read_text().splitlines())]


def test_generations_jsonl_rolls_back_to_the_checkpoint_on_resume(tmp_path):
    t = tracker(tmp_path, [])
    for step in range(4):
        split = "val" if step % 2 == 0 else "train"
        t.log_generations(split, records(pick([group("p", 2)], 2, "s"), step, split, decode), step)
    t.close()
    tracker(tmp_path, [], initial_step=2).close()  # resumed from step 2's checkpoint
    assert [s for _, s in lines(tmp_path / "generations.jsonl")] == [0, 0, 1, 1, 2, 2]
    tracker(tmp_path, []).close()  # a fresh run appends, as metrics.jsonl does
    assert len(lines(tmp_path / "generations.jsonl")) == 6


def test_tensorboard_text_and_wandb_table(tmp_path, monkeypatch):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    logged: list[tuple[dict[str, Any], int]] = []
    wandb: Any = types.ModuleType("wandb")
    wandb.Table = lambda columns, data: SimpleNamespace(columns=columns, data=data)
    wandb.init = lambda **kwargs: SimpleNamespace(id="r", log=lambda m, step: logged.append((m, step)),
                                                  finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    t = tracker(tmp_path, ["tensorboard", "wandb"])
    t.log_generations("train", records(pick([group("p", 2)], 2, "s"), 3, "train", decode), 3)
    t.close()
    [(metrics, step)] = logged
    table = metrics["generations/train"]
    assert step == 3 and table.columns[0] == "sample" and [r[0] for r in table.data] == ["p/0", "p/1"]
    acc = accumulator.EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    [event] = acc.Tensors("generations/train/text_summary")
    assert event.step == 3 and "| p/1 |" in event.tensor_proto.string_val[0].decode()


class RecordingTracker:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def log_generations(self, split: str, rows: list[dict[str, Any]], step: int) -> None:
        self.calls.append((split, step, len(rows)))


@pytest.mark.parametrize(("overrides", "tokenizer", "expected"), [
    ([], "tok", [("train", 5, 16), ("val", 5, 20)]),  # 16 of the 20 trained; every validation response
    (["trainer.log_generations=0", "trainer.log_val_generations=3"], "tok", [("val", 5, 3)]),
    ([], None, []),  # the simulator: no tokenizer, no text
])
def test_a_step_logs_the_configured_number_of_responses(overrides, tokenizer, expected):
    tok = SimpleNamespace(decode=lambda ids, skip_special_tokens: decode(ids)) if tokenizer else None
    ctx = SimpleNamespace(cfg=load_config(None, overrides), tokenizer=tok, tracker=RecordingTracker())
    groups = [group(f"g{i}", 4) for i in range(5)]
    log_generations(ctx, "train", 5, groups)
    log_generations(ctx, "val", 5, groups)
    assert ctx.tracker.calls == expected
