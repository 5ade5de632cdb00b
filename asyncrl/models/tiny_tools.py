"""The built-in `tiny-tools` model: tiny's architecture with longer positions, warmed up on calculator traces.

`load_tiny_tools(cache_dir)` returns (model, tokenizer) from the user's cache, building it when
missing: random init, then a short supervised pass on tool-call traces (`tool_traces`) for the
`long_addition` task, in the compact call syntax `<tool_call>calculator a+b</tool_call>`: first
exact traces only, until greedy decoding copies the question into the call and the tool's result
into the answer, then a few steps of mixed traces (direct answers, wrong copies). The
warmed model calls the calculator in about `tool_share` of its samples (greedy: nearly always)
and copies the result, sometimes wrongly; otherwise it tries the sum itself and mostly fails.
RL with the tool therefore has a clear gap to close (call the tool every time, copy exactly),
and without the tool (its calls unanswered) the same model scores little.

It has its own spec and cache key (`tiny_tools-<hash>`), so `tiny` and its cache are untouched.
It is for tests and benchmarks of multi-turn episodes on CPU, not a useful language model.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from asyncrl.data import make_task
from asyncrl.models import cache
from asyncrl.models.tiny import TinySpec, bucketed_step, build_model
from asyncrl.models.tool_traces import TraceMix, build_tool_tokenizer, encode_traces, sft_traces, tool_loop_accuracy

NAME = "tiny-tools"
"""`model.path=tiny-tools`."""


@dataclass(frozen=True)
class TinyToolsSpec:
    """Positions and warm-up of the tiny-tools model (its layers are `TinySpec`'s); its hash, with
    the architecture's, names the cache directory."""

    max_positions: int = 1024
    min_digits: int = 6
    max_digits: int = 10
    small_max_operand: int = 99
    tool_share: float = 0.65
    copy_noise: float = 0.15
    warmup_max_steps: int = 1600
    """Stage 1's limit: tool traces only, operands of 1..max_digits digits, until greedy copies."""
    copy_batch: int = 8
    """Stage 1's batch: copying appears after about 6-9K traces at 8, 19K at 32 (and not in 3K
    steps at 4), so 8 reaches it in a third of the time (about 65 s on one core)."""
    probe_from: int = 400
    probe_every: int = 50
    mix_steps: int = 60
    """Stage 2: the mixed traces (`mix()`), which set the starting point RL improves on."""
    warmup_batch: int = 32
    """Stage 2's batch."""
    warmup_lr: float = 1e-3
    target_calls: float = 0.9
    target_copied: float = 0.75
    probe_size: int = 32
    seed: int = 0

    def arch(self) -> TinySpec:
        """tiny's layers with these positions (its warm-up fields are unused here)."""
        return TinySpec(max_positions=self.max_positions, seed=self.seed)

    def mix(self) -> TraceMix:
        """Stage 2's traces: a tool_share of calls, the rest answered directly, some copies wrong."""
        return TraceMix(self.min_digits, self.max_digits, self.small_max_operand, self.tool_share, self.copy_noise)

    def copy_mix(self) -> TraceMix:
        """Stage 1's traces: every long addition calls the tool and copies exactly; short operands
        too, where copying is learnt first."""
        return TraceMix(1, self.max_digits, self.small_max_operand, 1.0, 0.0, small_share=0.0)

    def key(self) -> str:
        fields = {"tools": asdict(self), "arch": asdict(self.arch()), "profile": cache.profile()}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
        return f"tiny_tools-{digest[:12]}"


def warm_up(model: LlamaForCausalLM, tok: PreTrainedTokenizerBase, spec: TinyToolsSpec,
            log: Callable[[str], None] = print) -> dict[str, float]:
    """Stage 1: SFT on exact tool traces until greedy decoding calls the calculator on
    `target_calls` of a probe and copies its result on `target_copied` of those (or
    `warmup_max_steps`); copying appears abruptly, after a few hundred steps at lr 1e-3 (at 3e-3
    it did not within 500; at 2e-3 and batch 16 not within 650). Stage 2: `mix_steps` on the mixed
    traces. Greedy copying is noisy at batch 8 once it appears (0.4-0.9 from one probe to the next),
    and stage 2's wrong copies lower it again (to about 0.7), so stage 1 stops at `target_copied`
    0.75 rather than waiting for a higher one that RL then has less room to improve on."""
    opt = torch.optim.AdamW(model.parameters(), lr=spec.warmup_lr, weight_decay=0.0)
    questions, answers = probe(spec, spec.probe_size, split="train", seed=spec.seed + 10_000)
    start, step, greedy = time.perf_counter(), 0, {"accuracy": 0.0, "calls": 0.0, "copied": 0.0}
    for step in range(1, spec.warmup_max_steps + 1):
        model.train()
        loss = sft_step(model, opt, tok, sft_traces(tok, spec.copy_mix(), spec.copy_batch, spec.seed + step))
        if step % spec.probe_every == 0 and step >= spec.probe_from:
            model.eval()
            greedy = tool_loop_accuracy(model, tok, questions, answers, tools=True)
            log(f"tiny-tools warm-up step {step}: loss {loss.item():.3f}, greedy calls {greedy['calls']:.2f}, "
                f"copied {greedy['copied']:.2f}")
            if greedy["calls"] >= spec.target_calls and greedy["copied"] >= spec.target_copied:
                break
    copy_steps = step
    model.train()
    for step in range(copy_steps + 1, copy_steps + spec.mix_steps + 1):
        sft_step(model, opt, tok, sft_traces(tok, spec.mix(), spec.warmup_batch, spec.seed + step))
    model.eval()
    greedy = tool_loop_accuracy(model, tok, questions, answers, tools=True)
    return {"copy_steps": float(copy_steps), "steps": float(step), "seconds": time.perf_counter() - start,
            **{f"greedy_{k}": v for k, v in greedy.items()}}


def sft_step(model: LlamaForCausalLM, opt: torch.optim.Optimizer, tok: PreTrainedTokenizerBase,
             traces: list[list[tuple[list[int], bool]]]) -> torch.Tensor:
    """One optimizer step on the traces' mean token loss, in two length buckets (short direct
    answers are not padded to the long tool traces: a third fewer tokens)."""
    traces = sorted(traces, key=lambda segs: sum(len(ids) for ids, _ in segs))
    buckets = [traces[: len(traces) // 2], traces[len(traces) // 2:]]
    return bucketed_step(model, opt, [encode_traces(b, int(tok.pad_token_id)) for b in buckets if b])


def probe(spec: TinyToolsSpec, n: int, *, split: str, seed: int) -> tuple[list[str], list[str]]:
    """n long additions (questions, answers) of the spec's sizes."""
    rows = make_task("long_addition", n, seed=seed, split=split, min_digits=spec.min_digits,
                     max_digits=spec.max_digits)
    return [r.messages[0]["content"] for r in rows], [r.ground_truth for r in rows]


def sampled_accuracies(model: LlamaForCausalLM, tok: PreTrainedTokenizerBase, spec: TinyToolsSpec,
                       n: int = 64) -> dict[str, float]:
    """Accuracy on the test split sampled at temperature 1 (as RL samples), with and without the tool."""
    questions, answers = probe(spec, n, split="test", seed=spec.seed)
    torch.manual_seed(spec.seed)
    with_tool = tool_loop_accuracy(model, tok, questions, answers, tools=True, temperature=1.0)
    without = tool_loop_accuracy(model, tok, questions, answers, tools=False, temperature=1.0)
    return {"sampled_tool_accuracy": with_tool["accuracy"], "sampled_tool_calls": with_tool["calls"],
            "sampled_no_tool_accuracy": without["accuracy"]}


def build(spec: TinyToolsSpec, log: Callable[[str], None]) -> tuple[PreTrainedModel, PreTrainedTokenizerBase,
                                                                 dict[str, Any]]:
    """A new tiny-tools model of `spec`, warmed up (the child process of `cache.load_or_build` runs it)."""
    tok = build_tool_tokenizer()
    model = build_model(spec.arch(), len(tok), int(tok.pad_token_id), int(tok.eos_token_id))
    report = warm_up(model, tok, spec, log)
    model.eval()
    report.update(sampled_accuracies(model, tok, spec))
    log(f"{NAME} warmed up: {json.dumps(report)}")
    return model, tok, report


def load_tiny_tools(cache_dir: Path | None = None, spec: TinyToolsSpec = TinyToolsSpec(), rebuild: bool = False,
                    log: Callable[[str], None] = print) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The cached tiny-tools model, built and warmed up on first use (its report in warmup.json)."""
    path = (cache_dir or cache.cache_dir()) / spec.key()
    return cache.load_or_build(path, f"{__name__}:build", spec, NAME, rebuild, log)
