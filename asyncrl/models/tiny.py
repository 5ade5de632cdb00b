"""The built-in tiny model: a character tokenizer and a small Llama, warmed up by SFT.

`load_tiny(cache_dir)` returns (model, tokenizer) from the user's cache, building it when
missing: random init, then a short supervised pass on the built-in arithmetic task with noisy
labels that stops once greedy accuracy reaches `target_accuracy`: the right answer is the
model's mode but its samples are often near misses, so RL starts from a low but clearly
improvable reward. It is for demos, tests and benchmarks on CPU, not a useful language model.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import (
    BatchEncoding,
    GenerationMixin,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from asyncrl.data import make_task
from asyncrl.models import cache
from asyncrl.models.tokenizer import build_char_tokenizer


@dataclass(frozen=True)
class TinySpec:
    """Size and warm-up of the tiny model; its hash names the cache directory."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_positions: int = 512
    max_operand: int = 19
    warmup_max_steps: int = 600
    warmup_batch: int = 64
    warmup_lr: float = 1e-3
    target_accuracy: float = 0.6
    label_noise: float = 0.5
    seed: int = 0

    def key(self) -> str:
        """The spec and the arithmetic it is warmed up with (`cache.profile`)."""
        fields = {**asdict(self), "profile": cache.profile()}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
        return f"tiny-{digest[:12]}"


# Llama rather than Qwen2: transformers 5 loads any tokenizer saved beside a qwen2 config as
# its own byte-level Qwen2Tokenizer (dropping our character pre-tokenizer); for llama it keeps
# the saved TokenizersBackend, so the cached model reloads with `AutoTokenizer` unchanged.
def build_model(spec: TinySpec, vocab_size: int, pad_id: int, eos_id: int) -> LlamaForCausalLM:
    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size, max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True, pad_token_id=pad_id, eos_token_id=eos_id, bos_token_id=None)
    return LlamaForCausalLM(config)


def arithmetic_examples(n: int, max_operand: int, seed: int, label_noise: float = 0.0) -> list[tuple[str, str]]:
    """(question, answer) pairs from the built-in arithmetic task's train split only, so the
    held-out split stays unseen. With `label_noise`, that share of answers is off by 1-3: the
    model learns the right answer as its mode but samples near misses, like a pretrained LM
    whose greedy answer is often right while its samples are noisy; that gap is what RL closes."""
    rng = random.Random(seed)
    rows = make_task("arithmetic", n, seed=seed, split="train", high=max_operand)
    pairs = []
    for r in rows:
        answer = int(r.ground_truth)
        if rng.random() < label_noise:
            answer = max(answer + rng.choice([-3, -2, -1, 1, 2, 3]), 0)
        pairs.append((r.messages[0]["content"], str(answer)))
    return pairs


def encode_sft(tok: PreTrainedTokenizerBase, pairs: Sequence[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and labels (-100 outside the answer and its end token)."""
    rows, labels = [], []
    for question, answer in pairs:
        prompt = _chat_ids(tok, question)
        target = tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
        rows.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id)
    lab = torch.full((len(rows), width), -100)
    for i, (r, lb) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(lb)] = torch.tensor(lb)
    return ids, lab


def bucketed_step(model: LlamaForCausalLM, opt: torch.optim.Optimizer,
                  encoded: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """One optimizer step on the mean token loss over length buckets of (ids, labels), each
    bucket's loss weighted by its share of the trained tokens (labels other than -100), so the
    step equals one over the whole batch unpadded; returns the loss (the warm-ups of
    `tiny-tools` and the task models: a batch padded to its longest sample is mostly padding)."""
    total = sum(int((labels[:, 1:] != -100).sum()) for _, labels in encoded)
    opt.zero_grad()
    loss = torch.zeros(())
    for ids, labels in encoded:
        part = model(input_ids=ids, labels=labels).loss * (int((labels[:, 1:] != -100).sum()) / total)
        part.backward()
        loss = loss + part.detach()
    opt.step()
    return loss


def _chat_ids(tok: PreTrainedTokenizerBase, question: str) -> list[int]:
    # tokenize=True gives ids: a BatchEncoding (transformers 5) or a list (4.x); the stub's union also has text.
    out = cast("BatchEncoding | list[int]", tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True))
    return list(out["input_ids"] if isinstance(out, BatchEncoding) else out)


@torch.no_grad()
def generate_texts(model: GenerationMixin, tok: PreTrainedTokenizerBase, questions: Sequence[str],
                   max_new_tokens: int, temperature: float = 0.0) -> list[str]:
    """One response text per question, asked as a user turn (HF generate, left padding; greedy at
    temperature 0, special tokens dropped)."""
    tok.padding_side = "left"
    prompts = [_chat_ids(tok, q) for q in questions]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (ids != tok.pad_token_id).long()
    # transformers types generate's self as a Protocol that real models fail under mypy (read-only `device`)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,  # type: ignore[misc, unused-ignore]
                         do_sample=temperature > 0, temperature=temperature or None, top_k=0,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return list(tok.batch_decode(out[:, width:], skip_special_tokens=True))


def sampled_accuracy(model: GenerationMixin, tok: PreTrainedTokenizerBase,
                     pairs: Sequence[tuple[str, str]], temperature: float = 1.0) -> float:
    """Fraction of questions answered exactly, one sample each (`generate_texts`)."""
    texts = generate_texts(model, tok, [q for q, _ in pairs], 6, temperature)
    return sum(t.strip() == a for t, (_, a) in zip(texts, pairs)) / len(pairs)


def warm_up(model: LlamaForCausalLM, tok: PreTrainedTokenizerBase, spec: TinySpec,
            log: Callable[[str], None] = print) -> dict[str, float]:
    """SFT on noisy arithmetic until greedy accuracy reaches spec.target_accuracy (or max steps)."""
    opt = torch.optim.AdamW(model.parameters(), lr=spec.warmup_lr, weight_decay=0.0)
    probe = arithmetic_examples(128, spec.max_operand, seed=spec.seed + 10_000)
    start, acc, step = time.perf_counter(), 0.0, 0
    for step in range(1, spec.warmup_max_steps + 1):
        model.train()
        batch = arithmetic_examples(spec.warmup_batch, spec.max_operand, spec.seed + step, spec.label_noise)
        ids, labels = encode_sft(tok, batch)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 and step >= 50:
            model.eval()
            acc = sampled_accuracy(model, tok, probe, temperature=0.0)
            log(f"tiny warm-up step {step}: loss {loss.item():.3f}, greedy accuracy {acc:.2f}")
            if acc >= spec.target_accuracy:
                break
    return {"steps": float(step), "accuracy": acc, "seconds": time.perf_counter() - start}


def build(spec: TinySpec, log: Callable[[str], None]) -> tuple[PreTrainedModel, PreTrainedTokenizerBase,
                                                            dict[str, Any]]:
    """A new tiny model of `spec`, warmed up (the child process of `cache.load_or_build` runs it)."""
    tok = build_char_tokenizer()
    model = build_model(spec, len(tok), tok.pad_token_id, tok.eos_token_id)
    return model, tok, warm_up(model, tok, spec, log)


def load_tiny(cache_dir: Path | None = None, spec: TinySpec = TinySpec(), rebuild: bool = False,
              log: Callable[[str], None] = print) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The cached tiny model, built and warmed up on first use."""
    path = (cache_dir or cache.cache_dir()) / spec.key()
    return cache.load_or_build(path, f"{__name__}:build", spec, "tiny", rebuild, log)
