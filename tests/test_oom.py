"""A CUDA out-of-memory error becomes `OutOfMemory`: one line naming where and the keys to lower,
a `MemoryError` and one of ours, intact across a pickle (a Ray or process boundary)."""

from __future__ import annotations

import pickle

import pytest
import torch

from asyncrl.errors import AsyncRLError, OutOfMemory
from asyncrl.oom import out_of_memory_as, out_of_memory_message

TORCH_SAYS = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
              "1.19 GiB is free.\nIf reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF")


def test_the_message_by_hand():
    keys = ("actor.ppo_micro_batch_tokens (now 9216)", "rollout.gpu_memory_utilization")
    assert out_of_memory_message("the update", keys, torch.cuda.OutOfMemoryError(TORCH_SAYS)) == (
        "out of device memory in the update (tried to allocate 2.00 GiB): lower actor.ppo_micro_batch_tokens "
        "(now 9216) or rollout.gpu_memory_utilization, or set model.enable_gradient_checkpointing=true")
    assert out_of_memory_message("x", ("a", "b", "c"), RuntimeError("no size")) == \
        "out of device memory in x: lower a, b or c, or set model.enable_gradient_checkpointing=true"


def test_cuda_out_of_memory_becomes_ours_and_survives_a_pickle():
    with pytest.raises(OutOfMemory) as info, out_of_memory_as("the update", ("actor.ppo_micro_batch_tokens",)):
        raise torch.cuda.OutOfMemoryError(TORCH_SAYS)
    assert isinstance(info.value, MemoryError) and isinstance(info.value, AsyncRLError)
    assert "\n" not in str(info.value) and isinstance(info.value.__cause__, torch.cuda.OutOfMemoryError)
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is OutOfMemory and str(copy) == str(info.value)


def test_other_errors_pass_through():
    with pytest.raises(ValueError, match="not memory"), out_of_memory_as("the update", ("k",)):
        raise ValueError("not memory")
