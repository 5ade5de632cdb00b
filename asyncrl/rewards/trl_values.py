"""A TRL-signature reward function's values, checked: n finite numbers or None, else why not, in a line.

Shared by the places such a function runs (`batch_functions.py` in this process, the reward pool's
worker processes, `pool.py`), which therefore all refuse the same things the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DRIVER_PREFIX = "driver:"
"""`reward.functions` entries naming a callable registered in the driver process (`batch_functions.py`)."""


def function_name(spec: str) -> str:
    """The detail key of a function's score: its name without module, id or address.

    Example: function_name("my.rewards:accuracy") == "accuracy";
    function_name("driver:<lambda>#7f3a@127.0.0.1:4000/key") == "<lambda>".
    """
    return spec.split("@", 1)[0].removeprefix(DRIVER_PREFIX).rsplit("#", 1)[0].rpartition(":")[2].rsplit(".", 1)[-1]


def batch_values(name: str, values: Any, n: int) -> list[float | None] | str:
    """A function's n values as floats (None kept), or the one-line reason they are not that."""
    if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != n:
        return f"reward function {name} returned {_describe(values)}, not a list of {n} values"
    bad = [v for v in values if not _number_or_none(v)]
    if bad:
        return f"reward function {name} returned {bad[0]!r}, not a finite number or None"
    return [None if v is None else float(v) for v in values]


def _number_or_none(value: Any) -> bool:
    if value is None:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _describe(value: Any) -> str:
    return f"{len(value)} values" if isinstance(value, Sequence) and not isinstance(value, str) else repr(value)[:60]


@dataclass(frozen=True)
class TrainerState:
    """What a reward function reads from TRL's `trainer_state`: the step (asyncrl's policy version)."""

    global_step: int


def call_trl(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """Call a TRL reward function with a batch's keyword arguments, `trainer_state` (carried as a
    dict between processes) as the object TRL passes."""
    state = kwargs.get("trainer_state")
    if isinstance(state, Mapping):
        kwargs = {**kwargs, "trainer_state": TrainerState(**state)}
    return fn(**kwargs)
