"""The `asyncrl` command: `asyncrl train|sim|config [CONFIG.yaml] [key=value ...]`.

A YAML file (optional) then dotted overrides, e.g.
`asyncrl train pipeline=colocated trainer.total_training_steps=20 rollout.n=8`.
`asyncrl sim` runs the same config on a modelled cluster in virtual time (`--compare` several
variants side by side, `--fit metrics.jsonl` fits a profile to a measured run).
`asyncrl config` prints the resolved config with every key documented.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

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


def sim(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl sim")
    parser.add_argument("--compare", nargs="+", default=None, metavar="VARIANT",
                        help="quoted override strings, or 'modes' for every pipeline and mode")
    parser.add_argument("--fit", type=Path, default=None, metavar="METRICS.jsonl",
                        help="fit sim.profile's efficiencies to a measured run of this config")
    parser.add_argument("--out", type=Path, default=Path("profile-fitted.yaml"), help="where --fit writes")
    ns, rest = parser.parse_known_args(args)
    path, overrides = _split_args(rest)
    if ns.compare:
        from asyncrl.sim.compare import compare
        from asyncrl.sim.summary import table

        print(table(compare(path, overrides, ns.compare, log=lambda m: print(m, file=sys.stderr))))
        return 0
    cfg = load_config(path, overrides)
    if ns.fit:
        from asyncrl.sim.fit import fit_from_run

        fit_from_run(cfg, ns.fit, ns.out, log=lambda m: print(m, file=sys.stderr))
        print(f"wrote {ns.out}; use it with sim.profile={ns.out}", file=sys.stderr)
        return 0
    from asyncrl.sim.run import simulate
    from asyncrl.sim.summary import table

    summary = simulate(cfg)
    print(table([summary]))
    print(f"simulated {summary.steps} steps ({summary.total_s:.0f} virtual s) in {summary.sim_wall_s:.1f} s; "
          f"metrics and trace in {cfg.trainer.output_dir}", file=sys.stderr)
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
    parser.add_argument("command", choices=["train", "sim", "config"])
    parser.add_argument("args", nargs=argparse.REMAINDER, help="[CONFIG.yaml] [key=value ...]")
    ns = parser.parse_args(argv)
    try:
        return {"train": train, "sim": sim, "config": show_config}[ns.command](ns.args)
    except AsyncRLError as exc:
        print(f"asyncrl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("asyncrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
