"""bench/trainer_throughput.py's CPU path at a tiny size: the defaults run whatever the time
budget, an A/B configuration runs when it fits and is recorded as skipped when it does not, when
this tree lacks its key or when it is the device's defaults, each configuration is appended to the
results file with its budget, attention path, forward/backward/optimizer split, FLOP rates and
compile cost, and `Tensor.backward` is the real one again afterwards."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import torch

from bench import trainer_throughput as bench

TINY = ["--device", "cpu", "--rows", "4", "--prompt-len", "4,8", "--median", "6", "--max-row", "32", "--steps", "1",
        "--threads", "1"]
BOGUS = bench.Setup("bogus", ("model.no_such_key=1",), "a key this tree lacks")


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_defaults_run_first_and_ab_configurations_run_while_they_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "SETUPS", (*bench.SETUPS, BOGUS))
    backward = torch.Tensor.backward
    out = tmp_path / "tt.jsonl"
    bench.run(bench.parse([*TINY, "--configs", "budget8192,bogus,packed", "--time-budget-s", "1e6", "--out", str(out)]))
    meta, packed, budget, bogus = rows(out)
    assert meta["meta"]["workload"]["rows"] == 4
    assert [r["config"] for r in (packed, budget, bogus)] == ["packed", "budget8192", "bogus"]
    assert packed["status"] == budget["status"] == "ran" and budget["micro_batch_tokens"] == 8192
    assert packed["micro_batch_tokens"] > 0 and packed["steps"] == 1
    assert packed["attention_path"] == "grouped" and packed["attention_calls"]["grouped"] > 0  # the CPU's path
    assert packed["head"].startswith("full logits")  # the tiny vocabulary keeps full logits on the CPU
    for key in ("backward_s_median", "optimizer_s_median", "tokens_per_s", "tflops_executed", "peak_rss_gb"):
        assert packed[key] > 0, key
    assert packed["forward_s_median"] > 0
    assert packed["mfu_verl"] is None and packed["mfu_executed"] is None  # no peak to compare with on a CPU
    assert packed["compiled"] is False and packed["recompiles"] == 0  # the CPU's default: eager layers
    assert bogus["status"] == "skipped" and "model.no_such_key" in bogus["reason"]
    assert torch.Tensor.backward is backward


def test_ab_configurations_past_the_time_budget_are_recorded_as_skipped(tmp_path):
    out = tmp_path / "tt.jsonl"
    bench.run(bench.parse([*TINY, "--configs", "packed,budget8192,eager", "--time-budget-s", "0", "--out", str(out)]))
    _, packed, budget, eager = rows(out)
    assert packed["status"] == "ran"
    assert budget["status"] == "skipped" and budget["reason"].startswith("time budget")
    assert eager["status"] == "skipped" and eager["reason"] == "the defaults on cpu are this configuration"


def test_a_failing_configuration_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch):
    measure = bench.measure

    def crashing(args, cfg, batch):  # type: ignore[no-untyped-def]
        if cfg.actor.ppo_micro_batch_tokens == 8192:
            raise RuntimeError("dynamo: an op it cannot trace\nsecond line")
        return measure(args, cfg, batch)

    monkeypatch.setattr(bench, "measure", crashing)
    out = tmp_path / "tt.jsonl"
    bench.run(bench.parse([*TINY, "--configs", "packed,budget8192,padded", "--time-budget-s", "1e6",
                           "--out", str(out)]))
    _, packed, budget, padded = rows(out)
    assert budget["status"] == "failed" and budget["reason"] == "RuntimeError: dynamo: an op it cannot trace"
    assert packed["status"] == padded["status"] == "ran"


def test_the_compile_rows_follow_the_default_so_cuda_runs_the_compiled_one():
    setups = {s.name: s for s in bench.SETUPS}
    assert setups["eager"].default_on == ("cpu", "cuda")  # compile is off by default everywhere until measured
    assert setups["compiled"].default_on == ()


class FakeEvent:
    """torch.cuda.Event on the host clock, elapsed in milliseconds as CUDA's."""

    def __init__(self, enable_timing: bool) -> None:
        assert enable_timing

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) * 1000


def test_the_split_reads_cuda_events_in_seconds(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = time.perf_counter()
    with bench.split_step(SimpleNamespace(optimizer=optimizer), bench.Clock(torch.device("cuda"))) as split:
        for _ in range(2):
            model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
    wall = time.perf_counter() - start
    assert split["backward_s"] > 0 and split["optimizer_s"] > 0 and split["forward_s"] >= 0
    assert split["backward_s"] + split["optimizer_s"] <= split["step_s"] <= wall  # seconds, not milliseconds
