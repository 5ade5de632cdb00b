"""Build a tiny model warmed up on one built-in task (`task_models.TaskModelSpec`): `tiny-countdown`, `tiny-longtail`.

`load_task_model(spec)` returns (model, tokenizer) from the user's cache, building it when
missing: tiny's architecture and character tokenizer, random init, then SFT on the task's train
split (with the spec's task options) whose targets come from the task itself (`TARGETS`), a
`label_noise` share of them perturbed, until the greedy mean score on a train-split probe reaches
`target_score`. The right answer becomes the model's mode while its samples spread around it, so
RL starts low but clearly improvable. The held-out split is never seen.

Not here: `tiny` (arithmetic, `tiny.py`, whose spec and cache key are its own) and `tiny-tools`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationMixin, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from asyncrl.data import make_task
from asyncrl.models import cache
from asyncrl.models.task_models import TaskModelSpec
from asyncrl.models.tiny import TinySpec, bucketed_step, build_model, encode_sft, generate_texts
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rewards.registry import compute_score
from asyncrl.types import PromptRow

Target = Callable[[PromptRow, "random.Random | None"], str]
"""A row's SFT answer; with a generator, a perturbed one (the label noise)."""


FLIP = {"+": "-", "-": "+", "*": "/", "/": "*"}


def countdown_target(row: PromptRow, rng: random.Random | None) -> str:
    """The task's constructed solution, bare; perturbed: one of its operations flipped (+ and -,
    * and /), a well-formed expression of another value (the scorer's 0.1; only x*1 and x/1 keep
    theirs). The numbers stay right: the model learns to copy them, and which operation to write
    is what its samples get wrong. Example: "7*(3+2)" -> "7*(3-2)"."""
    solution = str(row.extra_info["solution"])
    if rng is None:
        return solution
    at = rng.choice([i for i, c in enumerate(solution) if c in FLIP])
    return f"{solution[:at]}{FLIP[solution[at]]}{solution[at + 1:]}"


def longtail_target(row: PromptRow, rng: random.Random | None) -> str:
    """The letter k times; perturbed: k moved by 1 to a quarter of k, either way (at least 1 letter).
    Example: k=20 -> 15..19 or 21..25 letters."""
    letters = row.ground_truth
    if rng is None:
        return letters
    k = len(letters)
    shift = rng.randint(1, max(1, k // 4)) * rng.choice([-1, 1])
    return letters[0] * max(k + shift, 1)


TARGETS: dict[str, Target] = {"countdown": countdown_target, "longtail": longtail_target}
"""Task -> its SFT answer; a task without one has no built-in warmed model."""


def sft_pairs(spec: TaskModelSpec, n: int, seed: int, label_noise: float = 0.0) -> list[tuple[str, str]]:
    """(question, answer) pairs from the task's train split with the spec's options; a `label_noise`
    share of answers perturbed (`TARGETS`)."""
    rng = random.Random(seed)
    rows = task_rows(spec, n, split="train", seed=seed)
    target = TARGETS[spec.task]
    return [(r.messages[0]["content"], target(r, rng if rng.random() < label_noise else None)) for r in rows]


def task_rows(spec: TaskModelSpec, n: int, *, split: str, seed: int) -> list[PromptRow]:
    """n rows of the spec's task with its options."""
    return make_task(spec.task, n, seed=seed, split=split, **spec.task_options())


def mean_scores(model: GenerationMixin, tok: PreTrainedTokenizerBase, spec: TaskModelSpec,
                rows: Sequence[PromptRow], temperature: float = 0.0) -> dict[str, float]:
    """Mean score and exact share ("acc") of one response per row, by the task's own scorer."""
    texts = generate_texts(model, tok, [r.messages[0]["content"] for r in rows], spec.max_new_tokens, temperature)
    scores = [_as_dict(compute_score(r.data_source, text, r.ground_truth, dict(r.extra_info)))
              for r, text in zip(rows, texts)]
    return {k: sum(s.get(k, 0.0) for s in scores) / len(scores) for k in ("score", "acc")}


def _as_dict(result: Any) -> dict[str, float]:
    return {k: float(v) for k, v in result.items()} if isinstance(result, dict) else {"score": float(result),
                                                                                      "acc": float(result == 1.0)}


def sft_step(model: LlamaForCausalLM, opt: torch.optim.Optimizer, tok: PreTrainedTokenizerBase,
             pairs: Sequence[tuple[str, str]], buckets: int = 4) -> torch.Tensor:
    """One optimizer step on the answers' mean token loss, the pairs in `buckets` length buckets
    (a long-tailed batch padded to its longest answer would be mostly padding)."""
    ordered = sorted(pairs, key=lambda p: len(p[0]) + len(p[1]))
    size = -(-len(ordered) // buckets)
    return bucketed_step(model, opt, [encode_sft(tok, ordered[i: i + size]) for i in range(0, len(ordered), size)])


def warm_up(model: LlamaForCausalLM, tok: PreTrainedTokenizerBase, spec: TaskModelSpec,
            log: Callable[[str], None] = print) -> dict[str, float]:
    """SFT on the task's noisy answers until the greedy mean score on a train-split probe reaches
    spec.target_score (or spec.warmup_max_steps); then the sampled (temperature 1) score on the
    test split, where RL starts."""
    opt = torch.optim.AdamW(model.parameters(), lr=spec.warmup_lr, weight_decay=0.0)
    probe = task_rows(spec, spec.probe_size, split="train", seed=spec.seed + 10_000)
    start, step, greedy = time.perf_counter(), 0, {"score": 0.0, "acc": 0.0}
    for step in range(1, spec.warmup_max_steps + 1):
        model.train()
        loss = sft_step(model, opt, tok, sft_pairs(spec, spec.warmup_batch, spec.seed + step, spec.label_noise))
        if step % spec.probe_every == 0 and step >= spec.probe_from:
            model.eval()
            greedy = mean_scores(model, tok, spec, probe)
            log(f"{spec.name} warm-up step {step}: loss {loss.item():.3f}, greedy score {greedy['score']:.2f}, "
                f"exact {greedy['acc']:.2f}")
            if greedy["score"] >= spec.target_score:
                break
    model.eval()
    torch.manual_seed(spec.seed)
    sampled = mean_scores(model, tok, spec, task_rows(spec, spec.probe_size, split="test", seed=spec.seed), 1.0)
    return {"steps": float(step), "seconds": time.perf_counter() - start, "greedy_score": greedy["score"],
            "greedy_acc": greedy["acc"], "sampled_score": sampled["score"], "sampled_acc": sampled["acc"]}


def build(spec: TaskModelSpec, log: Callable[[str], None]) -> tuple[PreTrainedModel, PreTrainedTokenizerBase,
                                                                 dict[str, Any]]:
    """A new model of `spec`, warmed up (the child process of `cache.load_or_build` runs it)."""
    tok = build_char_tokenizer()
    model = build_model(TinySpec(**spec.arch()), len(tok), int(tok.pad_token_id), int(tok.eos_token_id))
    report = warm_up(model, tok, spec, log)
    log(f"{spec.name} warmed up: {json.dumps(report)}")
    return model, tok, report


def load_task_model(spec: TaskModelSpec, cache_dir: Path | None = None, rebuild: bool = False,
                    log: Callable[[str], None] = print) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The cached model of `spec`, built and warmed up on first use (its report in warmup.json)."""
    path = (cache_dir or cache.cache_dir()) / spec.key()
    return cache.load_or_build(path, f"{__name__}:build", spec, spec.name, rebuild, log)
