"""The training loops, one per file; `pipeline_module(name)` finds the one `pipeline=` names."""

from __future__ import annotations

import importlib
from types import ModuleType

from asyncrl import names

PIPELINE_MODULES = {"colocated": "asyncrl.pipelines.colocated",
                    "one_step_off": "asyncrl.pipelines.one_step_off",
                    "fully_async": "asyncrl.pipelines.fully_async"}
assert tuple(PIPELINE_MODULES) == names.PIPELINES, "register the pipeline's name in asyncrl.names.PIPELINES"


def pipeline_module(name: str) -> ModuleType:
    """The module whose `async run(ctx) -> int` is pipeline `name`."""
    return importlib.import_module(PIPELINE_MODULES[name])
