"""Running a pipeline in-process on the tiny model and reading what it wrote."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.pipelines import pipeline_module
from asyncrl.pipelines.context import RunContext
from asyncrl.pipelines.setup import build_context


def make_context(out: Path, *overrides: str) -> RunContext:
    cfg = load_config(None, [f"trainer.output_dir={out}", "trainer.logger=[jsonl]", "num_threads=1",
                             *overrides])
    return build_context(cfg, log=lambda _: None)


def run_pipeline(out: Path, *overrides: str) -> list[dict]:
    ctx = make_context(out, *overrides)
    asyncio.run(pipeline_module(ctx.cfg.pipeline).run(ctx))
    return read_jsonl(out / "metrics.jsonl")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def val_scores(rows: list[dict]) -> list[float]:
    return [r["val/score/mean"] for r in rows if "val/score/mean" in r]
