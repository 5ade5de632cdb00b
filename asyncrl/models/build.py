"""The child process that warms up one built-in model with pinned arithmetic (`cache.load_or_build`).

Reads one JSON job on stdin: `builder` ("module:function"), `spec_type` ("module:Class"), `spec`
(the dataclass's fields) and `out` (a directory); builds with one thread and torch's deterministic
algorithms, writes the model, tokenizer and warmup.json (the builder's report plus what the
weights depend on: torch's version, the CPU capability used, the profile and the weights' digest)
into `out`, and prints its log lines on stdout. Not a user command.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
from typing import Any

import torch


def main() -> None:
    job = json.loads(sys.stdin.read())
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    spec = _resolve(job["spec_type"])(**_tuples(job["spec"]))
    model, tok, report = _resolve(job["builder"])(spec, lambda line: print(line, flush=True))
    model.save_pretrained(job["out"])
    tok.save_pretrained(job["out"])
    report.update(provenance(model))
    with open(f"{job['out']}/warmup.json", "w") as f:
        json.dump(report, f)


def provenance(model: torch.nn.Module) -> dict[str, Any]:
    """What the weights depend on beyond the spec, and their digest (sha256 over the state dict
    in name order, float32 bytes)."""
    import transformers

    from asyncrl.models.cache import profile

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "profile": profile(),
            "threads": torch.get_num_threads(), "weights_sha256": digest.hexdigest()}


def _resolve(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _tuples(value: Any) -> Any:
    """JSON's lists back to the frozen specs' tuples."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


if __name__ == "__main__":
    main()
