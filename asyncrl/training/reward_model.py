"""A learned reward model: a frozen sequence classifier that scores (prompt, response) pairs.

`RewardModel.load(cfg, policy_tokenizer, device)` loads `reward.model_path`, a local
`AutoModelForSequenceClassification` directory with one label and its tokenizer, frozen and in
eval mode. `score(rows, trajectories, texts)` returns one float per response: the classifier's
logit, read at the sequence's last token (the model's own pooling).

What the classifier reads:
- its tokenizer is the policy's (same vocabulary and chat template): the trajectory's own
  prompt and response token ids, as the policy saw them;
- it differs (verl's `reward_model.model.input_tokenizer` case): the response text, decoded with
  the policy's tokenizer, re-templated with the reward model's own: the prompt's messages plus an
  assistant turn through its chat template (a raw-text prompt, or a tokenizer without a template:
  prompt text + response text).
Longer inputs than `reward.model_max_length` (0: the model's positions) keep their last tokens,
where the classifier reads its score. Responses are scored `reward.model_batch_size` at a time, in
order of length; the result does not depend on the batching.

How a batch runs (`path`, chosen once when the model is built):
- "packed": the batch's rows back to back as one (1, N) row, no padding, the way the trainer's
  reference and old-log-prob forwards run (`asyncrl.training.packing`): the classifier's base
  model (`base_model_prefix`) switched to `packed_attention` (varlen on CUDA in bf16/fp16, grouped
  sdpa on the CPU) and checked by the trainer's `check_packing`, then its `score` head on each
  row's pooled position (the last token that is not the pad id, where the model's own pooling
  reads). Linear layers run on real tokens only.
- "padded": the whole classifier on a right-padded batch, for what packing does not take: no
  `score` head or base model, a sliding window (packed rows would need transformers' dense mask),
  or a model `check_packing` refuses (`refusal` says why).
With a `compute` executor (the rollout side's compute thread, `asyncrl.compute`) the forwards run
there, between engine steps.

`asyncrl.rewards.reward_model.combine` is how its score joins the rule reward. Not here: where
the model runs (the reward worker, `asyncrl.workers.reward`), the rule rewards (`asyncrl.rewards`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from asyncrl.errors import ConfigError
from asyncrl.rewards.reward_model import KEY, check_reward_model_path

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from asyncrl.config.schema import RewardConfig
    from asyncrl.types import PromptRow, Trajectory

T = TypeVar("T")
ForwardPath = Literal["packed", "padded"]
log = logging.getLogger(__name__)


def same_tokenizer(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    """The same vocabulary and chat template: token ids mean the same to both."""
    same_template = getattr(a, "chat_template", None) == getattr(b, "chat_template", None)
    return bool(same_template and a.get_vocab() == b.get_vocab())


class RewardModel:
    """Thread-safe to call from one thread at a time (the reward worker's scoring thread)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 policy_tokenizer: PreTrainedTokenizerBase, *, batch_size: int, max_length: int,
                 compute: Executor | None = None) -> None:
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.pad_id = int(model.config.pad_token_id)
        self.retemplate = not same_tokenizer(policy_tokenizer, tokenizer)
        self.batch_size = batch_size
        self.max_length = max_length
        self.compute = compute
        self.refusal = packing_refusal(self.model)
        """Why batches run padded ("" when they run packed)."""
        self.path: ForwardPath = "padded" if self.refusal else "packed"
        if self.refusal:
            log.warning("reward model: padded batches (%s)", self.refusal)

    @classmethod
    def load(cls, cfg: RewardConfig, policy_tokenizer: PreTrainedTokenizerBase, device: str = "cpu",
             dtype: torch.dtype | None = None, compute: Executor | None = None) -> RewardModel:
        """The classifier at `cfg.model_path` on `device` (float32 on the CPU, `dtype` elsewhere);
        a one-line ConfigError if it is not one, or does not fit on the device."""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        check_reward_model_path(cfg.model_path)
        where = Path(cfg.model_path).expanduser()
        tokenizer = AutoTokenizer.from_pretrained(where)
        load_dtype = torch.float32 if device == "cpu" or dtype is None else dtype
        model = AutoModelForSequenceClassification.from_pretrained(where, dtype=load_dtype)
        if model.config.pad_token_id is None:  # the model's pooling finds each row's end by its pad id
            model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
                else tokenizer.eos_token_id
        try:
            model = model.to(device)
        except torch.OutOfMemoryError:
            gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
            raise ConfigError(f"{KEY}={cfg.model_path!r}: the reward model ({gb:.1f} GB) does not fit on {device} "
                              "beside the policy's engine and trainer: use a smaller reward model, or lower "
                              "rollout.gpu_memory_utilization") from None
        positions = getattr(model.config, "max_position_embeddings", None) or 0
        max_length = cfg.model_max_length or int(positions) or 1 << 30
        return cls(model, tokenizer, policy_tokenizer, batch_size=cfg.model_batch_size, max_length=max_length,
                   compute=compute)

    def score(self, rows: Sequence[PromptRow], trajectories: Sequence[Trajectory], texts: Sequence[str]) -> list[float]:
        """One score per response (rows[i] is the prompt of trajectories[i], texts[i] its decoded text)."""
        assert len(rows) == len(trajectories) == len(texts), (len(rows), len(trajectories), len(texts))
        inputs = [self.input_ids(r, t, text) for r, t, text in zip(rows, trajectories, texts)]
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
        scores = [0.0] * len(inputs)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            for i, s in zip(chunk, self._run(self.forward, [inputs[i] for i in chunk])):
                scores[i] = s
        return scores

    def input_ids(self, row: PromptRow, traj: Trajectory, text: str) -> list[int]:
        """What the classifier reads for one response (module docstring), its last max_length tokens."""
        if not self.retemplate:
            ids = [*traj.prompt_ids, *traj.response_ids]
        elif row.messages and getattr(self.tokenizer, "chat_template", None):
            messages = [*row.messages, {"role": "assistant", "content": text}]
            ids = _token_ids(self.tokenizer.apply_chat_template(messages, tokenize=True))
        else:
            prompt = row.text or "\n".join(m["content"] for m in row.messages)
            ids = _token_ids(self.tokenizer(prompt + text))
        return ids[-self.max_length:]

    def _run(self, fn: Callable[[T], list[float]], arg: T) -> list[float]:
        return self.compute.submit(fn, arg).result() if self.compute is not None else fn(arg)

    def forward(self, batch: list[list[int]], path: ForwardPath | None = None) -> list[float]:
        """One score per row of token ids, by `path` (default: the model's `self.path`)."""
        import torch

        try:
            with torch.no_grad():
                scores = (self._packed if (path or self.path) == "packed" else self._padded)(batch)
        except torch.OutOfMemoryError:
            raise ConfigError(f"reward.model_batch_size={self.batch_size}: a batch of {len(batch)} rows "
                              f"({sum(map(len, batch))} tokens, the longest {max(map(len, batch))}) does not fit "
                              "in the reward model's device memory; lower it") from None
        return [float(v) for v in scores.float().cpu()]

    def _packed(self, batch: list[list[int]]) -> torch.Tensor:
        """The rows as one (1, N) packed row through the base model, the head at each row's pooled
        position. # (B,)"""
        import torch

        from asyncrl.training.packed_attention import ROWS

        device = next(self.model.parameters()).device
        lengths = [len(ids) for ids in batch]
        bounds = torch.tensor([0, *lengths]).cumsum(0)  # (B+1,)
        ids = torch.tensor([t for row in batch for t in row], dtype=torch.long)[None].to(device)  # (1, N)
        positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
        cu = bounds.to(device, torch.int32)
        base = getattr(self.model, self.model.base_model_prefix)
        hidden = base(input_ids=ids, position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                      max_length_q=max(lengths), max_length_k=max(lengths), use_cache=False,
                      **{ROWS: tuple(lengths)}).last_hidden_state  # (1, N, H)
        read = torch.tensor([start + pooled_index(row, self.pad_id) for start, row in zip(bounds.tolist(), batch)])
        return cast(Any, self.model).score(hidden[0, read.to(device)])[:, 0]

    def _padded(self, batch: list[list[int]]) -> torch.Tensor:
        """The whole classifier on the rows right-padded to the longest. # (B,)"""
        import torch

        device = next(self.model.parameters()).device
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)  # (B, T), right-padded
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, :len(ids)] = 1
        return self.model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits[:, 0]


