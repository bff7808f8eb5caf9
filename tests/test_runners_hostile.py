"""A runner that sends bad bodies, over plain HTTP, against a real trainer on the shared engine: every bad
body is refused with the field it got wrong, nothing of it is stored, its rollouts go to an honest runner
(or are dropped after `max_attempts`), and the run finishes its steps. The run's key shows in no repr, log
line or printed line, and lives in a file only its owner can read. A start that fails part-way leaves no
server behind."""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import lightning_sdk as ls
from lightning_sdk.rollouts.remote import KEY_FILE
from lightning_sdk.rollouts.runners import KEY_VARIABLE
from lightning_sdk.serving.keys import MODEL_KEY_PREFIX
from lightning_sdk.tracing.store import EpisodeStore
from tests.scripts.runner_agent import solver

pytestmark = pytest.mark.slow

TASKS = [{"question": "Name a fruit."}]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _lease(http: httpx.Client) -> dict[str, Any]:
    """The next rollout, waiting for the trainer's server to come up and a step to open rollouts."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            answer = http.post("/v1/rollouts/lease", json={"runner": "hostile", "wait_s": 30})
        except httpx.TransportError:
            time.sleep(0.2)  # the trainer is still starting
            continue
        if answer.status_code == 200:
            return dict(answer.json())
    raise AssertionError("no rollout was issued")


def _refused(answer: httpx.Response, param: str | None) -> None:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param, error
    assert param is None or error["message"].startswith((f"{param}: ", f"Unknown field {param!r}")), error


class Hostile:
    """Leases rollouts and answers each with bad bodies; records what it saw for the test to check."""

    def __init__(self, root: str, key: str, run_dir: Path, trainer: ls.Trainer) -> None:
        self.http = httpx.Client(base_url=root, headers={"Authorization": f"Bearer {key}"}, timeout=120)
        self.key, self.run_dir, self.trainer = key, run_dir, trainer
        self.leases: list[dict[str, Any]] = []
        self.key_file_mode: int | None = None
        self.reprs = ""

    def run(self) -> None:
        first = self._bad_episodes_and_more()
        # While the run goes on: the key file, and what the run's objects show of themselves.
        self.key_file_mode = stat.S_IMODE((self.run_dir / KEY_FILE).stat().st_mode)
        session = self.trainer.session
        assert session is not None
        self.reprs = repr(session) + repr(session.server) + repr(session.endpoint) + repr(session.router)
        # One more bad upload, for the second rollout; then an upload of the right types whose token id
        # the model does not have (stored, then counted as failed by the trainer); then the first rollout
        # again, at once (no lease had to lapse), and its second and last bad upload.
        second = self._lease()
        bad = {"lease_id": second["lease_id"], "episode": {"name": "hostile", "metadata": []}}
        _refused(self.http.post(f"/v1/rollouts/{second['rollout_id']}/episode", json=bad), "episode.metadata")
        third = self._lease()
        call = {"prompt_token_ids": [1, 2], "completion_token_ids": [10**9], "base_url": third["base_url"]}
        typed = {"name": "hostile-vocab", "calls": [call], "rewards": {"r": 1.0}}
        typed["metadata"] = {"base_url": third["base_url"]}
        stored = self.http.post(
            f"/v1/rollouts/{third['rollout_id']}/episode",
            json={"lease_id": third["lease_id"], "episode": typed},
        )
        assert stored.json() == {"stored": True}, stored.text
        again = self._lease()
        assert (again["rollout_id"], again["attempt"]) == (first, 2)
        bad = {"lease_id": again["lease_id"], "episode": {"name": "hostile", "metadata": []}}
        _refused(self.http.post(f"/v1/rollouts/{first}/episode", json=bad), "episode.metadata")

    def _lease(self) -> dict[str, Any]:
        lease = _lease(self.http)
        self.leases.append(lease)
        return lease

    def _bad_episodes_and_more(self) -> str:
        lease = self._lease()
        rollout, held = lease["rollout_id"], {"lease_id": lease["lease_id"]}
        episode = f"/v1/rollouts/{rollout}/episode"
        for body, param in (
            # The upload that used to end the run (stored with 200, then fit failed on it).
            ({"name": "hostile", "rewards": {"r": "1"}, "metadata": []}, "episode.rewards.r"),
            ({"name": "hostile", "metadata": []}, "episode.metadata"),
            ({"name": "hostile", "rewards": {"r": True}}, "episode.rewards.r"),
            (
                {"name": "hostile", "calls": [{"prompt_token_ids": ["a"]}]},
                "episode.calls[0].prompt_token_ids[0]",
            ),
            ({"name": "hostile", "children": [{"rewards": {"r": [1]}}]}, "episode.children[0].rewards.r"),
            ({"name": "hostile", "surprise": 1}, "episode.surprise"),
        ):
            _refused(self.http.post(episode, json={**held, "episode": body}), param)
        nan = json.dumps({**held, "episode": {"name": "hostile"}}).replace(
            '"hostile"}', '"hostile", "rewards": {"r": NaN}}'
        )
        _refused(self.http.post(episode, content=nan.encode()), "episode.rewards.r")
        deep = b'{"lease_id": "x", "episode": {"metadata": {"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}}"
        _refused(self.http.post(episode, content=deep), None)
        reward = f"/v1/rollouts/{rollout}/reward"
        _refused(self.http.post(reward, json={**held, "reward": "1"}), "reward")
        _refused(self.http.post(reward, json={**held, "reward": True}), "reward")
        _refused(
            self.http.post(reward, json={**held, "reward": 1, "step_rewards": [None, "x"]}), "step_rewards[1]"
        )
        _refused(self.http.post("/v1/rollouts/lease", json={"runner": 5}), "runner")
        _refused(self.http.post("/v1/rollouts/lease", json={"wait_s": "1"}), "wait_s")
        _refused(self.http.post(f"/v1/rollouts/{rollout}/renew", json={"lease_id": 7}), "lease_id")
        # Its lease ended with the first refusal: nothing it sends under it is taken any more.
        late = self.http.post(episode, json={**held, "episode": {"name": "hostile"}})
        assert late.status_code == 409, late.text
        return str(rollout)


def test_a_hostile_runner_costs_the_run_some_rollouts_never_the_run(
    vllm_engine: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lightning_sdk.runner import run_runner

    caplog.set_level(logging.DEBUG)
    key, port = f"sk-test-{secrets.token_hex(12)}", _free_port()
    monkeypatch.setenv(KEY_VARIABLE, key)  # as a runner process gets it; the runner takes it out
    run_dir = tmp_path / "run"
    config = ls.TrainerConfig(
        group_size=3,
        batch_size=1,
        max_steps=2,
        max_tokens=6,
        learning_rate=1e-3,
        eval_every=0,
        save_every=0,
        run_dir=str(run_dir),
        progress_bar=False,
        runners=ls.Runners(processes=0, port=port, api_key=key, max_attempts=2),
    )
    trainer = ls.Trainer(config=config, engine=vllm_engine)
    root = f"http://127.0.0.1:{port}"
    hostile = Hostile(root, key, run_dir, trainer)
    failures: list[BaseException] = []

    def hostile_then_honest() -> None:
        try:
            hostile.run()
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            failures.append(error)
        # An honest runner runs what is left, until the trainer says training is over.
        run_runner(solver, root, key)

    runners = threading.Thread(target=hostile_then_honest, daemon=True)
    runners.start()
    result = trainer.fit(solver, TASKS)
    runners.join(120)
    assert not failures, failures
    assert not runners.is_alive()  # told that training is over

    # The run finished its steps, on the honest runner's episodes.
    assert [record["step"] for record in result.history if "reward_mean" in record] == [1, 2]
    with EpisodeStore(run_dir / "episodes.sqlite") as store:
        stored = store.episodes()
    assert len(stored) == 6 and not any(episode.name == "hostile" for episode in stored)
    [dropped] = [e for e in stored if e.metadata.get("rollout_id") == hostile.leases[0]["rollout_id"]]
    [vocab] = [episode for episode in stored if episode.name == "hostile-vocab"]
    assert dropped.metadata["attempt"] == 2 and dropped.error is not None
    assert dropped.error["message"].count("sent a body the trainer refused (episode.") == 2
    assert vocab.name == "hostile-vocab" and vocab.error is not None
    assert "outside the model's vocabulary" in vocab.error["message"]
    honest = [episode for episode in stored if episode.error is None]
    assert len(honest) == 4 and all(episode.metadata["runner"] != "hostile" for episode in honest)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        f"rollout {dropped.metadata['rollout_id']} dropped after 2 attempts" in line for line in warned
    )

    # The key: in a file only its owner could read while the run lasted, nowhere else.
    assert hostile.key_file_mode == 0o600 and not (run_dir / KEY_FILE).exists()
    printed = capsys.readouterr()
    assert f"--key-file {run_dir / KEY_FILE}" in printed.err
    for shown in (printed.out, printed.err, caplog.text, hostile.reprs, (run_dir / "run.json").read_text()):
        assert key not in shown
    assert KEY_VARIABLE not in os.environ  # the runner took it out of what the agent's tools inherit
    # The agent's environment held the model key, which opens model calls only (`serving/keys.py`).
    assert {episode.metadata["key_kind"] for episode in honest} == {MODEL_KEY_PREFIX}


def test_a_start_that_fails_part_way_leaves_no_server_and_the_engine_serving(
    vllm_engine: Any, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import save_file

    from lightning_sdk.engine.types import SamplingParams

    # A warm start that is a whole adapter folder of another model: it fails once the endpoint is up, when
    # its weights meet the policy.
    other = tmp_path / "other-model-adapter"
    other.mkdir()
    save_file(
        {"base_model.model.elsewhere.lora_A.weight": torch.zeros(4, 4)},
        str(other / "adapter_model.safetensors"),
    )
    (other / "adapter_config.json").write_text(json.dumps({"r": 4}))
    port = _free_port()
    config = ls.TrainerConfig(
        max_steps=1,
        run_dir=str(tmp_path / "run"),
        progress_bar=False,
        init_adapter=str(other),
        runners=ls.Runners(processes=0, port=port),
    )
    before = {thread.ident for thread in threading.enumerate()}
    with pytest.raises(ValueError, match="does not fit this model"):
        ls.Trainer(config=config, engine=vllm_engine).fit(solver, TASKS)
    started = [thread.name for thread in threading.enumerate() if thread.ident not in before]
    assert "lightning-sdk-server" not in started  # the server thread ended
    with socket.socket() as probe:  # and its port is free again
        probe.bind(("127.0.0.1", port))
    # The caller's engine is left as it was given: awake and serving.
    [answer] = vllm_engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert answer.completions and answer.completions[0].token_ids
