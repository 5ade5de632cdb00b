"""Benchmark: log-prob + entropy forward and backward from hidden states, over vocabulary chunks
(`asyncrl.training.vocab_chunks`) against the full-logits path the actor otherwise takes
(`lm_head` logits, then `asyncrl.algorithms.logprobs`), at the tiny model's vocabulary and at
Qwen2's. It decides where the actor's `choose_head` takes the chunked path on each device.

Each case: tokens x hidden -> vocabulary, both outputs in the loss (the actor's entropy bonus),
one warm-up then `--repeats` timed calls alternating between the paths; median seconds reported,
with the peak memory above the inputs on CUDA (`torch.cuda.max_memory_allocated`).

    PYTHONPATH=. python bench/vocab_chunks.py --device cpu    # float32, 1 thread, CPU seconds
    PYTHONPATH=. python bench/vocab_chunks.py --device cuda   # bf16 autocast, Qwen2-0.5B's hidden 896

Writes bench/results/vocab_chunks_<device>.json. Speed only; correctness is in
tests/training/test_vocab_chunks.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import Tensor

from asyncrl.algorithms.logprobs import entropy_from_logits, logprobs_from_logits
from asyncrl.training.vocab_chunks import chunked_log_probs_entropy

# (tokens, hidden, vocabulary) per device: a micro-batch's response tokens at the tiny model's
# and at Qwen2's vocabulary
CASES = {"cpu": [(2048, 128, 128), (512, 128, 151_936)],
         "cuda": [(8192, 896, 128), (8192, 896, 151_936), (16384, 896, 151_936)]}

Head = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def full(hidden: Tensor, weight: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    logits = hidden @ weight.T  # what lm_head returns (bf16 under autocast)
    return logprobs_from_logits(logits, labels), entropy_from_logits(logits)


def chunked(hidden: Tensor, weight: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    return chunked_log_probs_entropy(hidden, weight, labels)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Head, hidden: Tensor, weight: Tensor, labels: Tensor, device: str) -> tuple[float, int]:
    """Seconds of one forward + backward (CPU: the process's CPU seconds, which a busy shared
    machine disturbs far less than wall-clock; run it with one thread), and its peak bytes above
    what was allocated (CUDA; 0 on CPU)."""
    hidden.grad = weight.grad = None
    sync(device)
    base = torch.cuda.memory_allocated() if device == "cuda" else 0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    clock = time.perf_counter if device == "cuda" else time.process_time
    start = clock()
    with torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else nullcontext():
        logp, ent = fn(hidden, weight, labels)
    (logp.sum() + 0.01 * ent.sum()).backward()
    sync(device)
    seconds = clock() - start
    return seconds, (torch.cuda.max_memory_allocated() - base) if device == "cuda" else 0


def run_case(tokens: int, width: int, vocab: int, device: str, repeats: int) -> dict[str, object]:
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(tokens, width, device=device, generator=g).requires_grad_()
    weight = (torch.randn(vocab, width, device=device, generator=g) / width**0.5).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), device=device, generator=g)
    paths: dict[str, Head] = {"full": full, "chunked": chunked}
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    peak: dict[str, int] = {}
    for round_ in range(repeats + 1):
        for name, fn in paths.items():
            s, p = timed(fn, hidden, weight, labels, device)
            if round_:  # the first round warms up
                seconds[name].append(s)
                peak[name] = max(peak.get(name, 0), p)
    row: dict[str, object] = {"tokens": tokens, "hidden": width, "vocab": vocab,
                              "logits_bytes": tokens * vocab * 4}
    for name in paths:
        row[f"{name}_s"] = statistics.median(seconds[name])
        if device == "cuda":
            row[f"{name}_peak_bytes"] = peak[name]
    row["chunked_over_full"] = row["chunked_s"] / row["full_s"]  # type: ignore[operator]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (cpu)")
    ap.add_argument("--out", help="JSON file (default bench/results/vocab_chunks_<device>.json)")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    rows = []
    for tokens, width, vocab in CASES[args.device]:
        row = run_case(tokens, width, vocab, args.device, args.repeats)
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = Path(args.out or f"bench/results/vocab_chunks_{args.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": args.device, "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
