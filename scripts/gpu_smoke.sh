#!/usr/bin/env bash
# The GPU smoke test: run it first on any machine with CUDA GPUs (docs/gpu.md says what it checks and what a
# pass looks like). Needs the project installed with the GPU extras, from a clone:
#   make install EXTRAS=all,dev,docs,bench   (vLLM 0.32 for GPUs and the CUDA 13 build of torch it pins)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
"$PYTHON" - <<'PY'
import torch
if not torch.cuda.is_available():
    raise SystemExit("No CUDA GPU is visible to torch: this smoke test needs one (it would skip everything).")
names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPUs: {names}")
# The policy trains in bfloat16 on a GPU (dtype="auto"); GPUs before Ampere have no bfloat16 arithmetic.
print(f"bfloat16 arithmetic on cuda:0: {torch.cuda.is_bf16_supported(including_emulation=False)}")
import vllm
print(f"vllm {vllm.__version__}")
PY
exec "$PYTHON" -m pytest -m gpu -v -rs -p no:cacheprovider tests/test_gpu.py "$@"
