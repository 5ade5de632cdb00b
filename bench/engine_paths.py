"""Benchmark: decode throughput of TorchEngine's fast forward vs its generic HF-forward path, on the
same random Llama (so the only difference is the forward), plus a GPT-2 of the same size that can
only take the generic path.

Workload: N requests, prompts of 16..32 random tokens, `max_tokens` fixed (decode-dominated),
EOS ignored, temperature 1, all submitted at once. Best of `--repeats` runs; generated tokens /
wall seconds. Writes bench/results/engine_paths.json.

    PYTHONPATH=. python bench/engine_paths.py

It measures throughput only; that both paths equal HF is tested in tests/rollout.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from asyncrl.config.schema import RolloutConfig
from asyncrl.rollout import TorchEngine, run_sync
from asyncrl.rollout.settings import ForwardChoice, engine_settings
from asyncrl.types import GenerationRequest, SamplingParams

HIDDEN, LAYERS, HEADS, VOCAB = 128, 4, 4, 128  # the built-in tiny model's size


def models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                         num_attention_heads=HEADS, num_key_value_heads=2,
                                         intermediate_size=3 * HIDDEN))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS))
    return {"llama": llama.eval(), "gpt2": gpt2.eval()}


def workload(n: int, max_tokens: int) -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, ignore_eos=True)
    return [GenerationRequest(f"r{i}", tuple(torch.randint(1, VOCAB, (int(torch.randint(16, 33, (1,), generator=g)),),
                                                           generator=g).tolist()), params)
            for i in range(n)]


def tokens_per_s(model: torch.nn.Module, forward: ForwardChoice, reqs: list[GenerationRequest],
                 repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        rollout = RolloutConfig(max_num_seqs=len(reqs), kv_budget_tokens=32768)
        engine = TorchEngine(model, 0, engine_settings(rollout, seed=0, forward=forward))
        start = time.perf_counter()
        outs = run_sync(engine, reqs)
        best = max(best, sum(len(o.response_ids) for o in outs) / (time.perf_counter() - start))
        engine.close()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/results/engine_paths.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    reqs = workload(args.requests, args.max_tokens)
    nets = models()
    rows = [{"model": name, "forward": fwd, "tokens_per_s": round(tokens_per_s(nets[name], fwd, reqs, args.repeats), 1)}
            for name, fwd in (("llama", "auto"), ("llama", "generic"), ("gpt2", "auto"))]
    for row in rows:
        print(row)
    result = {"args": vars(args), "torch": torch.__version__, "machine": platform.machine(), "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
