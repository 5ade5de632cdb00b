"""The peer baseline: TRL's `GRPOTrainer` on CPU, on the workload of our colocated pipeline.

Same model (the cached tiny Llama and its char tokenizer), task (built-in `arithmetic`, train
split, seed 0), prompt ids (the tokenizer's chat template; checked against `tokenize_rows`),
reward (our `arithmetic` scorer from the registry), group size, lengths, temperature 1.0, lr,
AdamW, warm-up and grad clip. One step = one generation batch of `--prompts` x `--n`
completions, then `--prompts / --mini-batch` optimizer updates as in `colocated.py`
(`actor.ppo_mini_batch_size`); with more than one update TRL recomputes old log-probs, as we
always do. TRL generates with HF `generate` (left-padded, one batch) and its loss is `dapo`
(~ token mean over the mini-batch) with advantages scaled by the group std: our
`token-mean` and GRPO defaults.

Reports seconds per step and completions per second over the steps after the first
(warm-up), the share of a step spent in `generate` and in the whole rollout (generate,
reward, old log-probs, advantages), mean reward of the first and last step, and versions.
It does not run our pipeline, compare learning curves, use vLLM, or retry noisy runs: the
CPU load of other processes is recorded per step, and `s_per_step_clean` averages the steps
where it stayed under `--max-foreign`; run it on an idle machine.

    HF_HUB_OFFLINE=1 python bench/trl_peer.py --steps 8 --prompts 32 --n 8 --max-len 16 \
        --threads 2 --out bench/results/trl_peer.json

TRL is a bench-only dependency: `pip install trl` next to the package.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
import trl
from datasets import Dataset
from engine import ForeignLoad  # bench/engine.py, beside this file
from transformers import PreTrainedTokenizerBase, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from asyncrl.config.schema import Config
from asyncrl.data import make_task, tokenize_rows
from asyncrl.models import load_model
from asyncrl.rewards import resolve_reward_fn
from asyncrl.types import PromptRow

OURS = Config()  # our defaults: the colocated pipeline this benchmark mirrors


class StepTimer(TrainerCallback):
    """Wall time of each generation batch, from the first of its optimizer updates to the last,
    and the CPU cores other processes used meanwhile: with 2 threads on 2 cores, one busy
    foreign core slows a step several-fold, so a step with foreign load is not a clean sample."""

    def __init__(self, updates_per_step: int) -> None:
        self.updates_per_step = updates_per_step
        self.step_s: list[float] = []
        self.foreign_cores: list[float] = []
        self._t0, self._load = 0.0, ForeignLoad()

    def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if state.global_step % self.updates_per_step == 0:
            self._t0, self._load = time.perf_counter(), ForeignLoad().__enter__()

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if state.global_step % self.updates_per_step == 0:
            self.step_s.append(time.perf_counter() - self._t0)
            self._load.__exit__()
            self.foreign_cores.append(self._load.cores)


def prompt_rows(tok: PreTrainedTokenizerBase) -> list[PromptRow]:
    """The training prompts exactly as `workers/factory.py:load_data` builds them."""
    d = OURS.data
    rows = make_task(d.task, d.task_size, seed=OURS.seed, split="train")
    kept, _ = tokenize_rows(rows, tok, d.max_prompt_length)
    return kept


def as_dataset(rows: list[PromptRow]) -> Dataset:
    """Conversational prompts, so TRL applies the same chat template we do."""
    return Dataset.from_list([{"prompt": [dict(m) for m in r.messages], "ground_truth": r.ground_truth,
                               "data_source": r.data_source} for r in rows])


def reward_fn(batches: list[dict[str, float]]) -> Callable[..., list[float | None]]:
    """Our registry scorer in TRL's reward signature; records the mean reward and completion
    length (tokens, EOS included) of each generation batch."""

    def arithmetic(completions: list[Any], completion_ids: list[list[int]], ground_truth: list[str],
                   data_source: list[str], **_: Any) -> list[float | None]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores_B = [float(resolve_reward_fn(src)(src, text, gt, {}))
                    for src, text, gt in zip(data_source, texts, ground_truth)]
        batches.append({"reward": sum(scores_B) / len(scores_B),
                        "completion_tokens": sum(map(len, completion_ids)) / len(completion_ids)})
        return [*scores_B]  # TRL's type allows None (no score) per completion

    return arithmetic


def grpo_config(args: argparse.Namespace, out_dir: str) -> GRPOConfig:
    completions, updates = args.prompts * args.n, args.prompts // args.mini_batch
    assert args.prompts % args.mini_batch == 0, "--prompts must be a multiple of --mini-batch"
    a = OURS.actor
    return GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        logging_strategy="no", disable_tqdm=True, gradient_checkpointing=False, seed=OURS.seed,
        max_steps=args.steps * updates,
        per_device_train_batch_size=completions // updates, gradient_accumulation_steps=1,
        steps_per_generation=updates, num_generations=args.n,
        max_completion_length=args.max_len, temperature=OURS.rollout.temperature, top_k=0, top_p=1.0,
        beta=0.0, loss_type="dapo", scale_rewards="group", epsilon=a.clip_ratio_low,
        learning_rate=a.lr, lr_scheduler_type="constant_with_warmup", warmup_steps=a.warmup_steps,
        weight_decay=a.weight_decay, adam_beta1=a.betas[0], adam_beta2=a.betas[1],
        max_grad_norm=a.grad_clip,
        generation_kwargs={"min_new_tokens": args.max_len} if args.forced else None)


def time_method(obj: Any, name: str, seconds: list[float]) -> None:
    """Wrap `obj.name` so each call appends its wall time to `seconds`."""
    inner = getattr(obj, name)

    def timed(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            seconds.append(time.perf_counter() - t0)

    setattr(obj, name, timed)


def check_prompt_ids(trainer: GRPOTrainer, rows: list[PromptRow]) -> None:
    """TRL's own prompt tokenization must give the ids our pipeline generates from."""
    ids, _, _ = trainer._tokenize_prompts([[dict(m) for m in r.messages] for r in rows])
    assert [list(x) for x in ids] == [list(r.prompt_ids) for r in rows], "prompt ids differ from ours"


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model, tok = load_model(OURS.model, print)
    rows = prompt_rows(tok)
    batches: list[dict[str, float]] = []
    gen_s: list[float] = []
    rollout_s: list[float] = []
    timer = StepTimer(args.prompts // args.mini_batch)
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=reward_fn(batches),
                              args=grpo_config(args, out_dir), train_dataset=as_dataset(rows),
                              callbacks=[timer])
        check_prompt_ids(trainer, rows[:8])
        time_method(trainer, "_generate", gen_s)
        time_method(trainer, "_generate_and_score_completions", rollout_s)
        trainer.train()
    return summary(args, timer, gen_s, rollout_s, batches)


