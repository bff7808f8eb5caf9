#!/usr/bin/env bash
# The GPU smoke test: run it first on any machine with CUDA GPUs (docs/gpu.md says what it checks and what a
# pass looks like). Needs the project installed with the GPU extras:
#   make install EXTRAS=all,dev TORCH=torch   (a CUDA build of torch, and vLLM for GPUs)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
"$PYTHON" - <<'PY'
import torch
if not torch.cuda.is_available():
    raise SystemExit("No CUDA GPU is visible to torch: this smoke test needs one (it would skip everything).")
names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPUs: {names}")
import vllm
print(f"vllm {vllm.__version__}")
PY
exec "$PYTHON" -m pytest -m gpu -v -rs -p no:cacheprovider tests/test_gpu.py "$@"
