"""The `asyncrl` command: `asyncrl [--log-level LEVEL] train|sim|config|eval [CONFIG.yaml] [key=value ...]`.

A YAML file (optional) then dotted overrides (ours or verl's names), e.g.
`asyncrl train pipeline=colocated trainer.total_training_steps=20 rollout.n=8`.
`asyncrl sim` runs the same config on a modelled cluster in virtual time (`--compare` several
variants side by side, `--fit metrics.jsonl` fits a profile to a measured run).
`asyncrl config` prints the resolved config with every key documented.
`asyncrl eval` scores a model on held-out prompts: mean@k and pass@k under verl's names.
`asyncrl convert-checkpoint DIR` rewrites checkpoints of the old pickle format (which a run
refuses) as JSON + safetensors, once, for a user who trusts whoever could write DIR.
`asyncrl COMMAND --help` lists the command's options and the config groups.

Output goes through `logging` (`asyncrl.telemetry.logs`): progress and run messages at INFO,
so `--log-level WARNING` leaves warnings and errors; results (tables, YAML) go to stdout.
The argument parser here only reads the command, the global options and `--help`; each command
reads its own arguments (`train(args)`, `sim(args)`, ...), so they can come in any order.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import yaml

from asyncrl.config import load_config
from asyncrl.config.keys import described_docs
from asyncrl.config.load import load_train_config
from asyncrl.config.schema import Config
from asyncrl.errors import AsyncRLError, ConfigErrors
from asyncrl.preflight import preflight
from asyncrl.telemetry.logs import LEVELS, setup_logging

logger = logging.getLogger("asyncrl.cli")

_TRACEBACK_HINT = " (run with --debug for the traceback)"
_FILE_ERRNOS = (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.EROFS, errno.EDQUOT)


def _split_args(args: list[str]) -> tuple[str | None, list[str]]:
    path = args[0] if args and "=" not in args[0] and args[0].endswith((".yaml", ".yml")) else None
    return path, args[1:] if path else args


def train(args: list[str]) -> int:
    path, overrides = _split_args(args)
    cfg = load_train_config(path, overrides)
    from asyncrl.config.keys import settings_line
    from asyncrl.pipelines.rundir import RUNS_ROOT, with_run_dir

    preflight(cfg, logger.warning, RUNS_ROOT)  # before the imports below load torch
    cfg = with_run_dir(cfg)
    logger.info(settings_line(cfg))  # the first line, ~1 s in: the imports and the model build follow
    from asyncrl.pipelines import run_pipeline
    from asyncrl.pipelines.setup import build_context
    from asyncrl.pipelines.stopping import Stopped

    start = time.perf_counter()
    ctx = build_context(cfg, started=True)
    try:
        step = run_pipeline(ctx)
    except Stopped as exc:
        logger.warning(f"asyncrl: {exc} after update {ctx.step}")
        return exc.exit_code
    logger.info(f"done: {step} steps in {time.perf_counter() - start:.1f} s; outputs in {ctx.output_dir}")
    return 0


def _sim_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compare", nargs="+", default=None, metavar="VARIANT",
                        help="quoted override strings, or 'modes' for every pipeline and mode")
    parser.add_argument("--fit", type=Path, default=None, metavar="METRICS.jsonl",
                        help="fit sim.profile's efficiencies to a measured run of this config")
    parser.add_argument("--out", type=Path, default=Path("profile-fitted.yaml"), help="where --fit writes")


def sim(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl sim")
    _sim_options(parser)
    ns, rest = parser.parse_known_args(args)
    path, overrides = _split_args(rest)
    if ns.compare:
        from asyncrl.sim.compare import compare
        from asyncrl.sim.summary import table

        print(table(compare(path, overrides, ns.compare, log=logger.info)))
        return 0
    cfg = load_config(path, overrides)
    if ns.fit:
        from asyncrl.sim.fit import fit_from_run

        fit_from_run(cfg, ns.fit, ns.out, log=logger.info)
        logger.info(f"wrote {ns.out}; use it with sim.profile={ns.out}")
        return 0
    from asyncrl.pipelines.context import log_line
    from asyncrl.sim.run import sim_config, simulate
    from asyncrl.sim.summary import table

    cfg = sim_config(cfg)
    summary = simulate(cfg, log=log_line)
    print(table([summary]))
    logger.info(f"simulated {summary.steps} steps ({summary.total_s:.0f} virtual s) in {summary.sim_wall_s:.1f} s; "
                f"metrics and trace in {cfg.trainer.output_dir}")
    return 0


def _eval_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("eval.json"), metavar="FILE.json",
                        help="where the metrics go as JSON (default: eval.json)")


def evaluate(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl eval")
    _eval_options(parser)
    ns, rest = parser.parse_known_args(args)
    path, overrides = _split_args(rest)
    cfg = load_config(path, overrides)
    from asyncrl.eval import check_eval, generations_path, run_eval, table, write_report

    check_eval(cfg, ns.out)
    report = run_eval(cfg, generations_path(cfg, ns.out))
    print(table(report))
    write_report(report, ns.out)
    logger.info(f"wrote {ns.out}" + (f" and {report.generations}" if report.generations else ""))
    return 0


def convert_checkpoint(args: list[str]) -> int:
    """`asyncrl convert-checkpoint DIR ...`: each checkpoint, or run directory, in the new format."""
    parser = argparse.ArgumentParser(prog="asyncrl convert-checkpoint")
    _convert_options(parser)
    ns = parser.parse_args(args)
    from asyncrl.pipelines.convert import convert_path

    done = sum(convert_path(path, logger.info) for path in ns.dirs)
    logger.info(f"converted {done} checkpoint(s)")
    return 0


def _convert_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                        help="a checkpoint (.../checkpoints/global_step_K) or a run directory; its pickles "
                             "are loaded once: only for a directory whose writers you trust")


def show_config(args: list[str]) -> int:
    """`asyncrl config [CONFIG.yaml] [key=value ...]`: the resolved config, every key with its
    one-line doc; `--from-verl [python3 -m MODULE] key=value ...`: what a verl command line becomes;
    `--reference`: docs/configuration.md; `--verl-reference`: every verl key's class (docs/migrating.md)."""
    if "--reference" in args:
        from asyncrl.config import reference_markdown

        print(reference_markdown())
        return 0
    if "--verl-reference" in args:
        from asyncrl.config.verl_reference import reference

        print(reference())
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


