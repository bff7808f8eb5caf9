#!/usr/bin/env bash
# Issue 63 on a GPU machine, after scripts/gpu_check.sh (docs/gpu.md, "Recompute only what memory needs"):
#   1. the packed 7B pass on the 16-sample and the 64-sample GRPO steps, all four sides, with gradient
#      checkpointing as the trainer's "auto" decides on this GPU, and the profile of the 16-sample step
#      (benchmarks/results/gpu_train_profile_gpu.md);
#   2. the packed side again with checkpointing forced on: what "auto" saved.
# Writes benchmarks/results/gpu_pace_{auto,on}.{md,json}. About 5 minutes on an H200.
# Usage: scripts/gpu_pace.sh [extra benchmark arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
status=0
start=$SECONDS
python benchmarks/gpu_train.py --models 7b --workloads grpo-step grpo-64 --profile \
	--output benchmarks/results/gpu_pace_auto "$@" || status=$?
echo "auto: $((SECONDS - start)) s (exit $status)"
start=$SECONDS
python benchmarks/gpu_train.py --models 7b --workloads grpo-step grpo-64 --sides packed --checkpointing on \
	--output benchmarks/results/gpu_pace_on "$@" || status=$?
echo "forced on: $((SECONDS - start)) s (exit $status)"
exit "$status"
