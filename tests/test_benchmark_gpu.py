"""`benchmarks/gpu.py` before its first GPU: on a machine without CUDA it refuses at once with a message (no
traceback), and its synthetic prompts have the lengths the table reports."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.fixtures.runs import REPOSITORY

SCRIPT = REPOSITORY / "benchmarks" / "gpu.py"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: the benchmark would run")
def test_without_a_gpu_it_refuses_with_a_message(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--output", str(tmp_path / "gpu")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 1
    assert "needs a CUDA GPU" in completed.stderr and "make install" in completed.stderr
    assert "Traceback" not in completed.stderr
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("tokens", [256, 2048])
def test_synthetic_prompts_have_the_asked_length(bundled_model_path: Path, tokens: int) -> None:
    from transformers import AutoTokenizer

    benchmark = _benchmark()
    tokenizer = AutoTokenizer.from_pretrained(str(bundled_model_path))
    texts = [benchmark.synthetic_text(tokenizer, tokens, seed) for seed in (0, 1)]
    assert texts[0] != texts[1]  # each task its own text: no prefix shared across tasks
    for text in texts:
        assert abs(benchmark.prompt_length(tokenizer, text) - tokens) <= 2
