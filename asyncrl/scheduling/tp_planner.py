"""RollPacker's parallelism planner (SPEC §4) as a pure policy: the rollout tensor-parallel size
for the next step, from this step's KV-cache preemptions.

A jump in preemptions (more than `growth` x the previous step's count, and more than zero)
doubles TP: an engine of twice the devices holds more than twice the KV cache (the weights are
stored once per engine), so long responses stop being preempted and recomputed. `calm_steps`
steps in a row without a preemption halve it, never below `min_tp` (the size the run was
configured with: below it the KV cache may not hold the run's sequences at all, and halving
there only trades a calm stretch for a storm of preemptions). TP never exceeds `max_tp` and only takes sizes that divide
`gpus_per_node` (when it is set), so a TP group never crosses a node; a doubling that would
break either rule leaves TP where it is.

No clocks, no I/O, no config objects: the pipelines (`asyncrl.pipelines.planning`) and the
simulator share it. It does not change any engine; the caller applies the size it returns.
"""

from __future__ import annotations


class TPPlanner:
    """The TP size for the next step, one `step(preemptions)` call per finished step.

    The first step compares with zero preemptions before the run, so any preemption in it is a
    jump. Worked example (tp=1, growth=1.05, calm_steps=2, max_tp=8, gpus_per_node=4), the
    steps' preemptions and the TP returned after each:

        step          1   2   3   4   5   6   7   8   9
        preemptions   0   3   3   4  10   0   0   0   0
        TP after      1   2   2   4   4   4   2   2   1

    Step 1: no preemption, one calm step (2 needed). Step 2: 3 > 1.05 x 0 and > 0: double.
    Step 3: 3 <= 1.05 x 3 = 3.15: no jump. Step 4: 4 > 3.15: double. Step 5: 10 > 1.05 x 4, but
    8 exceeds a node's 4 GPUs: TP stays 4. Step 7: the second calm step in a row halves TP and
    restarts the calm count, so step 8 does not halve again and step 9 does.
    """

    def __init__(self, tp: int, growth: float = 1.05, calm_steps: int = 4, max_tp: int = 8,
                 gpus_per_node: int = 0, min_tp: int = 1) -> None:
        assert tp >= min_tp >= 1 and growth > 0 and calm_steps >= 1 and max_tp >= 1 and gpus_per_node >= 0
        self.tp = tp
        self.min_tp = min_tp
        self.growth = growth
        self.calm_steps = calm_steps
        self.max_tp = max_tp
        self.gpus_per_node = gpus_per_node
        self.previous = 0
        """The previous step's preemptions (0 before the first step)."""
        self.calm = 0
        """Steps in a row without a preemption, since the last halving."""

    def step(self, preemptions: int) -> int:
        """Record one step's preemptions; returns the TP size for the next step."""
        assert preemptions >= 0, "preemptions per step are a count"
        jump = preemptions > 0 and preemptions > self.growth * self.previous
        self.previous = preemptions
        self.calm = 0 if preemptions else self.calm + 1
        if jump:
            self.tp = self._doubled()
        elif self.calm >= self.calm_steps:
            self.tp, self.calm = max(self.tp // 2, self.min_tp), 0
        return self.tp

    def allowed(self, tp: int) -> bool:
        """A size within `max_tp` whose groups tile a node (any size when nodes are not known)."""
        return 1 <= tp <= self.max_tp and (self.gpus_per_node == 0 or self.gpus_per_node % tp == 0)

    def _doubled(self) -> int:
        return 2 * self.tp if self.allowed(2 * self.tp) else self.tp