def pooled_index(ids: Sequence[int], pad_id: int) -> int:
    """Where a sequence classifier reads its score in one row: the last token that is not the pad
    id (transformers' `*ForSequenceClassification` pooling), the last token if all are.
    Example: ids [5, 7, 0], pad 0 -> 1."""
    return next((i for i in range(len(ids) - 1, -1, -1) if ids[i] != pad_id), len(ids) - 1)


def packing_refusal(model: PreTrainedModel) -> str:
    """Why `model` cannot score packed rows ("" if it can, after switching its base model to
    `packed_attention` and checking it the trainer's way; a refused model keeps its attention)."""
    from torch import nn

    from asyncrl.training.packed_attention import use_packed_attention
    from asyncrl.training.packing import check_packing

    config = model.config
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if base is None or not isinstance(getattr(model, "score", None), nn.Module):
        return f"{type(model).__name__} has no base model and `score` head to run apart"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"{type(model).__name__} has a sliding window ({config.sliding_window} tokens)"
    before = getattr(config, "_attn_implementation", None)
    try:
        use_packed_attention(base)
        check_packing(base, logits=False)
    except (ConfigError, TypeError, ValueError) as exc:
        if before is not None and getattr(config, "_attn_implementation", None) != before:
            base.set_attn_implementation(before)
        return str(exc)
    return ""


def _token_ids(encoded: Any) -> list[int]:
    """Ids from a tokenizer call or `apply_chat_template(tokenize=True)`: a BatchEncoding
    (transformers 5) or a list (4.x)."""
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]
