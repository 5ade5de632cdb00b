"""The training loops, one per file; `pipeline_module(name)` finds the one `pipeline=` names,
`run_pipeline(ctx)` runs it as `asyncrl train` does."""

from __future__ import annotations

import asyncio
import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from asyncrl.config import names

if TYPE_CHECKING:
    from asyncrl.pipelines.context import RunContext

PIPELINE_MODULES = {"colocated": "asyncrl.pipelines.colocated",
                    "one_step_off": "asyncrl.pipelines.one_step_off",
                    "fully_async": "asyncrl.pipelines.fully_async"}
assert tuple(PIPELINE_MODULES) == names.PIPELINES, "register the pipeline's name in asyncrl.config.names.PIPELINES"


def pipeline_module(name: str) -> ModuleType:
    """The module whose `async run(ctx) -> int` is pipeline `name`."""
    return importlib.import_module(PIPELINE_MODULES[name])


def run_pipeline(ctx: RunContext) -> int:
    """Run `ctx.cfg.pipeline` to its end; SIGINT and SIGTERM stop it with a checkpoint
    (`asyncrl.pipelines.stopping`, which raises `Stopped` once it is written)."""
    from asyncrl.compute import quiet_event_loop
    from asyncrl.pipelines.stopping import handle_signals

    async def main() -> int:
        quiet_event_loop(asyncio.get_running_loop())
        with handle_signals(ctx.stop):
            return int(await pipeline_module(ctx.cfg.pipeline).run(ctx))

    return asyncio.run(main())
