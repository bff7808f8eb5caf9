"""The `lightning-sdk` command, run as a user would run it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lightning_sdk.cli import main
from lightning_sdk.training.records.metrics import read_metrics
from tests.fixtures.runs import interruptible

ROOT = Path(__file__).parents[1]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_CURRENT_TEST", None)
    return subprocess.run(
        [sys.executable, "-m", "lightning_sdk.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.slow
def test_train_then_report_from_the_command_line(tmp_path: Path) -> None:
    data = tmp_path / "tasks.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"Name an animal, number {i}."}) + "\n" for i in range(4))
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"group_size": 2, "batch_size": 2, "max_tokens": 6, "progress_bar": False}))
    run_dir = tmp_path / "run"

    trained = run_cli(
        "train",
        "tests.scripts.cli_agent:solver",
        "--data",
        str(data),
        "--val-data",
        str(data),
        "--reward",
        "tests.scripts.cli_agent:length_reward",
        "--config",
        str(config),
        "--steps",
        "1",
        "--run-dir",
        str(run_dir),
        cwd=ROOT,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert f"run: {run_dir}" in trained.stdout and "validation reward:" in trained.stdout
    [step] = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    assert step["episodes"] == 4 and step["episodes_unscored"] == 0  # --reward scored every episode

    reported = run_cli("report", str(run_dir), cwd=ROOT)
    assert reported.returncode == 0, reported.stderr[-3000:]
    assert (run_dir / "report.html").read_text().count("<details>") >= 1


def test_bad_arguments_get_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "is not a run folder" in capsys.readouterr().err
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"question": "hi"}\n')
    assert main(["train", "no_colon_here", "--data", str(data)]) == 2
    assert "must look like module:function" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train"])  # argparse: the agent and --data are required


def test_serve_refuses_a_taken_port_and_a_missing_model_before_loading_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--engine", "transformers", "--port", str(port)]) == 2
    assert f"Cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    assert main(["serve", "--engine", "transformers", "--port", "0", "--model", "./no/such/model"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_runs_until_interrupted_and_answers_the_openai_client(tmp_path: Path) -> None:
    import openai

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_CURRENT_TEST", None)
    command = interruptible(
        "lightning_sdk.cli",
        "serve",
        "--engine",
        "transformers",
        "--port",
        "0",
        "--max-tokens",
        "8",
    )
    # The server's log goes to a file: a pipe nobody reads until the end can fill up and block the server.
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        first = server.stdout.readline()  # blocks until the server is up (or the process ends)
        assert first.startswith("Serving SmolLM2-135M-Instruct at http://127.0.0.1:"), log.read_text()
        base_url = first.split(" at ", 1)[1].split()[0]
        assert server.stdout.readline().strip() == f"export OPENAI_BASE_URL={base_url}"
        # The random key is never printed: the line names a file only its owner can read.
        key_line = server.stdout.readline()
        key_file = Path(key_line.split("$(cat ", 1)[1].split(")", 1)[0])
        key = key_file.read_text().strip()
        assert key_file.stat().st_mode & 0o777 == 0o600 and key not in key_line + log.read_text()
        with openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60) as client:
            reply = client.chat.completions.create(
                model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Say hi."}]
            )
        assert reply.choices[0].message.content and reply.usage.completion_tokens <= 8
    finally:
        server.send_signal(signal.SIGINT)
        try:
            returncode = server.wait(timeout=180)  # a loaded machine needs time to drain and stop the engine
        except subprocess.TimeoutExpired as timeout:
            server.kill()
            raise AssertionError(
                f"serve did not stop within 180 s of Ctrl+C; its log:\n{log.read_text()}"
            ) from timeout
    assert returncode in (0, -signal.SIGINT, 130), log.read_text()
    assert not key_file.exists()  # removed when the server stopped


def test_quickstart_without_autogen_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "autogen_agentchat", None)  # makes `import autogen_agentchat` fail
    assert main(["quickstart", "--steps", "1"]) == 2
    assert "pip install -e '.[autogen]'" in capsys.readouterr().err


@pytest.fixture
def engine(vllm_engine: Any) -> Any:
    yield vllm_engine
    vllm_engine.load_adapter(None, version=None)  # base weights back for the next test


@pytest.mark.slow
def test_quickstart_trains_the_calculator_agent_and_reports(
    engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_sdk.cli import _print_quickstart_summary
    from lightning_sdk.integrations.autogen import uninstrument_autogen
    from lightning_sdk.quickstart import QUICKSTART, run_quickstart

    try:  # the quickstart's own configuration, shrunk to one small step on the session's engine
        summary = run_quickstart(1, tmp_path / "run", engine=engine, test_size=4, batch_size=2, group_size=2)
    finally:
        uninstrument_autogen()
    assert summary["steps"] == 1 and 0 <= summary["base_reward"] <= 1 and 0 <= summary["trained_reward"] <= 1
    config = json.loads((tmp_path / "run" / "run.json").read_text())["config"]
    assert (
        config["dynamic_sampling_rounds"] == QUICKSTART["dynamic_sampling_rounds"] > 0
    )  # what made it learn
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (step,) = [record for record in records if "rollout_rounds" in record]
    assert 1 <= step["rollout_rounds"] <= 1 + QUICKSTART["dynamic_sampling_rounds"]
    report = (tmp_path / "run" / "report.html").read_text()
    assert "lightning-sdk run report" in report and "math_solver" in report  # the snapshot, with the calls
    _print_quickstart_summary(summary)
    printed = capsys.readouterr().out
    assert f"base {summary['base_reward']:.3f} -> trained {summary['trained_reward']:.3f}" in printed
    assert f"lightning-sdk view {tmp_path / 'run'}" in printed and "lightning-sdk serve --adapter" in printed


def test_the_help_lists_commands_in_the_order_a_newcomer_meets_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from lightning_sdk.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    listed = re.search(r"\{([a-z,]+)\}", capsys.readouterr().out)
    assert listed is not None and listed.group(1).split(",") == [
        "quickstart",
        "train",
        "view",
        "serve",
        "report",
        "import",
        "sft",
        "memory",
        "runner",
    ]


def test_a_run_ends_with_what_to_do_next_in_at_most_four_lines() -> None:
    from lightning_sdk.cli import _next_steps

    lines = _next_steps("runs/a", "runs/a/best_adapter", "runs/a/report.html").splitlines()
    assert len(lines) <= 4
    assert lines[0] == "look at it: lightning-sdk view runs/a   (offline: runs/a/report.html)"
    assert lines[-1] == "serve it:   lightning-sdk serve --adapter runs/a/best_adapter"


def test_task_files_keep_tasks_whose_text_holds_unicode_line_separators(tmp_path) -> None:
    from lightning_sdk.cli import _read_jsonl

    tasks = [{"question": "first\u2028line\x85two"}, {"question": "plain"}]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task, ensure_ascii=False) + "\n" for task in tasks), encoding="utf-8")
    assert _read_jsonl(str(path)) == tasks


def test_sft_from_a_store_that_does_not_exist_is_an_error_that_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = tmp_path / "epsiodes.db"
    assert main(["sft", "--store", str(typo), "--run-dir", str(tmp_path / "run")]) == 2
    said = capsys.readouterr().err
    assert f"No episode store at {typo}: check the path" in said
    assert not typo.exists() and not (tmp_path / "run").exists()  # nothing made, nothing trained
