#!/usr/bin/env bash
# The GPU check, one call of the device tool (issue 35): `bash bench/gpu_session.sh` with no stage runs every step
# below in this order, each capped so that the whole ends by 510 s of the script's start, and leaves exactly eight
# files directly in $OUT (else bench/results/gpu): gpu.txt, run.log (each step's output, then a `== NAME rc=N`
# line), engine_on.json, trainer.jsonl, junit.xml, engine_off.json, pipelines.json, pipeline_steps.json.
#   versions       nvidia-smi, torch/transformers/triton, varlen_attn's signature       -> gpu.txt
#   engine_on      bench/gpu_engine.py, every part on, batch 64 and 256, two runs (the second timed) -> engine_on.json
#   trainer        bench/trainer_throughput.py, the default row                         -> trainer.jsonl
#   trainer_ab     the other side of the compile A/B (`compiled` while the default is eager), its own process
#   gpu_tests      pytest -n 6 tests/gpu, stopped by SIGINT (summary and junit.xml kept) -> junit.xml
#   engine_off     bench/gpu_engine.py, every part off, batch 256                       -> engine_off.json
#   colocated, one_step_off   bench/pipelines.py --gpu, each only if its cap still fits -> pipelines.json, and each
#                  step's timing_s/* (update_actor, old_log_prob ...) and perf/* -> pipeline_steps.json
# A step's failure or timeout is recorded and the next step runs; a stopped step keeps what it wrote.
#
# Prepared here (the CPU) before the call, both ignored by git and named in the device tool's `carry`:
#   .whl: math-verify and its two pure-Python needs (absent on the GPU image; the pipelines' reward needs them)
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform any -d .whl \
#         math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
#   .cache: the warmed-up tiny model (so nothing rebuilds it there)
#     mkdir -p .cache && cp -r "${ASYNCRL_CACHE:-$HOME/.cache/asyncrl}" .cache/asyncrl    # after one `./run.sh train`
#   echo /.whl/ >> .git/info/exclude; echo /.cache/ >> .git/info/exclude
# The one command, on the GPU machine (device tool: run, carry [".whl", ".cache"], timeout_s 570):
#   bash bench/gpu_session.sh
# Checked here first, the same steps at toy sizes on the CPU (about 2 minutes; tests/bench/test_gpu_session.py):
#   OUT=/tmp/gs TINY=1 bash bench/gpu_session.sh   # (its compile A/B row runs with torch.compile a no-op)
#
# Follow-up stages, each one call on its own (at most 470 s, at most 8 files):
#   bash bench/gpu_session.sh trainer       # issue 23: varlen_attn, tests/gpu, the trainer bench, colocated and
#                                           # one_step_off on the new path, then today's (grouped, 8192 tokens)
#   bash bench/gpu_session.sh engine        # issue 24: the engine with every part off then on at 64 and 256, each
#                                           # part off alone at 256, weight sync; results in engine.tgz
#   bash bench/gpu_session.sh convergence   # issue 26: colocated vs fully async (d) on arithmetic, 3 seeds
# each with TINY=1 for the same steps on this CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
stage="${1:-window}"
out="${OUT:-bench/results/gpu}"
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
if [ -d .cache/asyncrl ]; then
  export ASYNCRL_CACHE="$PWD/.cache/asyncrl"
else  # the CPU check: the cache this machine has (the tests pass theirs)
  export ASYNCRL_CACHE="${ASYNCRL_CACHE:-$HOME/.cache/asyncrl}"
fi
export PYTHONUNBUFFERED=1 ASYNCRL_TEST_CACHE="$ASYNCRL_CACHE"
scratch="$(mktemp -d /tmp/gpu-session.XXXXXX)"  # logs and run directories that must not land in $out
versions() {  # the GPU, the driver, torch / transformers / triton, varlen_attn's signature
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  else
    echo "no nvidia-smi"
  fi
  python3 -c "import inspect, torch, transformers, triton
print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)
try:
    from torch.nn.attention.varlen import varlen_attn
    print('varlen_attn', inspect.signature(varlen_attn))