def summary(args: argparse.Namespace, timer: StepTimer, gen_s: list[float], rollout_s: list[float],
            batches: list[dict[str, float]]) -> dict[str, Any]:
    step_s, foreign = timer.step_s, timer.foreign_cores
    assert len(step_s) == len(gen_s) == len(rollout_s) == len(batches) == args.steps >= 2, \
        "one generation per step expected; run at least 2 steps (the first is warm-up)"
    timed = slice(1, None)  # the first step is warm-up
    s_per_step = statistics.mean(step_s[timed])
    clean_s = [s for s, f in zip(step_s[timed], foreign[timed]) if f <= args.max_foreign]
    completions = args.prompts * args.n
    return {
        "framework": f"trl {trl.__version__} GRPOTrainer", "steps": args.steps, "timed_steps": args.steps - 1,
        "completions_per_step": completions, "optimizer_updates_per_step": args.prompts // args.mini_batch,
        "s_per_step": s_per_step, "s_per_step_median": statistics.median(step_s[timed]),
        "completions_per_s": completions / s_per_step,
        "generate_share": sum(gen_s[timed]) / sum(step_s[timed]),
        "rollout_share": sum(rollout_s[timed]) / sum(step_s[timed]),
        "reward_first_step": batches[0]["reward"], "reward_last_step": batches[-1]["reward"],
        "completion_tokens_mean": statistics.mean(b["completion_tokens"] for b in batches),
        "foreign_cores_max": max(foreign[timed]), "clean_steps": len(clean_s),
        "s_per_step_clean": statistics.mean(clean_s) if clean_s else None,
        "per_step": [{"s": s, "generate_s": g, "rollout_s": r, **b, "foreign_cores": f}
                     for s, g, r, b, f in zip(step_s, gen_s, rollout_s, batches, foreign)],
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                     "torch": torch.__version__, "python": platform.python_version()},
        "args": vars(args), "cpus": os.cpu_count(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="generation batches; the first is warm-up")
    ap.add_argument("--prompts", type=int, default=OURS.data.train_batch_size, help="prompts per step")
    ap.add_argument("--n", type=int, default=OURS.rollout.n, help="completions per prompt")
    ap.add_argument("--max-len", type=int, default=OURS.data.max_response_length, help="max completion tokens")
    ap.add_argument("--forced", action="store_true",
                    help="every completion is --max-len tokens (EOS suppressed), as rollout.ignore_eos=true")
    ap.add_argument("--mini-batch", type=int, default=OURS.actor.ppo_mini_batch_size,
                    help="prompts per optimizer update")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--max-foreign", type=float, default=0.2,
                    help="a step is clean when other processes used at most this many cores")
    ap.add_argument("--out", default="bench/results/trl_peer.json")
    args = ap.parse_args()
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
