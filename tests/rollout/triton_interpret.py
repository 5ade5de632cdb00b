"""Triton kernels on the CPU: import this module before any module that defines a kernel.

Without a CUDA device it sets `TRITON_INTERPRET=1`: `triton.jit` reads it when it decorates, so
a kernel module imported after this one runs in Triton's interpreter over CPU tensors. With CUDA
nothing changes (the kernels compile for the device). Two bugs of Triton 3.6's interpreter are
patched while it is in use, each as its upstream fix does, so that it computes what the device does:
- a scalar is a one-element numpy array converted with `int()`, which numpy >= 2.4 refuses, so a
  loop with a runtime bound (`range(start, end, BLOCK)`) fails (triton-lang/triton#9171, fixed
  by #9172 after 3.6.0): converted with `squeeze()`;
- `tl.dot` of bfloat16 operands multiplies their raw uint16 bit patterns (#11584; #11585 was
  not merged, "not supported yet"): the operands are widened to float32 first (exactly: a
  bfloat16 is the top half of a float32), which with float32 accumulation is what a GPU's
  bfloat16 tensor-core product computes.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

INTERPRET = not torch.cuda.is_available()
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.language as tl
    from triton.runtime import interpreter

    _patch_lang_tensor = interpreter._patch_lang_tensor
    _create_dot = interpreter.InterpreterBuilder.create_dot

    def _patch_scalar_index(tensor: Any, scope: Any) -> None:
        _patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    def _widened(x: Any) -> Any:
        if x.dtype != tl.bfloat16:
            return x
        return interpreter.TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def _create_dot_widened(self: Any, a: Any, b: Any, *args: Any) -> Any:
        return _create_dot(self, _widened(a), _widened(b), *args)

    interpreter._patch_lang_tensor = _patch_scalar_index
    interpreter.InterpreterBuilder.create_dot = _create_dot_widened  # type: ignore[method-assign]
