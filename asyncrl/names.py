"""The names registries answer to, defined once: the config validates against these tuples and
each registry is keyed by exactly them (its module asserts so at import).

Imports nothing, so `asyncrl.config` stays light (no torch, no transformers).
"""

from __future__ import annotations

PIPELINES = ("colocated", "one_step_off", "fully_async")
"""`pipeline=`: `asyncrl.pipelines.PIPELINE_MODULES`."""
BACKENDS = ("local", "ray", "processes")
"""`backend=`: the substrates a real run can use (`asyncrl.substrates`); `asyncrl sim` adds "sim"."""
ENGINES = ("torch",)
"""`rollout.engine=`: `asyncrl.rollout.registry.ENGINES`."""
