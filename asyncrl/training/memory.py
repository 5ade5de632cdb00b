"""Memory settings of a model that is about to be trained: the one place every trainer (this
CPU trainer, a GPU trainer) turns on gradient checkpointing.

Gradient checkpointing keeps only each decoder layer's input in the forward pass and recomputes
the layer in the backward pass: activation memory falls from O(layers x activations) to about
one layer's worth, for roughly one more forward pass of compute. The non-reentrant
implementation is used (what PyTorch recommends; it works with frozen inputs, so LoRA needs no
`enable_input_require_grads`).

Not here: LoRA (`asyncrl.training.lora`) or the optimizer.
"""

from __future__ import annotations

from torch import nn


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Turn on HF gradient checkpointing (non-reentrant) for `model`'s training passes.

    It takes effect only in train mode; `use_cache` must be off there (the actor passes
    `use_cache=False`). transformers >= 5.x names it `activation_checkpointing_enable` (the old
    name warns); older versions only have `gradient_checkpointing_enable`."""
    kwargs = {"use_reentrant": False}
    new_name = getattr(model, "activation_checkpointing_enable", None)
    if new_name is not None:
        new_name(activation_checkpointing_kwargs=kwargs)
        return
    enable = getattr(model, "gradient_checkpointing_enable", None)
    assert enable is not None, f"{type(model).__name__} has no gradient_checkpointing_enable (not an HF model)"
    enable(gradient_checkpointing_kwargs=kwargs)
