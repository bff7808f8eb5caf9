"""run_dir/engine.log: what the engine's libraries print stays off the console; a failure shows it."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from lightning_sdk.training.records.engine_log import ENGINE_LOG, EngineOutput

NUMA = b"[W1128 19:27:28.99 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy\n"


def test_what_the_engine_prints_goes_to_the_file_and_one_line_names_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    output = EngineOutput(tmp_path)
    with output.quiet("starting the engine"):
        os.write(2, NUMA)  # torch's C++ side writes to the file descriptor itself
        os.write(1, b"Loading weights: 100%|##########| 272/272\n")  # a library's progress bar
    caplog.set_level("INFO", logger="lightning_sdk")
    output.say_where()
    assert capfd.readouterr() == ("", "")  # nothing reached the console
    text = (tmp_path / ENGINE_LOG).read_text()
    assert "--- starting the engine" in text and "NUMA binding" in text and "Loading weights" in text
    [line] = [record.getMessage() for record in caplog.records]
    assert line == f"engine: 1 warning or error line(s) while starting, in {tmp_path / ENGINE_LOG}"


def test_an_engine_that_fails_to_start_shows_the_end_of_the_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    output = EngineOutput(tmp_path)
    with pytest.raises(RuntimeError, match="engine died"), output.quiet("starting the engine"):
        os.write(2, b"ValueError: the model's config.json has no architectures\n")
        raise RuntimeError("engine died")
    err = capfd.readouterr().err
    assert "starting the engine failed; the end of" in err and "has no architectures" in err
    os.write(2, b"after\n")  # the console has its descriptors back
    assert capfd.readouterr().err == "after\n"


def test_verbose_leaves_it_all_on_the_console_and_a_quiet_start_says_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with EngineOutput(tmp_path, verbose=True).quiet("starting the engine"):
        os.write(2, NUMA)
    assert "NUMA binding" in capfd.readouterr().err and not (tmp_path / ENGINE_LOG).exists()
    quiet = EngineOutput(tmp_path / "other")
    (tmp_path / "other").mkdir()
    with quiet.quiet("loading the policy"):
        os.write(1, b"Loading safetensors checkpoint shards: 100% Completed\n")
    caplog.set_level("INFO", logger="lightning_sdk")
    quiet.say_where()
    assert not caplog.records  # nothing notable: no line about the file


def test_the_engines_log_lines_follow_to_the_file_for_the_rest_of_the_run(tmp_path: Path) -> None:
    engine_logger = logging.getLogger("vllm")
    handler = logging.StreamHandler(sys.stdout)  # what vLLM sets up on import
    engine_logger.addHandler(handler)
    # Other tests (and vLLM's own logging setup) may leave the logger disabled or quiet: not this one.
    saved = engine_logger.disabled, engine_logger.level
    engine_logger.disabled = False
    engine_logger.setLevel(logging.INFO)
    try:
        output = EngineOutput(tmp_path)
        output.keep_engine_logs()
        engine_logger.warning("Sleep mode freed 0.1 GiB")
        output.close()
        assert handler.stream is sys.stdout  # given back at the end of the run
        assert "Sleep mode freed" in (tmp_path / ENGINE_LOG).read_text()
    finally:
        engine_logger.removeHandler(handler)
        engine_logger.disabled, engine_logger.level = saved
