"""The critic worker (adv_estimator=gae): the policy's transformer body plus a scalar value head.

Values are read at the positions that predict each response token (the state before it),
matching verl; values and the value loss cover the model's tokens only (`TrainBatch.loss_mask`:
a multi-turn episode's tool text is context, which GAE skips). Value loss with clipping comes
from the pure `asyncrl.algorithms.value_loss`.
With `use_remove_padding` the body runs on each micro-batch's rows packed into one sequence
(`asyncrl.training.packing`), as the actor does. As in the actor, the micro-batch loop reads
nothing back from the device: weights come from the batch's host-side facts and the metrics
reach the host once per `train_step`. Precision as the actor's (`asyncrl.training.precision`):
under "param_dtype" the value model runs in bf16 over float32 masters, which the optimizer
steps and the checkpoint holds.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from asyncrl.algorithms.value_loss import compute_value_loss
from asyncrl.config.schema import CriticConfig
from asyncrl.state_io import check_weights, load_state, save_state
from asyncrl.training import packing
from asyncrl.training.actor import model_device
from asyncrl.training.batch import (
    Metrics,
    TrainBatch,
    host_rows,
    map_micro_batches,
    mean_over_mini_batches,
    micro_batches,
    to_host,
)
from asyncrl.training.optim import LRSchedule, make_optimizer
from asyncrl.training.precision import Precision, autocast, weights_for

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CRITIC_STATE = "critic_state.json"
"""The value model, optimizer and schedule (tensors beside it in critic_state.safetensors)."""


class ValueModel(nn.Module):
    def __init__(self, causal_lm: PreTrainedModel, autocast_dtype: torch.dtype = torch.float32,
                 pack: bool = False) -> None:
        super().__init__()
        self.body = copy.deepcopy(causal_lm.get_decoder())
        self.head = nn.Linear(causal_lm.config.hidden_size, 1, device=model_device(causal_lm))
        self.autocast_dtype = autocast_dtype
        self.pack = pack
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, batch: TrainBatch) -> torch.Tensor:
        """Values at the positions that predict each response token; packed: zeros at padding. # (B, T)"""
        with autocast(batch.input_ids.device, self.autocast_dtype):
            if self.pack:
                p = packing.pack(batch)
                hidden = self.body(**p.forward_kwargs(), use_cache=False).last_hidden_state
                return packing.unpack(self.head(hidden[0, p.predicts]).squeeze(-1).float(), p)
            hidden = self.body(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               position_ids=batch.position_ids, use_cache=False).last_hidden_state
            P, T = batch.prompt_width, batch.responses.shape[1]
            return self.head(hidden[:, P - 1 : P - 1 + T]).squeeze(-1).float()  # (B, T)


class Critic:
    def __init__(self, causal_lm: PreTrainedModel, cfg: CriticConfig, *, micro_batch_tokens: int,
                 forward_micro_batch_tokens: int, loss_agg_mode: str, compute_dtype: torch.dtype = torch.float32,
                 use_remove_padding: bool = True, mixed_precision: str = "auto") -> None:
        self.precision = Precision.choose(mixed_precision, compute_dtype)
        self.model = ValueModel(causal_lm, self.precision.autocast_dtype, use_remove_padding)
        self.weights = weights_for(self.model, self.precision)  # where the float32 masters live
        if use_remove_padding:
            packing.enable_packing(self.model.body, logits=False)
        self.cfg = cfg
        self.micro_batch_tokens = micro_batch_tokens  # training; values are forward-only:
        self.forward_micro_batch_tokens = forward_micro_batch_tokens
        self.loss_agg_mode = loss_agg_mode
        self.optimizer, self.scheduler = make_optimizer(self.weights.trainable(), cfg.lr, 0.0, (0.9, 0.999),
                                                        LRSchedule(warmup_steps=cfg.warmup_steps))
        self.weights.attach(self.optimizer)

    @torch.no_grad()
    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        self.model.eval()
        here = batch.to(model_device(self.model))
        values = map_micro_batches(here, self.forward_micro_batch_tokens, self.model, self.model.pack)
        return (values * here.loss_mask).to(batch.responses.device)

    def train_step(self, batch: TrainBatch, num_mini_batches: int) -> dict[str, float]:
        assert batch.values is not None and batch.returns is not None
        self.model.train()
        return to_host(mean_over_mini_batches(batch.to(model_device(self.model)), self.cfg.ppo_epochs,
                                              num_mini_batches, self._mini_batch_step))

    def _mini_batch_step(self, mini: TrainBatch) -> Metrics:
        self.optimizer.zero_grad(set_to_none=True)
        total = host_rows(mini).tokens()
        metrics: Metrics = defaultdict(float)
        for _, mb in micro_batches(mini, self.micro_batch_tokens, self.model.pack):
            weight = host_rows(mb).tokens() / max(total, 1.0)
            assert mb.values is not None and mb.returns is not None
            loss, m = compute_value_loss(self.model(mb), mb.values, mb.returns, mb.loss_mask,
                                         self.cfg.cliprange_value, "token-mean")
            (loss * weight).backward()
            for k, v in m.items():
                metrics[k] = metrics[k] + v.double() * weight
        grad_norm = nn.utils.clip_grad_norm_(self.weights.trainable(), self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        metrics["critic/grad_norm"] = grad_norm.detach().double()
        return metrics

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        with self.weights.at_masters():  # float32 whatever the precision path
            save_state({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict()}, path / CRITIC_STATE)

    def load(self, path: Path) -> None:
        """What `save` wrote (JSON and safetensors only); weights that are not finite are refused."""
        state = load_state(path / CRITIC_STATE)
        check_weights(state["model"], path / CRITIC_STATE.replace(".json", ".safetensors"), zero_matrices=True)
        with self.weights.at_masters(write=True):
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
