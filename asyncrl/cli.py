"""The `asyncrl` command: `asyncrl train|sim|config [CONFIG.yaml] [key=value ...]`.

A YAML file (optional) then dotted overrides, e.g.
`asyncrl train pipeline=colocated trainer.total_training_steps=20 rollout.n=8`.
`asyncrl sim` runs the same config on a modelled cluster in virtual time (`--compare` several
variants side by side, `--fit metrics.jsonl` fits a profile to a measured run).
`asyncrl config` prints the resolved config with every key documented.
"""

from __future__ import annotations

import argparse
import errno
import sys
import time
import traceback
from pathlib import Path

import yaml

from asyncrl.config import load_config
from asyncrl.errors import AsyncRLError
from asyncrl.preflight import preflight

_TRACEBACK_HINT = " (run with --debug for the traceback)"
_FILE_ERRNOS = (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.EROFS, errno.EDQUOT)


def _split_args(args: list[str]) -> tuple[str | None, list[str]]:
    path = args[0] if args and "=" not in args[0] and args[0].endswith((".yaml", ".yml")) else None
    return path, args[1:] if path else args


def train(args: list[str]) -> int:
    path, overrides = _split_args(args)
    cfg = load_config(path, overrides)
    preflight(cfg, _stderr)
    from asyncrl.pipelines import run_pipeline
    from asyncrl.pipelines.setup import build_context
    from asyncrl.pipelines.stopping import Stopped

    start = time.perf_counter()
    ctx = build_context(cfg)
    try:
        step = run_pipeline(ctx)
    except Stopped as exc:
        print(f"asyncrl: {exc} after update {ctx.step}", file=sys.stderr)
        return exc.exit_code
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
    from asyncrl.sim.run import sim_config, simulate
    from asyncrl.sim.summary import table

    cfg = sim_config(cfg)
    summary = simulate(cfg)
    print(table([summary]))
    print(f"simulated {summary.steps} steps ({summary.total_s:.0f} virtual s) in {summary.sim_wall_s:.1f} s; "
          f"metrics and trace in {cfg.trainer.output_dir}", file=sys.stderr)
    return 0


def show_config(args: list[str]) -> int:
    """`asyncrl config [CONFIG.yaml] [key=value ...]`: the resolved config, every key with its
    one-line doc; `--from-verl [python3 -m MODULE] key=value ...`: what a verl command line becomes;
    `--reference`: docs/configuration.md."""
    if "--reference" in args:
        from asyncrl.config import reference_markdown

        print(reference_markdown())
        return 0
    from asyncrl.config import documented_yaml

    entry = None
    if "--from-verl" in args:
        args = [a for a in args if a != "--from-verl"]
        entry, args = _verl_entry(args)
    path, overrides = _split_args(args)
    cfg = load_config(path, overrides, entry=entry)
    print(documented_yaml(cfg), end="")
    return 0


def _verl_entry(args: list[str]) -> tuple[str | None, list[str]]:
    """A pasted `python3 -m verl....main_ppo k=v ...` -> (the module, the k=v arguments)."""
    rest = list(args)
    if rest and Path(rest[0]).name.startswith("python"):
        rest = rest[1:]
    if len(rest) >= 2 and rest[0] == "-m":
        return rest[1], rest[2:]
    return None, rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # before or after the command
    parser = argparse.ArgumentParser(prog="asyncrl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("command", choices=["train", "sim", "config"])
    parser.add_argument("args", nargs=argparse.REMAINDER, help="[CONFIG.yaml] [key=value ...]")
    ns = parser.parse_args([a for a in argv if a != "--debug"])
    try:
        return {"train": train, "sim": sim, "config": show_config}[ns.command](ns.args)
    except KeyboardInterrupt:
        print("asyncrl: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        return report_error(exc, debug)


def report_error(exc: BaseException, debug: bool = False) -> int:
    """Print one line for `exc` (after its traceback with `debug`) and return the exit status:
    2 for a user's error (ours, or a missing file, a full disk, bad YAML), 1 for anything else."""
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    hint = "" if debug else _TRACEBACK_HINT
    exc = _remote_cause(exc)
    if isinstance(exc, AsyncRLError):
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        more = " (run with --debug for the full message)" if len(lines) > 1 and not debug else ""
        print(f"asyncrl: error: {lines[0]}{more}", file=sys.stderr)
        return 2
    user_error = _user_error(exc)
    if user_error is not None:
        print(f"asyncrl: error: {user_error}{hint}", file=sys.stderr)
        return 2
    print(f"asyncrl: internal error: {type(exc).__name__}: {_one_line(exc)}{hint}", file=sys.stderr)
    return 1


def _user_error(exc: BaseException) -> str | None:
    """One line for the outside world's errors that are not ours; None for anything else."""
    if isinstance(exc, yaml.YAMLError):
        return f"invalid YAML: {_one_line(exc)}"
    if not isinstance(exc, OSError):
        return None
    if exc.errno == errno.ENOSPC:
        return f"no space left on device{f' writing {exc.filename}' if exc.filename else ''}: free space or " \
               "set trainer.output_dir on another disk"
    if exc.errno in _FILE_ERRNOS and exc.filename is not None:
        return f"{(exc.strerror or 'error').lower()}: {exc.filename}"
    if _raised_in(exc, ("transformers", "huggingface_hub")):  # e.g. no tokenizer in a model directory
        return f"{_one_line(exc)} (check model.path)"
    return None


def _raised_in(exc: BaseException, packages: tuple[str, ...]) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).split(".")[0] in packages:
            return True
        tb = tb.tb_next
    return False


def _remote_cause(exc: BaseException) -> BaseException:
    """The worker's own exception inside Ray's wrapper (RayTaskError carries it as `cause`)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) and type(exc).__module__.startswith("ray") else exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
