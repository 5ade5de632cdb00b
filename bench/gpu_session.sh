#!/usr/bin/env bash
# Everything issue 13 needs from one GPU session, in two calls of about five minutes each, on a
# machine with torch (CUDA), triton and transformers but no internet, Ray or asyncrl installed:
#   bash bench/gpu_session.sh 1   # tests/gpu, engine bench, weight-sync bench
#   bash bench/gpu_session.sh 2   # trainer bench, the three pipelines on one GPU, the simulator's prediction
# Issue 23 (the trainer at peer efficiency), one call of at most 8 minutes and 7 files:
#   bash bench/gpu_session.sh trainer   # varlen_attn's signature, tests/gpu, the trainer bench, colocated and
#                                       # one_step_off: the new path, then today's (grouped, 8192 tokens)
#   TINY=1 bash bench/gpu_session.sh trainer   # the same steps on this CPU at tiny sizes: checks the script
# Issue 24 (the rollout engine near the hardware), one call of at most 8 minutes; results in engine.tgz:
#   bash bench/gpu_session.sh engine    # tests/gpu, the engine bench with every new part off then on at
#                                       # batch 64 and 256, each part off alone at 256, weight sync in-process and IPC
#   TINY=1 bash bench/gpu_session.sh engine    # the same steps on this CPU at tiny sizes: checks the script
# Issue 26 (accuracy parity), one call of at most 8 minutes; results in convergence.tgz:
#   bash bench/gpu_session.sh convergence   # the tiny model on arithmetic, colocated vs fully async (d)
#                                           # (staleness 0.5, partial rollout), 3 seeds, alternating
#   TINY=1 bash bench/gpu_session.sh convergence   # the same steps on this CPU at toy sizes: checks the script
# Prepared here (CPU) before the session, with the device tool's `carry`: .whl (math-verify and its
# two pure-Python needs, absent there) and .cache (the warmed-up tiny model, so nothing rebuilds it):
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform any -d .whl \
#       math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
#   mkdir -p .cache && cp -r ~/.cache/asyncrl .cache/      # after one `asyncrl train` here
# Results land in $OUT (the device tool brings that folder back), else bench/results/gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
stage="${1:?stage 1, 2, trainer, engine or convergence}"
out="${OUT:-bench/results/gpu}"
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 ASYNCRL_CACHE="$PWD/.cache/asyncrl" ASYNCRL_TEST_CACHE="$PWD/.cache/asyncrl"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
else
  echo "no nvidia-smi" | tee "$out/gpu.txt"
fi
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)" \
  | tee -a "$out/gpu.txt"
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
  local deadline=470 tiny="${TINY:-0}" bench=(--device cuda --time-budget-s 110)
  local pipes=(--gpu --steps 4 --prompts 32 --n 8 --max-len 1024 --timeout-s 70) workers=4
  if [ "$tiny" = 1 ]; then
    bench=(--device cpu --rows 8 --steps 1 --time-budget-s 20) workers=0
    pipes=(--steps 1 --prompts 2 --n 2 --max-len 8 --timeout-s 120)
    [ -d .cache/asyncrl ] || export ASYNCRL_CACHE="$HOME/.cache/asyncrl" ASYNCRL_TEST_CACHE="$HOME/.cache/asyncrl"
    echo "what travels to the device (tracked + untracked files, without .whl/.cache):" \
      "$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes (limit 64 MiB)"
  fi
  capped() { local want="$1" left=$((deadline - SECONDS)); echo $((want < left ? want : (left > 1 ? left : 1))); }
  python3 -c "import inspect, torch
try:
    from torch.nn.attention.varlen import varlen_attn
    print('varlen_attn', inspect.signature(varlen_attn))
except ImportError as e:
    print('torch', torch.__version__, 'has no varlen_attn:', e)" 2>&1 | tee -a "$out/gpu.txt"
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
  logdir="$out/engine"
  mkdir -p "$logdir"
  capped() { local want="$1" left=$((deadline - SECONDS)); echo $((want < left ? want : (left > 1 ? left : 1))); }
  pack() { tar czf "$out/engine.tgz" -C "$out" engine; }
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
    [ -d .cache/asyncrl ] || export ASYNCRL_CACHE="$HOME/.cache/asyncrl" ASYNCRL_TEST_CACHE="$HOME/.cache/asyncrl"
  fi
  logdir="$out/convergence"
  mkdir -p "$logdir"
  # the cells run one after another (colocated, then fully async, per seed) and each is appended as it ends;
  # --report then writes the summary and verdicts of whatever finished before the deadline
  step convergence "$((deadline - SECONDS - 20))" python3 bench/convergence.py --modes colocated,fa_partial \
    --tasks arithmetic "${size[@]}" "${dev[@]}" --timeout-s 200 --runs-dir /tmp/conv-runs \
    --out "$logdir/convergence.jsonl" --summary "$logdir/summary.json" --img-dir "$logdir"
  step convergence_report 15 python3 bench/convergence.py --report --modes colocated,fa_partial --tasks arithmetic \
    "${size[@]}" "${dev[@]}" --out "$logdir/convergence.jsonl" --summary "$logdir/summary.json" --img-dir "$logdir"
  tar czf "$out/convergence.tgz" -C "$out" convergence
  echo "=== convergence stage done at ${SECONDS}s; $out/convergence.tgz"
}
if [ "$stage" = 1 ]; then
  step gpu_tests 150 python3 -m pytest -q -x -p no:cacheprovider tests/gpu
  step gpu_engine 150 python3 bench/gpu_engine.py --device cuda --out "$out/gpu_engine.json"
  step weight_sync 60 python3 bench/weight_sync.py --device cuda --dtype bfloat16 --models qwen05b \
    --transports inprocess,ipc --repeats 5 --out "$out/weight_sync_gpu.json"
elif [ "$stage" = trainer ]; then
  trainer_stage
elif [ "$stage" = engine ]; then
  engine_stage
elif [ "$stage" = convergence ]; then
  convergence_stage
else
  step trainer 120 python3 bench/trainer_throughput.py --device cuda --out "$out/trainer_throughput.json"
  step pipelines 240 python3 bench/pipelines.py --gpu --steps 4 --prompts 32 --n 8 --max-len 1024 \
    --runs-dir /tmp/gpu-runs --out "$out/pipelines_gpu.json"
  step sim 40 python3 bench/sim_vs_measured.py --gpu --pipelines "$out/pipelines_gpu.json" \
    --out "$out/sim_vs_measured_gpu.json"
fi
exit $status
