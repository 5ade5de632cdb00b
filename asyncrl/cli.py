"""The `asyncrl` command: `asyncrl train [CONFIG.yaml] [key=value ...]`.

A YAML file (optional) then dotted overrides, e.g.
`asyncrl train pipeline=colocated trainer.total_training_steps=20 rollout.n=8`.
`asyncrl config` prints the resolved config with every key documented.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from asyncrl.config import dump_config, load_config
from asyncrl.errors import AsyncRLError

def _split_args(args: list[str]) -> tuple[str | None, list[str]]:
    path = args[0] if args and "=" not in args[0] and args[0].endswith((".yaml", ".yml")) else None
    return path, args[1:] if path else args


def train(args: list[str]) -> int:
    path, overrides = _split_args(args)
    cfg = load_config(path, overrides)
    from asyncrl.pipelines import pipeline_module
    from asyncrl.pipelines.setup import build_context

    module = pipeline_module(cfg.pipeline)
    start = time.perf_counter()
    ctx = build_context(cfg)
    step = asyncio.run(module.run(ctx))
    print(f"done: {step} steps in {time.perf_counter() - start:.1f} s; outputs in {ctx.output_dir}",
          file=sys.stderr)
    return 0


def show_config(args: list[str]) -> int:
    if "--reference" in args:
        from asyncrl.config import reference_markdown

        print(reference_markdown())
        return 0
    path, overrides = _split_args(args)
    cfg = load_config(path, overrides)
    print(dump_config(cfg), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["train", "config"])
    parser.add_argument("args", nargs=argparse.REMAINDER, help="[CONFIG.yaml] [key=value ...]")
    ns = parser.parse_args(argv)
    try:
        return {"train": train, "config": show_config}[ns.command](ns.args)
    except AsyncRLError as exc:
        print(f"asyncrl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("asyncrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
