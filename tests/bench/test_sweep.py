"""bench/sweep.py: the learning-rate sweep's cells, its tuning split (apart from the test split), what
it admits (cells of the protocol without its lr, so setting the pick keeps them) and the pick."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from bench.protocol import content_hash, refusal, stamp
from bench.sweep import summarize, sweep_cells, tuning_file
from tests.bench.test_protocol import BODY, cell, protocol

SWEEP = {"values": [1e-4, 2e-4], "seeds": [100, 101], "arms": ["colocated", "fa_partial"],
         "rule": "highest mean endpoint of colocated", "tuning_split": {"size": 16, "seed": 7}}


def swept(arm: str, lr: float, seed: int, end: float) -> dict:
    c = cell(arm, 0, end - 0.5 - 0.01)  # cell()'s seed 0 adds NOISE[0] = 0.01
    return {**c, **stamp(protocol({**BODY, "lr_sweep": SWEEP}), sweep=True), "lr": lr, "seed": seed}


def test_the_sweep_runs_every_arm_rate_and_seed_alternating() -> None:
    p = protocol({**BODY, "lr_sweep": SWEEP})
    assert sweep_cells(p)[:4] == [("colocated", 1e-4, 100), ("fa_partial", 1e-4, 100),
                                  ("colocated", 2e-4, 100), ("fa_partial", 2e-4, 100)]
    assert len(sweep_cells(p)) == 8


def test_sweep_cells_count_after_the_pick_is_set_and_the_pick_is_colocated_best() -> None:
    body = {**BODY, "lr_sweep": SWEEP}
    cells = [swept("colocated", 1e-4, s, 0.50) for s in (100, 101)] + \
            [swept("colocated", 2e-4, s, 0.55) for s in (100, 101)] + \
            [swept("fa_partial", 2e-4, 100, 0.60)]
    p = protocol(body)
    assert all(refusal(c, p, sweep=True) is None for c in cells)
    assert refusal(cells[0], p) is not None  # a sweep cell never counts for the main comparison
    picked = replace(p, body={**body, "lr": 2e-4}, hash=content_hash({**body, "lr": 2e-4}))
    assert all(refusal(c, picked, sweep=True) is None for c in cells)
    s = summarize(picked, cells)
    assert s["pick"] == "0.0002"
    assert s["table"]["colocated"]["0.0002"]["seeds"] == 2
    assert abs(s["table"]["colocated"]["0.0002"]["mean"] - 0.55) < 1e-9
    assert s["table"]["fa_partial"]["0.0001"]["mean"] is None
    assert summarize(picked, cells[1:])["pick"] is None  # colocated incomplete at 1e-4: no pick yet


def test_the_tuning_split_is_a_jsonl_file_apart_from_the_test_split(tmp_path: Path) -> None:
    from asyncrl.config.load import load_config
    from asyncrl.data.tasks import task_rows
    from bench.convergence import TASKS

    p = protocol({**BODY, "lr_sweep": SWEEP})
    path = tuning_file(p, tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 16 and all(r["data_source"] == "longtail" for r in rows)
    cfg = load_config(None, [*TASKS["longtail_partial"], "data.val_size=32"])
    test = [r.messages[0]["content"] for r in task_rows(cfg.data, 16, seed=7, split="test")]
    tuning = [r["prompt"][0]["content"] for r in rows]
    assert tuning != test and {r["extra_info"]["split"] for r in rows} == {"tune"}
    assert tuning_file(p, tmp_path) == path  # written once
