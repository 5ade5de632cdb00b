#!/usr/bin/env bash
# Everything issue 13 needs from one GPU session, in two calls of about five minutes each, on a
# machine with torch (CUDA), triton and transformers but no internet, Ray or asyncrl installed:
#   bash bench/gpu_session.sh 1   # tests/gpu, engine bench, weight-sync bench
#   bash bench/gpu_session.sh 2   # trainer bench, the three pipelines on one GPU, the simulator's prediction
# Prepared here (CPU) before the session, with the device tool's `carry`: .whl (math-verify and its
# two pure-Python needs, absent there) and .cache (the warmed-up tiny model, so nothing rebuilds it):
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform any -d .whl \
#       math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
#   mkdir -p .cache && cp -r ~/.cache/asyncrl .cache/      # after one `asyncrl train` here
# Results land in $OUT (the device tool brings that folder back), else bench/results/gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
stage="${1:?stage 1 or 2}"
out="${OUT:-bench/results/gpu}"
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 ASYNCRL_CACHE="$PWD/.cache/asyncrl" ASYNCRL_TEST_CACHE="$PWD/.cache/asyncrl"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)" \
  | tee -a "$out/gpu.txt"
status=0
step() {  # name, seconds, command...: a step's failure is recorded, the next steps still run
  local name="$1" limit="$2"; shift 2
  echo "=== $name (at most ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.log" | tail -25
  local rc=${PIPESTATUS[0]}
  echo "=== $name: rc=$rc in $((SECONDS - t0))s"
  [ "$rc" = 0 ] || status=1
}
if [ "$stage" = 1 ]; then
  step gpu_tests 150 python3 -m pytest -q -x -p no:cacheprovider tests/gpu
  step gpu_engine 150 python3 bench/gpu_engine.py --device cuda --out "$out/gpu_engine.json"
  step weight_sync 60 python3 bench/weight_sync.py --device cuda --dtype bfloat16 --models qwen05b \
    --transports inprocess,ipc --repeats 5 --out "$out/weight_sync_gpu.json"
else
  step trainer 120 python3 bench/trainer_throughput.py --device cuda --out "$out/trainer_throughput.json"
  step pipelines 240 python3 bench/pipelines.py --gpu --steps 4 --prompts 32 --n 8 --max-len 1024 \
    --runs-dir /tmp/gpu-runs --out "$out/pipelines_gpu.json"
  step sim 40 python3 bench/sim_vs_measured.py --gpu --pipelines "$out/pipelines_gpu.json" \
    --out "$out/sim_vs_measured_gpu.json"
fi
exit $status