except ImportError as e:
    print('torch', torch.__version__, 'has no varlen_attn:', e)"
  if [ "${TINY:-0}" = 1 ]; then
    echo "what travels to the device (tracked + untracked files, without .whl/.cache):" \
      "$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes (limit 64 MiB)"
  fi
}
status=0
step() {  # name, seconds, command...: a step's failure is recorded, the next steps still run
  local name="$1" limit="$2"; shift 2
  echo "=== $name (at most ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "${logdir:-$out}/$name.log" | tail -25
  local rc=${PIPESTATUS[0]}
  echo "=== $name: rc=$rc in $((SECONDS - t0))s"
  [ "$rc" = 0 ] || status=1
}
trainer_stage() {  # issue 23; every step capped so that the stage ends within 8 minutes of the script's start
  versions 2>&1 | tee "$out/gpu.txt"
  local deadline=470 tiny="${TINY:-0}" bench=(--device cuda --time-budget-s 110)
  local pipes=(--gpu --steps 4 --prompts 32 --n 8 --max-len 1024 --timeout-s 70) workers=4
  if [ "$tiny" = 1 ]; then
    bench=(--device cpu --rows 8 --steps 1 --time-budget-s 20) workers=0
    pipes=(--steps 1 --prompts 2 --n 2 --max-len 8 --timeout-s 120)
  fi
  capped() { local want="$1" left=$((deadline - SECONDS)); echo $((want < left ? want : (left > 1 ? left : 1))); }
  step gpu_tests "$(capped 100)" python3 -m pytest -q -p no:cacheprovider -n "$workers" tests/gpu
  step trainer "$(capped 130)" python3 bench/trainer_throughput.py "${bench[@]}" --out "$out/trainer_throughput.jsonl"
  # the new path first (the target: auto attention, the device budget), then today's (grouped attention, 8192
  # tokens): every configuration a fresh run, written as it finishes
  step pipelines "$(capped 300)" bash -c "python3 bench/pipelines.py ${pipes[*]} --only colocated,one_step_off \
    --runs-dir /tmp/gpu-runs --out '$out/pipelines_device_budget.json'; python3 bench/pipelines.py ${pipes[*]} \
    --only colocated,one_step_off --micro-tokens 8192 --override model.packed_attention=grouped \
    --runs-dir /tmp/gpu-runs --out '$out/pipelines_8192.json'"
  echo "=== trainer stage done at ${SECONDS}s; files in $out: $(ls "$out" | wc -l)"
}
engine_stage() {  # issue 24; within 8 minutes of the script's start; every result goes into engine.tgz as it comes
  local deadline=470 tiny="${TINY:-0}" dev=(--device cuda) batches=64,256 one=256 sync=(--device cuda --dtype bfloat16
    --models qwen05b --repeats 5) workers=4
  if [ "$tiny" = 1 ]; then
    dev=(--device cpu --num-requests 16 --cap 32 --median 16 --floor-iters 10 --floor-budget-s 5) batches=8,16 one=16
    sync=(--device cpu --models tiny --repeats 2) workers=0
  fi
  versions 2>&1 | tee "$out/gpu.txt"
  logdir="$scratch/engine"  # packed into $out/engine.tgz after every step: only the archive comes back
  mkdir -p "$logdir"
  capped() { local want="$1" left=$((deadline - SECONDS)); echo $((want < left ? want : (left > 1 ? left : 1))); }
  pack() { tar czf "$out/engine.tgz" -C "$scratch" engine; }
  step gpu_tests "$(capped 100)" python3 -m pytest -q -p no:cacheprovider -n "$workers" tests/gpu; pack
  step engine_all_off "$(capped 110)" python3 bench/gpu_engine.py "${dev[@]}" --batches "$batches" --off all \
    --out "$logdir/engine_all_off.json"; pack
  step engine_all_on "$(capped 90)" python3 bench/gpu_engine.py "${dev[@]}" --batches "$batches" --skip-hf \
    --out "$logdir/engine_all_on.json"; pack
  for part in $(python3 -c "from bench.gpu_engine import PARTS; print(' '.join(PARTS))"); do
    step "engine_no_$part" "$(capped 45)" python3 bench/gpu_engine.py "${dev[@]}" --batches "$one" --skip-hf \
      --floor-budget-s 5 --off "$part" --out "$logdir/engine_no_$part.json"; pack
  done
  step weight_sync_inprocess "$(capped 40)" python3 bench/weight_sync.py "${sync[@]}" --transports inprocess \
    --out "$logdir/weight_sync_inprocess.json"; pack
  step weight_sync_ipc "$(capped 60)" python3 bench/weight_sync.py "${sync[@]}" --transports ipc \
    --out "$logdir/weight_sync_ipc.json"; pack
  echo "=== engine stage done at ${SECONDS}s; $out/engine.tgz holds $(ls "$logdir" | wc -l) files"
}
convergence_stage() {  # issue 26; within 8 minutes of the script's start; each cell is kept as it ends
  local deadline=470 tiny="${TINY:-0}" size=(--seeds 3) dev=(--override trainer.device=cuda)
  if [ "$tiny" = 1 ]; then
    size=(--seeds 1 --steps 2 --batch 4 --n 2 --val-every 1 --val-size 8) dev=()
  fi
  versions 2>&1 | tee "$out/gpu.txt"
  logdir="$scratch/convergence"  # packed into $out/convergence.tgz: only the archive comes back
  mkdir -p "$logdir"
  # the cells run one after another (colocated, then fully async, per seed) and each is appended as it ends;
  # --report then writes the summary and verdicts of whatever finished before the deadline
  step convergence "$((deadline - SECONDS - 20))" python3 bench/convergence.py --modes colocated,fa_partial \
    --tasks arithmetic "${size[@]}" "${dev[@]}" --timeout-s 200 --runs-dir /tmp/conv-runs \
    --out "$logdir/convergence.jsonl" --summary "$logdir/summary.json" --img-dir "$logdir"
  step convergence_report 15 python3 bench/convergence.py --report --modes colocated,fa_partial --tasks arithmetic \
    "${size[@]}" "${dev[@]}" --out "$logdir/convergence.jsonl" --summary "$logdir/summary.json" --img-dir "$logdir"
  tar czf "$out/convergence.tgz" -C "$scratch" convergence
  echo "=== convergence stage done at ${SECONDS}s; $out/convergence.tgz"
}
FILES=(gpu.txt run.log engine_on.json trainer.jsonl junit.xml engine_off.json pipelines.json pipeline_steps.json)
window() {  # issue 35: the whole GPU check in one call; every step capped so that the script ends by 510 s
  local deadline=495 kill_after=8 tiny="${TINY:-0}" workers=6 on=64,256 off=256 ab_env=()
  local engine=(--device cuda --skip-hf --floor-iters 50 --floor-budget-s 5)
  # one trainer configuration per process, bounded by its cap, not by the bench's own time budget
  local trainer=(--device cuda --time-budget-s 1e6) pipes=(--gpu --steps 4 --prompts 32 --n 8 --max-len 1024)
  if [ "$tiny" = 1 ]; then
    workers=2 on=4,8 off=8
    engine=(--device cpu --skip-hf --num-requests 12 --cap 24 --median 12 --floor-iters 5 --floor-budget-s 2)
    trainer=(--device cpu --rows 4 --prompt-len 4,8 --median 6 --max-row 32 --steps 1 --threads 1 --time-budget-s 1e6)
    pipes=(--steps 1 --prompts 2 --n 2 --max-len 8)
    # inductor's CPU compile of even the tiny model outlasts the step's cap on a busy 2-core machine: the
    # toy run checks the step (its own process, its row appended), torch.compile a no-op there
    ab_env=(TORCH_COMPILE_DISABLE=1)
  fi
  for f in "${FILES[@]}"; do rm -f "${out:?}/$f"; done
  # the compile A/B's other side: `compiled` while the CUDA default is eager, `eager` once it is compiled
  local ab
  ab=$(python3 -c "from asyncrl.scheduling.plan import torch_compile as c
print('eager' if c(None, 'cuda') else 'compiled')")
  ab=${ab:-compiled}
  run_step versions "$(capped 30)" TERM bash -c "$(declare -f versions); versions > '$out/gpu.txt' 2>&1
    cat '$out/gpu.txt'"
  run_step engine_on "$(capped 100)" TERM python3 bench/gpu_engine.py "${engine[@]}" --batches "$on" --engine-runs 2 \
    --out "$out/engine_on.json"
  run_step trainer "$(capped 50)" TERM python3 bench/trainer_throughput.py "${trainer[@]}" --configs packed \
    --out "$out/trainer.jsonl"
  run_step trainer_ab "$(capped 70)" TERM env "${ab_env[@]}" python3 bench/trainer_throughput.py "${trainer[@]}" \
    --configs "$ab" \
    --out "$out/trainer.jsonl"
  # SIGINT, as Ctrl-C: pytest stops, prints its summary of what ran and writes junit.xml
  run_step gpu_tests "$(capped 85)" INT env TORCHINDUCTOR_COMPILE_THREADS=4 python3 -m pytest -q -p no:cacheprovider \
    -n "$workers" --junitxml="$out/junit.xml" tests/gpu
  run_step engine_off "$(capped 40)" TERM python3 bench/gpu_engine.py "${engine[@]}" --batches "$off" --off all \
    --out "$out/engine_off.json"
  local name want cap
  for name in colocated one_step_off; do  # each only if its whole cap still fits
    want=80; [ "$name" = one_step_off ] && want=60
    cap=$(capped "$want")
    if [ "$cap" -lt "$want" ]; then
      echo "== $name rc=skipped (${cap}s left of the ${want}s it needs)" | tee -a "$out/run.log"
      continue
    fi
    run_step "$name" "$cap" TERM python3 bench/pipelines.py "${pipes[@]}" --only "$name" --timeout-s $((cap - 12)) \
      --runs-dir "$scratch/runs" --merge --out "$out/pipelines.json" --steps-out "$out/pipeline_steps.json"
  done
  for f in "${FILES[@]}"; do  # a step stopped before it wrote: the file says so, and run.log why
    [ -e "$out/$f" ] || echo "not written: see run.log" > "$out/$f"
  done
  rm -rf "$scratch"
  echo "=== window done at ${SECONDS}s; $(ls "$out" | wc -l) files in $out"
}
capped() {  # seconds a step may take: what it wants, at most what is left before the deadline (and kill_after)
  local want="$1" left=$((deadline - SECONDS))
  echo $((want < left ? want : (left > 1 ? left : 1)))
}
run_step() {  # name, seconds, signal, command...: its output goes to run.log, then `== NAME rc=N (Ts)`
  local name="$1" limit="$2" sig="$3"; shift 3
  local t0=$SECONDS log="$scratch/$name.log"
  echo "=== $name (at most ${limit}s, at ${SECONDS}s)" | tee -a "$out/run.log"
  timeout -k "$kill_after" -s "$sig" "$limit" "$@" > "$log" 2>&1
  local rc=$?
  cat "$log" >> "$out/run.log"
  tail -n 6 "$log"
  echo "== $name rc=$rc ($((SECONDS - t0))s)" | tee -a "$out/run.log"
  [ "$rc" = 0 ] || status=1
}
if [ "$stage" = window ]; then
  window
elif [ "$stage" = trainer ]; then
  trainer_stage
elif [ "$stage" = engine ]; then
  engine_stage
elif [ "$stage" = convergence ]; then
  convergence_stage
else
  echo "bench/gpu_session.sh: no stage '$stage'; run it with none (the whole GPU check)," \
    "or trainer, engine or convergence" >&2
  exit 2
fi
exit $status
