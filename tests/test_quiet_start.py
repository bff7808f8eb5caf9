"""The first ten minutes: `lightning-sdk quickstart` prints only its own lines before its first progress bar.

What vLLM, Triton, torch's C++ side and the weight loaders print goes to `run_dir/engine.log`; one line names
that file when it holds a warning. The quickstart runs in a subprocess, as a newcomer runs it, and is
stopped at its first progress bar (the held-out evaluation of the base model).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.runs import REPOSITORY

pytestmark = pytest.mark.slow

OURS = [
    re.compile(pattern)
    for pattern in (
        r"starting the (auto|vllm|transformers) engine on .+",
        r"serving .+ at http://127\.0\.0\.1:\d+/v1",
        r"memory: a training step needs at most [\d.]+ GiB( of the [\d.]+ GiB available)?, at .+",
        r"engine: \d+ warning or error line\(s\) while starting, in .+engine\.log",
    )
]
"""Every line the quickstart may print before its first progress bar."""
FIRST_BAR = re.compile(r"^(evaluating|training)\b")


def test_the_quickstart_prints_only_its_own_lines_before_the_first_progress_bar(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_CURRENT_TEST", None)
    command = [
        sys.executable,
        "-m",
        "lightning_sdk.cli",
        "quickstart",
        "--steps",
        "1",
        "--run-dir",
        str(run_dir),
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    printed: list[str] = []
    deadline = time.monotonic() + 600
    try:
        buffer = b""
        while not any(FIRST_BAR.match(line) for line in printed):
            assert time.monotonic() < deadline, f"no progress bar within 10 minutes; printed: {printed}"
            chunk = process.stdout.read1(4096)  # type: ignore[attr-defined]
            assert chunk, f"the quickstart ended before its first progress bar: {printed}"
            buffer += chunk
            *whole, buffer = re.split(rb"[\r\n]", buffer)
            printed += [line.decode(errors="replace").strip() for line in whole if line.strip()]
    finally:
        process.kill()
        process.wait(30)
    before = printed[: next(i for i, line in enumerate(printed) if FIRST_BAR.match(line))]
    strangers = [line for line in before if not any(pattern.fullmatch(line) for pattern in OURS)]
    assert not strangers, f"printed before the first progress bar, not by us: {strangers}"
    log = (run_dir / "engine.log").read_text()
    assert "--- starting the engine" in log and "--- loading the policy" in log
