"""RollPacker's adaptive per-test-case timeout for code rewards (pure policy, no I/O).

For each test case (any hashable key) keep T_anchor = the longest run time of a correct answer
seen so far. The timeout of the case is clamp(lam * T_anchor, lo, hi); a case with no correct
run yet gets `hi`. A looping or very slow answer is then cut at a small multiple of what correct
answers need instead of a fixed worst-case limit, which shortens the reward long tail.

Worked example (lam=1.5, lo=2, hi=30):
    timeout("a")              -> 30.0   (no correct run yet)
    update("a", 4.0, True)    -> T_anchor 4.0, timeout 1.5*4.0 = 6.0
    update("a", 10.0, False)  -> ignored (a wrong answer says nothing about the needed time)
    update("a", 3.0, True)    -> T_anchor stays 4.0 (the longest correct), timeout 6.0
    update("b", 0.5, True)    -> 1.5*0.5 = 0.75, clamped up to lo: 2.0
    update("c", 25.0, True)   -> 1.5*25 = 37.5, clamped down to hi: 30.0
    mean over a, b, c         -> (6.0 + 2.0 + 30.0) / 3 = 12.666...

Not here: measuring run times, passing timeouts to the scorer (`asyncrl.workers.reward`).
"""

from __future__ import annotations

from collections.abc import Hashable


class AdaptiveTimeout:
    def __init__(self, lam: float, lo: float, hi: float) -> None:
        assert lam > 0 and 0 < lo <= hi, (lam, lo, hi)
        self.lam = lam
        self.lo = lo
        self.hi = hi
        self.anchors: dict[Hashable, float] = {}

    def timeout(self, key: Hashable) -> float:
        """clamp(lam * T_anchor, lo, hi); `hi` for a case with no correct run yet."""
        anchor = self.anchors.get(key)
        if anchor is None:
            return self.hi
        return min(self.hi, max(self.lo, self.lam * anchor))

    def update(self, key: Hashable, seconds: float, passed: bool) -> None:
        """Record one run of the case; only a correct run can raise its anchor."""
        if passed and seconds > self.anchors.get(key, -1.0):
            self.anchors[key] = seconds

    def mean_timeout(self) -> float:
        """Mean timeout over the cases with an anchor (`hi` when there are none)."""
        if not self.anchors:
            return self.hi
        return sum(self.timeout(k) for k in self.anchors) / len(self.anchors)
