"""Pre-registered accuracy studies (issue 38): a protocol file per study, `bench/protocols/<study>.yaml`,
fixed and committed before its cells run, and the rules that admit a cell to its summary.

A protocol names the task, the arms with their keys, the learning rate (and the sweep that chooses
it), the seeds, the primary endpoint and its window, the margin rule, the test with any interim
looks and their alpha, the partial-rollout floor, and the model: its cache key and the hash of its
initial weights, which `pin` fills in (`python bench/protocol.py pin bench/protocols/x.yaml`) once
the model's warm-up is final. Its hash (`protocol_hash`) is of the parsed content, so comments can
be corrected without invalidating a cell.

A cell is admitted when it records this protocol's hash and the commit that last changed the file,
started after that commit, finished, and (for a partial-rollout arm of a task that requires it)
actually interrupted generations: `partial_ratio` at least the protocol's floor. Everything else is
refused with the reason. Not here: running cells or computing verdicts (`bench/study.py`,
`bench/verdicts.py`).

    python bench/protocol.py check bench/protocols/longtail_plateau.yaml   # hash, commit, what is missing
    python bench/protocol.py pin bench/protocols/longtail_plateau.yaml     # fill the model's key and weights hash
    python bench/protocol.py set-lr bench/protocols/longtail_plateau.yaml --lr 1e-4   # the sweep's pick
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REQUIRED = ("study", "budget_cpu_hours", "model", "task", "settings", "lr", "arms", "control", "seeds", "endpoint",
            "margin", "test")
"""Top-level keys every protocol has."""


class ProtocolError(ValueError):
    """A protocol file that cannot be used as it is; the message names the file and the key."""


@dataclass(frozen=True)
class Protocol:
    path: Path
    body: dict[str, Any]
    hash: str
    commit: str | None
    """The commit that added the file's present content (None: not committed)."""
    committed_at: datetime | None
    sweep_hash: str
    """The hash of everything but `lr`: the learning-rate sweep's cells keep counting once the sweep's
    pick is written into `lr` (`bench/sweep.py`)."""
    sweep_commit: str | None
    sweep_committed_at: datetime | None

    def arm(self, name: str) -> dict[str, Any]:
        return next(a for a in self.body["arms"] if a["name"] == name)

    def pinned(self) -> bool:
        model = self.body["model"]
        return bool(model.get("cache_key")) and bool(model.get("weights_sha256"))


def content_hash(body: dict[str, Any]) -> str:
    """sha256 of the protocol's parsed content as canonical JSON (comments and layout do not count)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def sweep_hash(body: dict[str, Any]) -> str:
    """`content_hash` of everything but `lr` (what the sweep's cells depend on)."""
    return content_hash({k: v for k, v in body.items() if k != "lr"})


def load(path: Path, *, git: bool = True) -> Protocol:
    """The protocol at `path`, checked for its keys; with `git`, the commit that last changed it."""
    try:
        body = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ProtocolError(f"{path}: cannot read the protocol ({error})") from error
    validate(body, path)
    commit, when = last_commit(path) if git else (None, None)
    sweep_commit, sweep_when = last_commit(path, sweep_hash) if git else (None, None)
    return Protocol(path, body, content_hash(body), commit, when, sweep_hash(body), sweep_commit, sweep_when)


def validate(body: Any, path: Path) -> None:
    if not isinstance(body, dict):
        raise ProtocolError(f"{path}: a protocol is a mapping of {', '.join(REQUIRED)}")
    if missing := [k for k in REQUIRED if k not in body]:
        raise ProtocolError(f"{path}: missing {', '.join(missing)}")
    names = [a.get("name") for a in body["arms"]]
    if "colocated" not in names or body["control"] not in names:
        raise ProtocolError(f"{path}: arms must include colocated and the control {body['control']!r}")
    window = body["endpoint"].get("window_prompts")
    if not (isinstance(window, list) and len(window) == 2 and window[0] <= window[1]):
        raise ProtocolError(f"{path}: endpoint.window_prompts is [first, last] trained prompts")
    spent = sum(look["alpha"] for look in body["test"].get("looks", []))
    if spent > body["test"]["alpha"] + 1e-12:
        raise ProtocolError(f"{path}: test.looks spend alpha {spent:g}, more than test.alpha {body['test']['alpha']:g}")


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=path.parent, capture_output=True, text=True, check=False).stdout


