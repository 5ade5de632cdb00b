"""When the stream trainer starts (SPEC §4), as a pure policy.

A synchronous step waits for its longest responses. The stream trainer computes the gradients of
groups that finished while the rest still generate, so it pays once generation has become
tail-bound: few requests left decoding, the rollout GPUs mostly idle. The rule, one batch at a
time, fed the fraction of the batch's prompts that are done and the engine's request counts:

- check points: the done fraction reaching min_done, min_done + check_every, ..., max_done
  (0.20, 0.25, ..., 0.50 by default); nothing is decided between two check points;
- at a check point, fire when the rollout is tail-bound: no request waits for a slot and
  `running < tail_ratio x peak_running`, the peak being the most requests seen running at once
  in this batch. A decode step costs about the same with half its batch gone (memory-bound), so
  below half the peak the rollout delivers under half its tokens/s;
- at max_done, fire whatever the counts say;
- once fired, stay fired until `reset` (the pipeline then hands every finished group to the
  trainer as it arrives).

No clocks, no I/O: the colocated pipeline and the simulator share it. It does not decide how
many devices move to training, nor build chunks; it only says "start now".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

_EPS = 1e-9  # done fractions are ratios of counts: 5/20 must count as reaching 0.25


@dataclass
class StreamTrigger:
    """Whether streaming has started for the current batch.

    Example (defaults, tail_ratio 0.5; 20 prompts x 8 responses, all fit in the engine):
        observe(0.00, running=160) -> False   peak 160; below min_done
        observe(0.20, running=100) -> False   check point 0.20: 100 >= 0.5 x 160 = 80
        observe(0.22, running=90)  -> False   between check points
        observe(0.25, running=70)  -> True    check point 0.25: 70 < 80, no request waits
        observe(0.30, running=75)  -> True    fired: stays fired until reset()
    With requests waiting the rollout is not tail-bound: observe(0.45, 40, waiting=10) -> False,
    and observe(0.50, 60, waiting=5) -> True only because 0.50 is max_done.
    """

    min_done: float = 0.2
    max_done: float = 0.5
    check_every: float = 0.05
    tail_ratio: float = 0.5
    peak_running: int = field(default=0, init=False)
    fired_at: float | None = field(default=None, init=False)
    """The done fraction at which it fired (None: not yet)."""
    _checked: int = field(default=-1, init=False, repr=False)  # index of the last check point evaluated

    def __post_init__(self) -> None:
        assert 0 < self.min_done <= self.max_done <= 1, "need 0 < min_done <= max_done <= 1"
        assert self.check_every > 0 and 0 < self.tail_ratio <= 1

    @property
    def fired(self) -> bool:
        return self.fired_at is not None

    def check_points(self) -> list[float]:
        """The done fractions at which the rule is evaluated: [0.2, 0.25, ..., 0.5] by default."""
        n = math.floor((self.max_done - self.min_done) / self.check_every + _EPS)
        points = [self.min_done + k * self.check_every for k in range(n + 1)]
        return points if points[-1] >= self.max_done - _EPS else [*points, self.max_done]

    def observe(self, done_fraction: float, running: int, waiting: int = 0) -> bool:
        """Record the rollout's state now; True once streaming has started for this batch."""
        self.peak_running = max(self.peak_running, running)
        if self.fired:
            return True
        point = self._check_point(done_fraction)
        if point is None:
            return False
        self._checked = point
        if done_fraction >= self.max_done - _EPS or self.tail_bound(running, waiting):
            self.fired_at = done_fraction
        return self.fired

    def tail_bound(self, running: int, waiting: int = 0) -> bool:
        """No request waits and fewer than tail_ratio x the peak run."""
        return waiting == 0 and running < self.tail_ratio * self.peak_running

    def reset(self) -> None:
        """A new batch: no peak, no check point passed, not fired."""
        self.peak_running, self.fired_at, self._checked = 0, None, -1

    def _check_point(self, done_fraction: float) -> int | None:
        """Index of the newest check point reached and not yet evaluated (max_done counts as one)."""
        if done_fraction < self.min_done - _EPS:
            return None
        reached = math.floor((min(done_fraction, self.max_done) - self.min_done) / self.check_every + _EPS)
        if done_fraction >= self.max_done - _EPS:
            reached = max(reached, self._checked + 1)  # max_done off the check_every grid
        return reached if reached > self._checked else None
