"""`Runners`: the run's key (set, from the environment, or made by the server), a config file's mapping, and
the command that starts a runner, printed where a user sees it."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import pytest

import lightning_sdk as ls
from lightning_sdk.rollouts.queue import RolloutQueue
from lightning_sdk.rollouts.remote import KEY_FILE, start_runners, write_key_file
from lightning_sdk.rollouts.runners import KEY_VARIABLE
from lightning_sdk.serving.endpoint import LLMEndpoint


def test_the_key_is_the_one_set_else_the_environment_s_else_left_to_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    assert ls.Runners().key() is None  # the server makes a random one
    monkeypatch.setenv(KEY_VARIABLE, "sk-from-env")
    assert ls.Runners().key() == "sk-from-env"
    assert ls.Runners(api_key="sk-set").key() == "sk-set"
    assert "sk-set" not in repr(ls.Runners(api_key="sk-set"))


@pytest.mark.parametrize("bad", ["", "   ", 7])
def test_an_empty_or_non_string_key_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="api_key"):
        ls.Runners(api_key=bad)  # type: ignore[arg-type]


def test_a_config_file_configures_runners_and_run_json_never_holds_the_key() -> None:
    fields = json.loads('{"runners": {"processes": 2, "concurrency": 3, "api_key": "sk-secret"}}')
    config = ls.TrainerConfig(**fields)
    assert config.runners == ls.Runners(processes=2, concurrency=3, api_key="sk-secret")
    written = json.dumps(config.to_dict())
    assert "sk-secret" not in written and json.loads(written)["runners"]["processes"] == 2


def test_a_mapping_with_an_unknown_field_names_it_and_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown field\(s\) procs; Runners takes .*processes"):
        ls.TrainerConfig(runners={"procs": 2})


def test_the_command_that_starts_a_runner_names_the_key_file_never_the_key(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    endpoint = LLMEndpoint("http://127.0.0.1:8123/v1", "sk-run-key", "model")
    queue = RolloutQueue()
    caplog.set_level(logging.DEBUG)
    remote = start_runners(ls.Runners(agent="my_agent:solve"), 30.0, endpoint, queue, None, tmp_path)
    key_file = tmp_path / KEY_FILE
    try:
        printed = capsys.readouterr().err
        command = f"lightning-sdk runner my_agent:solve --trainer http://127.0.0.1:8123 --key-file {key_file}"
        assert command in printed and KEY_VARIABLE in printed  # where the key is, and the other way in
        assert key_file.read_text().strip() == "sk-run-key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600  # its owner's only
        assert remote.start_command == command  # what is logged again while the trainer waits
        assert remote.processes is None  # processes=0: runners started elsewhere
    finally:
        remote.close()
    assert not key_file.exists()  # removed with the run
    assert "sk-run-key" not in printed + capsys.readouterr().err + caplog.text
    assert "sk-run-key" not in repr(remote.__dict__)


def test_a_key_file_is_its_owner_s_only_whatever_was_there(tmp_path: Path) -> None:
    old = tmp_path / KEY_FILE
    old.write_text("an older key")
    old.chmod(0o644)
    assert write_key_file(tmp_path, "sk-new") == old
    assert old.read_text() == "sk-new\n" and stat.S_IMODE(old.stat().st_mode) == 0o600


def test_no_object_that_holds_the_key_shows_it_in_its_repr() -> None:
    from lightning_sdk.rollouts.runner.client import TrainerClient
    from lightning_sdk.rollouts.runners import RunnerLaunch
    from lightning_sdk.serving import Upstream
    from lightning_sdk.tracing.routing import Router

    key = "sk-run-key-0123456789"
    endpoint = LLMEndpoint("http://127.0.0.1:8123/v1", key, "model")
    holders = [
        endpoint,
        Router(endpoint.base_url, key),
        RunnerLaunch("my_agent:solve", "http://127.0.0.1:8123", key),
        ls.Runners(api_key=key),
        ls.TrainerConfig(runners=ls.Runners(api_key=key)),
        Upstream("https://api.openai.com/v1", key),
        TrainerClient("http://127.0.0.1:8123", key),
    ]
    for holder in holders:
        assert key not in repr(holder) and key not in str(holder), type(holder).__name__
    assert endpoint.api_key == key and "http://127.0.0.1:8123/v1" in repr(endpoint)  # still there, and useful
    assert RunnerLaunch("a:b", "u", key).process_environment()[KEY_VARIABLE] == key
    assert KEY_VARIABLE not in RunnerLaunch("a:b", "u", key).environment()  # what Ray's runtime_env gets