def last_commit(path: Path, key: Callable[[dict[str, Any]], str] = content_hash) -> tuple[str | None, datetime | None]:
    """The commit that added the protocol's present content, and its commit time: the oldest of the
    latest commits of the file whose content hashes the same by `key` (a comment fixed later keeps
    it); (None, None) when the file is not committed."""
    rel = _git(path, "rev-parse", "--show-prefix").strip() + path.name
    found: tuple[str | None, datetime | None] = (None, None)
    current = None
    for line in _git(path, "log", "--format=%H %cI", "--", path.name).splitlines():
        commit, when = line.split()
        try:
            body = key(yaml.safe_load(_git(path, "show", f"{commit}:{rel}")))
        except yaml.YAMLError:
            break
        if current is not None and body != current:
            break
        current, found = body, (commit, datetime.fromisoformat(when))
    return found


def uncommitted(path: Path) -> bool:
    """Whether the file differs from its last commit (or was never committed)."""
    return bool(_git(path, "status", "--porcelain", "--", path.name).strip())


def ready(protocol: Protocol, *, sweep: bool = False) -> list[str]:
    """What stops this protocol's cells (`sweep`: its learning-rate sweep's) from running: each a
    line naming the fix (empty: ready)."""
    problems = []
    if protocol.commit is None or uncommitted(protocol.path):
        problems.append(f"commit {protocol.path} first: a protocol is fixed before its cells run")
    if not protocol.pinned():
        problems.append(f"model not pinned: run `python bench/protocol.py pin {protocol.path}` and commit it")
    if sweep:
        if not (protocol.body.get("lr_sweep") or {}).get("tuning_split"):
            problems.append(f"{protocol.path}: lr_sweep.tuning_split is not set (its size and seed)")
    elif protocol.body["lr"] is None:
        problems.append(f"lr is null in {protocol.path}: `python bench/protocol.py set-lr {protocol.path} --lr X` "
                        "with the sweep's pick (lr_sweep), and commit it")
    return problems


def model_key(path: str) -> str:
    """The cache key of a built-in model (what its warm-up depends on); a model directory's path as is."""
    from asyncrl.models.task_models import TASK_MODELS

    if path == "tiny":
        from asyncrl.models.tiny import TinySpec

        return TinySpec().key()
    return TASK_MODELS[path].key() if path in TASK_MODELS else path


def weights_sha256(path: str) -> str:
    """sha256 over the initial weights of `model.path` (each tensor's name, dtype, shape and bytes,
    in name order), loaded (and built, the first time) as a run loads it."""
    from asyncrl.config.schema import ModelConfig
    from asyncrl.models.loading import load_model

    model, _ = load_model(ModelConfig(path=path), log=lambda line: None)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def set_field(path: Path, key: str, value: str) -> None:
    """Rewrite the line `  key: ...` of the file in place, keeping its comment and every other line."""
    text = path.read_text()
    pattern = re.compile(rf"^(\s*{re.escape(key)}:)[ \t]*[^#\n]*?([ \t]*#.*)?$", re.MULTILINE)
    if not pattern.search(text):
        raise ProtocolError(f"{path}: no line `{key}:` to fill")
    path.write_text(pattern.sub(lambda m: f"{m.group(1)} {value}{m.group(2) or ''}", text, count=1))


