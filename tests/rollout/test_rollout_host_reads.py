"""Host reads per engine step on the CPU (issue 24's proxy for async scheduling): one per step.

On a GPU a host read of a device tensor (`.item()`, `.tolist()`, `int()`, `.cpu()` ...) waits
for the device; the engine's only one is each step's results (token ids and log-probs, one
copy), read a step late. The CPU cannot wait, so the reads are counted as in
tests/training/test_host_syncs.py: tensors the engine places on its device are marked, and
reads of marked tensors are listed. The torch function mode that marks is per thread, so the
engine runs its steps on the event loop's thread here (`InlineExecutor`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import pytest

from asyncrl.rollout import TorchEngine, run_sync
from asyncrl.rollout.runner import StepRunner
from tests.rollout.rollout_testlib import EOS, mixed_requests, settings_of, tiny_model
from tests.training.test_host_syncs import counting, library, ours


class InlineExecutor(Executor):
    """Runs each call at once on the calling thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:  # noqa: BLE001 - handed to the awaiting caller
            future.set_exception(error)
        return future


def counted_run(monkeypatch: pytest.MonkeyPatch, static: bool) -> tuple[list[str], int]:
    """Every host read of a device tensor during a run, and the number of steps queued."""
    launches = [0]
    launch = StepRunner._launch

    def counted(self: StepRunner, plan: Any) -> Any:
        launches[0] += 1
        return launch(self, plan)

    monkeypatch.setattr(StepRunner, "_launch", counted)
    with counting(monkeypatch) as reads:
        eng = TorchEngine(tiny_model("qwen2"), EOS, settings_of(max_num_seqs=4, cuda_graphs=static, seed=0),
                          executor=InlineExecutor())
        outs = run_sync(eng, mixed_requests(6, 9, 4))
    eng.close()
    assert all(o.finish_reason == "length" for o in outs)
    return reads, launches[0]


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_the_engine_reads_the_host_once_per_step(monkeypatch, static):
    reads, steps = counted_run(monkeypatch, static)
    assert steps > 30  # 9 requests through 4 slots: decode, prefill and mixed steps
    assert library(reads) == []
    assert len(ours(reads)) == steps, ours(reads)
    assert len(set(ours(reads))) == 1 and "rollout/runner.py" in ours(reads)[0]  # `_Results.read`


def test_marking_sees_a_read_in_the_step(monkeypatch):
    """The counter is not blind: a decode that reads its attended length from the device (as
    `BatchedForward.decode` does without a host length) adds one read per decode step."""

    def reading_decode(self: StepRunner, rows: int, length: int) -> Any:
        return self.forward.decode(self.cache, self.sampler.tokens[:rows], self.sampler.positions(rows))

    monkeypatch.setattr(StepRunner, "_decode", reading_decode)
    reads, steps = counted_run(monkeypatch, static=False)
    assert len(ours(reads)) > steps + 20
