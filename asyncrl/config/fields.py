"""What a schema field carries besides its type and default: its range, the hint its error
message adds, and the pipelines that read it (`knob`); and the range words the validator knows.

A range is written as the words of its error message (`">= 1"`, `"in (0, 1]"`): one table,
`RULES`, turns them into a check, so a message and its check cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

RULES: dict[str, Callable[[float], bool]] = {
    ">= 1": lambda v: v >= 1,
    ">= 0": lambda v: v >= 0,
    "> 0": lambda v: v > 0,
    "> 1": lambda v: v > 1,
    "to -1 (off) or > 0": lambda v: v == -1 or v > 0,
    "to -1 (off) or >= 0": lambda v: v == -1 or v >= 0,
    "to -1 (all) or >= 0": lambda v: v == -1 or v >= 0,
    "in (0, 1]": lambda v: 0 < v <= 1,
    "in [0, 1]": lambda v: 0 <= v <= 1,
    "in [0, 1)": lambda v: 0 <= v < 1,
    "in (0, 10]": lambda v: 0 < v <= 10,
    "in [0, 10]": lambda v: 0 <= v <= 10,
}
"""Range words -> the check; every float is also checked to be finite (no nan, no inf)."""


def knob(default: Any, rule: str = "", *, hint: str = "", read_by: tuple[str, ...] = ()) -> Any:
    """A field with `default`, held to `rule` (a key of `RULES`; every item of a tuple), whose
    error message adds `hint`; `read_by` names the only pipelines that read it (set under
    another, it would do nothing: an error). Example: `n: int = knob(8, ">= 1")`."""
    assert not rule or rule in RULES, f"unknown range {rule!r}: add it to RULES"
    return dataclasses.field(default=default, metadata={"rule": rule, "hint": hint, "read_by": read_by})


def rule_of(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("rule", ""))


def hint_of(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("hint", ""))


def read_by(f: dataclasses.Field[Any]) -> tuple[str, ...]:
    return tuple(f.metadata.get("read_by", ()))