def pin(path: Path) -> dict[str, str]:
    """Fill model.cache_key and model.weights_sha256 of the protocol at `path` from this machine's model."""
    protocol = load(path, git=False)
    model_path = protocol.body["model"]["path"]
    pinned = {"cache_key": model_key(model_path), "weights_sha256": weights_sha256(model_path)}
    for key, value in pinned.items():
        set_field(path, key, value)
    return pinned


def check_model(protocol: Protocol) -> list[str]:
    """Whether this machine's model is the pinned one (empty: it is)."""
    model = protocol.body["model"]
    key = model_key(model["path"])
    if key != model["cache_key"]:
        return [f"{protocol.path}: model.cache_key {model['cache_key']} but this code builds {key}: "
                "the warm-up changed since the pin; a new protocol is needed"]
    if (found := weights_sha256(model["path"])) != model["weights_sha256"]:
        return [f"{protocol.path}: model.weights_sha256 {model['weights_sha256'][:12]}... but the cached "
                f"{model['path']} hashes to {found[:12]}...: rebuild it (model.rebuild=true) or re-pin in a new "
                "protocol"]
    return []


def stamp(protocol: Protocol, *, sweep: bool = False) -> dict[str, Any]:
    """What a cell records of the protocol it ran under (a sweep cell: the hash without `lr`)."""
    if sweep:
        return {"protocol_hash": protocol.sweep_hash, "protocol_commit": protocol.sweep_commit, "phase": "sweep"}
    return {"protocol_hash": protocol.hash, "protocol_commit": protocol.commit}


def refusal(cell: dict[str, Any], protocol: Protocol, *, sweep: bool = False) -> str | None:
    """Why `cell` does not count for `protocol` (`sweep`: for its learning-rate sweep) (None: it counts)."""
    want = stamp(protocol, sweep=sweep)
    if cell.get("protocol_hash") != want["protocol_hash"]:
        return "run under another protocol (or none: exploratory)"
    commit = want["protocol_commit"]
    if cell.get("protocol_commit") != commit:
        return f"recorded protocol commit {str(cell.get('protocol_commit'))[:10]}, not {str(commit)[:10]}"
    started = cell.get("started_at")
    since = protocol.sweep_committed_at if sweep else protocol.committed_at
    if since is None or started is None or datetime.fromisoformat(started) < since:
        return "started before the protocol's commit"
    if not cell.get("points"):
        return f"failed: {cell.get('error', 'no validation')}"
    floor = protocol.body.get("partial_rollout", {}).get("min_ratio")
    if floor is not None and cell.get("partial_rollout") and (cell.get("partial_ratio") or 0.0) < floor:
        return (f"partial rollout did not fire: partial_ratio {cell.get('partial_ratio') or 0.0:.2f} < {floor} "
                "(partial_rollout.min_ratio)")
    return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("check", "pin", "set-lr"))
    ap.add_argument("protocols", nargs="+", type=Path)
    ap.add_argument("--lr", type=float, help="set-lr: the sweep's pick")
    args = ap.parse_args(argv)
    for path in args.protocols:
        if args.command == "set-lr":
            if args.lr is None:
                ap.error("set-lr needs --lr (the learning rate the sweep chose)")
            set_field(path, "lr", f"{args.lr:g}")
            print(f"{path}: lr {args.lr:g}; commit it before the main cells run")
            continue
        if args.command == "pin":
            print(f"{path}: pinned {json.dumps(pin(path))}; commit it before the cells run")
            continue
        protocol = load(path)
        problems = ready(protocol) + (check_model(protocol) if protocol.pinned() else [])
        print(f"{path}: hash {protocol.hash[:12]}, commit {str(protocol.commit)[:10]} at {protocol.committed_at}")
        print("\n".join(f"  not ready: {p}" for p in problems) or "  ready")
        sweep = ready(protocol, sweep=True) + (check_model(protocol) if protocol.pinned() else [])
        print("\n".join(f"  sweep not ready: {p}" for p in sweep) or "  sweep ready (bench/sweep.py)")


if __name__ == "__main__":
    main()