COMMANDS = {
    "train": "train a policy (GRPO, PPO, ...) with the pipeline and backend the config names",
    "sim": "run the config on a modelled cluster in virtual time",
    "config": "print the resolved config, every key with its one-line doc",
    "eval": "mean@k and pass@k of model.path on data.val_files (or the built-in task's test split)",
    "convert-checkpoint": "rewrite old pickle-format checkpoints as JSON + safetensors (trusted input only)",
}


_USAGE = {"convert-checkpoint": "DIR [DIR ...]"}


def config_groups() -> str:
    """The config's sections and top-level keys with their one-line docs (every command's --help)."""
    docs = described_docs(Config)
    lines = ["config groups (set as section.key=value; `asyncrl config` lists every key):"]
    for f in dataclasses.fields(Config):
        is_section = f.default is dataclasses.MISSING
        lines.append(f"  {f.name + ('.*' if is_section else ''):<20} {docs.get(f.name, '')}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command, the global options and each command's --help (its arguments are its own)."""
    parser = argparse.ArgumentParser(prog="asyncrl", description=__doc__.split("\n\n")[0],
                                     epilog=config_groups(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _global_options(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, summary in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary, epilog=config_groups(),
                                  usage=f"asyncrl {name} [options] {_USAGE.get(name, '[CONFIG.yaml] [key=value ...]')}",
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        _global_options(sub, argparse.SUPPRESS)
        {"sim": _sim_options, "eval": _eval_options, "config": _config_options,
         "convert-checkpoint": _convert_options}.get(name, _no_options)(sub)
    return parser


def _global_options(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    parser.add_argument("--debug", action="store_true", default=default or False,
                        help="show the traceback of an error")
    parser.add_argument("--log-level", choices=LEVELS, default=default or "INFO", type=str.upper,
                        help="DEBUG | INFO (default: progress and run messages) | WARNING | ERROR")


def _config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reference", action="store_true", help="every key as the Markdown of docs/configuration.md")
    parser.add_argument("--from-verl", action="store_true",
                        help="the arguments are a verl command line ([python3 -m MODULE] key=value ...)")
    parser.add_argument("--verl-reference", action="store_true",
                        help="every verl key by class (mapped, fixed, knob) as the Markdown of docs/migrating.md")


def _no_options(parser: argparse.ArgumentParser) -> None:
    pass


def _command_args(argv: list[str]) -> tuple[list[str], bool, str]:
    """(the arguments after the command, --debug, --log-level), global options taken from anywhere."""
    rest, debug, level = [], False, "INFO"
    it = iter(argv)
    for a in it:
        if a == "--debug":
            debug = True
        elif a == "--log-level" or a.startswith("--log-level="):
            level = (a.partition("=")[2] if "=" in a else next(it, "")).upper()
        else:
            rest.append(a)
    return rest[1:], debug, level


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, debug, level = _command_args(argv)
    try:
        ns, _ = build_parser().parse_known_args(argv)  # the command, --help, a bad --log-level
    except SystemExit as exc:
        return int(exc.code or 0)
    setup_logging(level)
    handlers = {"train": train, "sim": sim, "config": show_config, "eval": evaluate,
                "convert-checkpoint": convert_checkpoint}
    try:
        return handlers[ns.command](args)
    except KeyboardInterrupt:
        logger.error("asyncrl: interrupted")
        exit_if_threads_busy(130)
        return 130
    except Exception as exc:
        return report_error(exc, debug)


def exit_if_threads_busy(code: int) -> None:
    """After a Ctrl-C: end the process now if other (non-daemon) threads still work, a model build in
    a worker thread say, which the interpreter would otherwise wait for at exit (and a second
    Ctrl-C would crash in). Builds write beside their cache entry and rename, so none is left half."""
    busy = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    if busy:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def report_error(exc: BaseException, debug: bool = False) -> int:
    """Log one line for `exc` (after its traceback with `debug`) and return the exit status:
    2 for a user's error (ours, or a missing file, a full disk, bad YAML), 1 for anything else."""
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    hint = "" if debug else _TRACEBACK_HINT
    exc = _remote_cause(exc)
    if isinstance(exc, ConfigErrors):
        for line in exc.lines:
            logger.error(f"asyncrl: error: {line}")
        return 2
    if isinstance(exc, AsyncRLError):
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        more = " (run with --debug for the full message)" if len(lines) > 1 and not debug else ""
        logger.error(f"asyncrl: error: {lines[0]}{more}")
        return 2
    user_error = _user_error(exc)
    if user_error is not None:
        logger.error(f"asyncrl: error: {user_error}{hint}")
        return 2
    logger.error(f"asyncrl: internal error: {type(exc).__name__}: {_one_line(exc)}{hint}")
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


if __name__ == "__main__":
    sys.exit(main())
