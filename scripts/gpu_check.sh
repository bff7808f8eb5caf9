#!/usr/bin/env bash
# What a GPU machine without vLLM or network can check, in one command (docs/gpu.md):
#   1. the packed training pass equals the padded one on CUDA, gradients included, with flex attention and
#      with SDPA (tests/test_training_packing.py; the CPU tests of that file run too);
#   2. two GRPO steps of Trainer.fit with engine="transformers" on a small random-weight model folder
#      (scripts/gpu_fit_check.py; built beforehand with `python scripts/gpu_fit_check.py build
#      gpu_check_model` and copied with the repository; GPU_CHECK_MODEL names another folder);
#   3. benchmarks/gpu_train.py: packed against padded, TRL's way and Liger's fused loss (when installed), on
#      random weights from the published Qwen2.5 configs.
# Needs torch (CUDA), transformers, peft, pytest and this package importable (PYTHONPATH=. from a copy of
# the repository is enough; the fit also needs the package's serving dependencies: docs/gpu.md).
# Usage: scripts/gpu_check.sh [benchmark arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
python - <<'PY'
import torch, transformers, peft
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, "
      f"peft {peft.__version__}, GPU: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
PY
status=0
start=$SECONDS
python -m pytest -q -p no:cacheprovider tests/test_training_packing.py || status=$?
echo "packed-pass checks: $((SECONDS - start)) s (exit $status)"
model="${GPU_CHECK_MODEL:-gpu_check_model}"
if [ -f "$model/config.json" ]; then
	start=$SECONDS
	python scripts/gpu_fit_check.py fit "$model" || status=$?
	echo "fit check: $((SECONDS - start)) s (exit $status)"
else
	echo "fit check skipped: no model folder $model (python scripts/gpu_fit_check.py build $model)"
fi
start=$SECONDS
python benchmarks/gpu_train.py "$@" || status=$?
echo "benchmark: $((SECONDS - start)) s"
exit "$status"
