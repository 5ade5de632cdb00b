"""How many prompts make an update, and how many optimizer steps an update takes: computed here
once, for every pipeline, the trainer and the simulator. Pure; no config objects.
"""

from __future__ import annotations


def prompts_per_update(require_batches: int, ppo_mini_batch_size: int) -> int:
    """R of the fully async pipeline: prompts' groups the trainer collects before one update.

    Example: require_batches=4, ppo_mini_batch_size=8 -> 32."""
    return require_batches * ppo_mini_batch_size


def num_mini_batches(num_prompts: int, ppo_mini_batch_size: int) -> int:
    """Optimizer steps of one update on `num_prompts` prompts' groups: whole mini-batches of
    `ppo_mini_batch_size` prompts, at least one (a short last update is one mini-batch).

    Example: (32, 16) -> 2; (40, 16) -> 2; (10, 16) -> 1."""
    return max(1, num_prompts // ppo_mini_batch_size)
