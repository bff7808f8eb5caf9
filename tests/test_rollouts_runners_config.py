"""`Runners`: the run's key (set, from the environment, or made by the server), a config file's mapping, and
the command that starts a runner, printed where a user sees it."""

from __future__ import annotations

import json

import pytest

import lightning_sdk as ls
from lightning_sdk.rollouts.queue import RolloutQueue
from lightning_sdk.rollouts.remote import start_runners
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


def test_the_command_that_starts_a_runner_is_printed_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = LLMEndpoint("http://127.0.0.1:8123/v1", "sk-run-key", "model")
    queue = RolloutQueue()
    remote = start_runners(ls.Runners(agent="my_agent:solve"), 30.0, endpoint, queue, None)
    try:
        printed = capsys.readouterr().err
        assert (
            "LIGHTNING_SDK_KEY=sk-run-key lightning-sdk runner my_agent:solve --trainer http://127.0.0.1:8123"
            in printed
        )
        assert remote.processes is None  # processes=0: runners started elsewhere
    finally:
        remote.close()
