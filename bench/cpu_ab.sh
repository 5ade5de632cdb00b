#!/usr/bin/env bash
# A/B of two checkouts on the CPU: `bench/cpu_ab.sh BEFORE_DIR AFTER_DIR [key=value ...]` runs the default
# colocated run (30 steps, no validation; extra keys appended, e.g. rollout.ignore_eos=true
# data.max_response_length=128 trainer.total_training_steps=8) in each tree, 3 pairs, alternating, the order
# flipped every pair, and prints each run's median step, update_actor and gen seconds (first step excluded).
# Make the trees with `git worktree add DIR COMMIT`; both run on this checkout's .venv.
set -u
BEFORE=$1; AFTER=$2; shift 2
VENV=$(cd "$(dirname "$0")/.." && pwd)/.venv
ARGS="trainer.total_training_steps=30 trainer.test_freq=0 trainer.val_before_train=false trainer.logger=[jsonl] \
trainer.resume_mode=disable $*"
RESULTS=$(mktemp -d)
run() {  # $1 label, $2 tree
  out=$RESULTS/$1-$3
  (cd "$2" && PYTHONPATH=$2 "$VENV/bin/python" -m asyncrl.cli train $ARGS trainer.output_dir=$out > $out.log 2>&1)
  python3 - "$out" "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if "timing_s/step" in l]
rows = rows[1:]  # the first step excluded (warm-up)
med = lambda k: statistics.median(r[k] for r in rows)
print(sys.argv[2], f"step {med('timing_s/step'):.3f} update {med('timing_s/update_actor'):.3f} gen {med('timing_s/gen'):.3f}", flush=True)
PY
}
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then run before "$BEFORE" $i; run after "$AFTER" $i; else run after "$AFTER" $i; run before "$BEFORE" $i; fi
done
