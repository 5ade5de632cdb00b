"""Kernel launches of a piece of torch code, counted on the CPU: the proxy for what a GPU step
launches (issue 24: a launch-bound decode graph costs about its kernel count).

Counted: every aten op that runs a kernel (views and allocations run none) outside Triton
launches, plus one per Triton launch, counted by wrapping the interpreter's launcher (while a
kernel runs interpreted, the aten ops it does to move its arguments are not counted). The fast
forward runs no compiled (inductor) region, so there are no generated kernels to add. A
matmul counts as one kernel, as cuBLAS runs it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

NO_KERNEL = frozenset({"empty", "empty_strided", "empty_like", "_unsafe_view", "lift_fresh", "set_"})
"""Aten ops that allocate or re-describe memory without running a kernel (views aside)."""


class LaunchCounter(TorchDispatchMode):
    """`with LaunchCounter() as c:` ... `c.total`; `c.aten` by op name, `c.triton` launches."""

    def __init__(self) -> None:
        super().__init__()
        self.aten: Counter[str] = Counter()
        self.triton = 0
        self._in_triton = False

    @property
    def total(self) -> int:
        return sum(self.aten.values()) + self.triton

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if not self._in_triton and not func.is_view and name not in NO_KERNEL:
            self.aten[name] += 1
        return func(*args, **(kwargs or {}))

    @contextmanager
    def triton_launches(self) -> Iterator[None]:
        """Count Triton launches too (interpreted kernels: TRITON_INTERPRET=1 was set before
        their module was imported)."""
        from triton.runtime.interpreter import InterpretedFunction

        run = InterpretedFunction.run

        def counted(kernel: Any, *args: Any, **kwargs: Any) -> Any:
            self.triton += 1
            self._in_triton = True
            try:
                return run(kernel, *args, **kwargs)
            finally:
                self._in_triton = False

        InterpretedFunction.run = counted  # type: ignore[method-assign]
        try:
            yield
        finally:
            InterpretedFunction.run = run  # type: ignore[method-assign]
