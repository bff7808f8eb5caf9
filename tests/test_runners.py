"""Rollouts out of process: runner processes lease rollouts from the trainer's server over HTTP, run the
agent against the real engine and upload the episodes; the trainer trains on them like on its own."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

import lightning_sdk as ls
from lightning_sdk.rollouts import RolloutQueue, RolloutSpec
from lightning_sdk.rollouts.routes import install_rollout_routes
from lightning_sdk.rollouts.runners import RunnerLaunch, RunnerProcesses
from lightning_sdk.serving.keys import model_key
from lightning_sdk.tracing.store import EpisodeStore
from lightning_sdk.training.algorithm.staleness import version_number
from tests.fixtures.runs import REPOSITORY, interruptible
from tests.fixtures.tools import CHAT_ADD_STRICT

pytestmark = pytest.mark.slow

AGENT = "tests.scripts.runner_agent:solver"
TASKS = [{"question": f"Name a fruit, number {i}."} for i in range(4)]


@pytest.fixture
def repository_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runner processes import the agent module from the working directory and PYTHONPATH, as a user's would.
    monkeypatch.chdir(REPOSITORY)


@contextmanager
def _protocol(vllm_engine: Any, openai_server: Any, lease_timeout_s: float) -> Iterator[Any]:
    from lightning_sdk.serving import Upstream, start_server

    queue = RolloutQueue(lease_timeout_s=lease_timeout_s, episode_timeout_s=120.0, max_attempts=3)
    server = start_server(
        vllm_engine,
        routes=[lambda app, authorize: install_rollout_routes(app, authorize, queue)],
        upstream=Upstream(openai_server.base_url, openai_server.api_key),
    )
    try:
        yield queue, server
    finally:
        queue.close("test over")
        server.stop()


@pytest.fixture
def protocol_server(vllm_engine: Any, openai_server: Any) -> Iterator[Any]:
    """The runner protocol on a server over the shared engine; the test server is its upstream for routes
    it does not serve. The lease is long: a test that drives the protocol by hand takes its time between
    calls on a loaded machine, and only `test_a_killed_runner_loses_its_rollout_to_another` needs one to
    lapse (it makes its own, short)."""
    with _protocol(vllm_engine, openai_server, lease_timeout_s=30.0) as protocol:
        yield protocol


def _fit(vllm_engine: Any, run_dir: Path, runners: Any) -> Any:
    from tests.scripts.runner_agent import solver

    config = ls.TrainerConfig(
        group_size=2,
        batch_size=2,
        max_steps=1,
        max_tokens=6,
        learning_rate=1e-3,
        eval_every=0,
        save_every=0,
        run_dir=str(run_dir),
        progress_bar=False,
        runners=runners,
    )
    return ls.Trainer(config=config, engine=vllm_engine).fit(solver, TASKS)


def _adapter_moved(result: Any) -> bool:
    from safetensors.torch import load_file

    weights = load_file(str(result.adapter_path / "adapter_model.safetensors"))
    return sum(float(tensor.norm()) for name, tensor in weights.items() if "lora_B" in name) > 0


def _structure(run_dir: Path) -> list[tuple[Any, ...]]:
    with EpisodeStore(run_dir / "episodes.sqlite") as store:
        episodes = list(store.episodes())
    assert len(episodes) == 4
    rows = []
    for episode in episodes:
        assert episode.error is None and episode.reward is not None
        for call in episode.all_calls():
            assert call.prompt_token_ids and call.completion_token_ids  # the exact ids the engine served
        rows.append(
            (episode.name, len(episode.all_calls()), sorted(episode.rewards), episode.metadata["task_index"])
        )
    return sorted(rows)


def test_two_runner_processes_train_like_in_process_rollouts(
    vllm_engine, tmp_path, repository_importable
) -> None:
    in_process = _fit(vllm_engine, tmp_path / "here", None)
    on_runners = _fit(vllm_engine, tmp_path / "runners", ls.Runners(processes=2, lease_timeout_s=10))
    assert _structure(tmp_path / "runners") == _structure(tmp_path / "here")
    with EpisodeStore(tmp_path / "runners" / "episodes.sqlite") as store:
        runners = {episode.metadata["runner"] for episode in list(store.episodes())}
    assert runners <= {"local-0", "local-1"} and runners
    for result in (in_process, on_runners):
        [record] = [r for r in result.history if "reward_mean" in r]
        assert record["samples"] > 0  # the runners' calls were trained on, not filtered as another server's
        assert _adapter_moved(result)


def test_runner_processes_run_on_through_the_update(vllm_engine, tmp_path, repository_importable) -> None:
    """max_staleness=1 with runners: their agents wait on a tool between two calls while the trainer
    updates; a leased rollout stays leased (its calls wait at the gate), and every call knows its weights."""
    from tests.scripts.runner_agent import solver

    tasks = [{"question": f"Name a fruit, number {i}.", "calls": 2, "tool_s": 1.0} for i in range(8)]
    run_dir = tmp_path / "run"
    config = ls.TrainerConfig(
        group_size=2,
        batch_size=2,
        max_steps=3,
        max_staleness=1,
        max_tokens=6,
        learning_rate=1e-3,
        eval_every=0,
        save_every=0,
        run_dir=str(run_dir),
        progress_bar=False,
        runners=ls.Runners(processes=2, lease_timeout_s=10),
    )
    result = ls.Trainer(config=config, engine=vllm_engine).fit(solver, tasks)

    steps = [record for record in result.history if "reward_mean" in record]
    assert [record["step"] for record in steps] == [1, 2, 3]
    for record in steps:
        assert record["episodes_failed"] == 0 and record["groups_rolled_out"] == 2
        assert record["groups_staleness_0"] + record["groups_staleness_1"] == 2
    with EpisodeStore(run_dir / "episodes.sqlite") as store:
        episodes = list(store.episodes())
    assert {episode.metadata["runner"] for episode in episodes} <= {"local-0", "local-1"}
    trained = [episode for episode in episodes if "not_trained" not in episode.metadata]
    assert len(trained) == 3 * 2 * 2
    for episode in trained:  # the gateway's records name the weights that answered, in order
        versions = [version_number(call.policy_version) for call in episode.all_calls()]
        step = episode.metadata["step"]
        assert len(versions) == 2 and versions == sorted(versions)
        assert step - 2 <= versions[0] <= versions[-1] <= step - 1


def test_a_killed_runner_loses_its_rollout_to_another(
    vllm_engine, openai_server, tmp_path, repository_importable
) -> None:
    # A short lease, so the killed runner's rollout is re-issued soon; the live runner renews it every
    # 2 s (a third of it), so even a slow renewal keeps its own.
    with _protocol(vllm_engine, openai_server, lease_timeout_s=6.0) as (queue, server):
        _kill_a_runner_mid_episode(queue, server, tmp_path)


def _kill_a_runner_mid_episode(queue: RolloutQueue, server: Any, tmp_path: Path) -> None:
    marker = tmp_path / "hanging-runner.pid"
    tasks = [{**TASKS[0], "hang_once": str(marker)}, *TASKS[1:]]
    ids = queue.submit(RolloutSpec(queue.new_id(), task, policy_version=None) for task in tasks)
    url = server.endpoint.base_url.removesuffix("/v1")
    processes = RunnerProcesses(2, RunnerLaunch(AGENT, url, server.endpoint.api_key, episode_timeout_s=120))
    try:
        deadline = time.monotonic() + 120
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        hanging = int(marker.read_text())
        assert hanging in processes.pids
        os.kill(hanging, signal.SIGKILL)  # mid-episode
        outcomes = queue.wait(ids, timeout_s=180, on_poll=processes.restart_exited)
    finally:
        processes.stop()
    assert all(o.episode is not None and o.failure is None for o in outcomes)
    assert outcomes[0].attempts == 2  # re-issued after the killed runner's lease lapsed
    assert len({o.episode["id"] for o in outcomes}) == 4  # none lost, none counted twice
    assert all(o.episode["calls"] and o.episode["calls"][0]["completion_token_ids"] for o in outcomes)


def test_a_runner_started_before_the_trainer_connects_when_it_comes_up(
    vllm_engine, tmp_path, repository_importable
):
    from lightning_sdk.serving import start_server

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    key = "sk-test-runner-first"
    log = tmp_path / "runner.log"
    env = {**os.environ, "LIGHTNING_SDK_KEY": key, "PYTHONPATH": str(REPOSITORY)}
    with log.open("w") as output:
        runner = subprocess.Popen(
            interruptible("lightning_sdk.cli", "runner", AGENT, "--trainer", f"http://127.0.0.1:{port}"),
            env=env,
            stderr=output,
            stdout=output,
        )
    try:
        # Until the runner says that it waits for the trainer, which is not there yet.
        deadline = time.monotonic() + 120
        while "cannot reach the trainer" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        queue = RolloutQueue(lease_timeout_s=10)
        routes = [lambda app, authorize: install_rollout_routes(app, authorize, queue)]
        with start_server(vllm_engine, port=port, api_key=key, routes=routes):
            [outcome] = queue.wait(queue.submit([RolloutSpec("r0", TASKS[0])]), timeout_s=120)
    finally:
        runner.send_signal(signal.SIGINT)
        runner.wait(120)  # generous: on a loaded machine the runner takes a while to notice and exit
    assert outcome.episode is not None and outcome.episode["rewards"]
    said = log.read_text()
    assert f"cannot reach the trainer at http://127.0.0.1:{port}" in said and "answers again" in said


def test_bad_requests_get_clear_errors_and_lose_nothing(protocol_server) -> None:
    queue, server = protocol_server
    root, key = server.endpoint.base_url.removesuffix("/v1"), server.endpoint.api_key
    good = httpx.Client(base_url=root, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    ids = queue.submit([RolloutSpec("ok", {"q": 1}), RolloutSpec("other", {"q": 2})])
    lease = good.post("/v1/rollouts/lease", json={"runner": "t", "wait_s": 1}).json()
    stored = good.post(
        f"/v1/rollouts/{lease['rollout_id']}/episode",
        json={"lease_id": lease["lease_id"], "episode": {"name": "solver"}},
    )
    assert stored.json() == {"stored": True}

    def refused(response: httpx.Response, status: int, code: str) -> None:
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code

    for client in (
        httpx.Client(base_url=root, timeout=30),
        httpx.Client(base_url=root, headers={"Authorization": "Bearer wrong"}, timeout=30),
    ):
        refused(client.post("/v1/rollouts/lease", json={"runner": "t"}), 401, "invalid_api_key")
        refused(
            client.post(
                f"/v1/rollouts/{lease['rollout_id']}/episode",
                json={"lease_id": lease["lease_id"], "episode": {}},
            ),
            401,
            "invalid_api_key",
        )
    # The key a runner hands its agent opens model calls only: the protocol's routes refuse it, so a tool
    # that reads the agent's OPENAI_API_KEY cannot lease, upload or end a lease.
    agents = httpx.Client(base_url=root, headers={"x-api-key": model_key(key)}, timeout=30)
    refused(agents.post("/v1/rollouts/lease", json={"runner": "t"}), 403, "model_key_only")
    refused(agents.get("/v1/rollouts"), 403, "model_key_only")
    refused(
        agents.post(f"/v1/rollouts/{lease['rollout_id']}/episode", json={"lease_id": "x", "episode": {}}),
        403,
        "model_key_only",
    )
    assert agents.get("/v1/models").status_code == 200
    refused(
        good.post("/v1/rollouts/nope/episode", json={"lease_id": "x", "episode": {}}), 404, "unknown_rollout"
    )
    refused(
        good.post(f"/v1/rollouts/{lease['rollout_id']}/episode", json={"lease_id": "stolen", "episode": {}}),
        409,
        "lease_lost",
    )
    second = good.post("/v1/rollouts/lease", json={"runner": "t", "wait_s": 1}).json()
    no_calls = good.post(
        f"/v1/rollouts/{second['rollout_id']}/episode",
        json={"lease_id": second["lease_id"], "episode": {"calls": "no"}},
    )
    refused(no_calls, 400, "invalid_episode")
    assert no_calls.json()["error"]["param"] == "episode.calls"
    refused(
        good.post(
            f"/v1/rollouts/{second['rollout_id']}/episode",
            json={"lease_id": second["lease_id"], "episode": {"surprise": 1}},
        ),
        400,
        "invalid_episode",
    )
    refused(
        good.post(f"/v1/rollouts/{second['rollout_id']}/episode", content=b"{not json"), 400, "invalid_json"
    )
    refused(good.post("/v1/rollouts/lease", json={"runner": "t", "wait_s": 999}), 400, "invalid_value")
    misspelt = good.post("/v1/rollouts/lease", json={"runner": "t", "wait": 5})
    refused(misspelt, 400, "invalid_value")
    assert misspelt.json()["error"]["param"] == "wait"
    assert misspelt.json()["error"]["message"] == "Unknown field 'wait': this body takes runner, wait_s."
    refused(good.post("/v1/rollouts/lease", json=[1]), 400, "invalid_json")
    huge = b'{"lease_id": "x", "episode": {"output": "' + b"x" * (33 * 1024 * 1024) + b'"}}'
    refused(good.post(f"/v1/rollouts/{second['rollout_id']}/episode", content=huge), 413, "payload_too_large")
    # Nothing refused was stored. The refused episode ended its lease (the rollout goes to the next
    # runner at once), and the server still serves both protocols.
    refused(
        good.post(
            f"/v1/rollouts/{second['rollout_id']}/episode",
            json={"lease_id": second["lease_id"], "episode": {"name": "solver"}},
        ),
        409,
        "lease_lost",
    )
    again = good.post("/v1/rollouts/lease", json={"runner": "t", "wait_s": 1}).json()
    assert (again["rollout_id"], again["attempt"]) == (second["rollout_id"], 2)
    assert good.post(
        f"/v1/rollouts/{again['rollout_id']}/episode",
        json={"lease_id": again["lease_id"], "episode": {"name": "solver"}},
    ).json() == {"stored": True}
    outcomes = queue.wait(ids, timeout_s=5)
    assert [o.episode["name"] for o in outcomes] == ["solver", "solver"]
    assert server.endpoint.openai_client().models.list().data


def test_gateway_records_a_plain_http_agent_and_its_reward(protocol_server) -> None:
    # An agent in any language: plain HTTP, no decorator, no openai client, no recording of its own.
    queue, server = protocol_server
    root, key = server.endpoint.base_url.removesuffix("/v1"), server.endpoint.api_key
    http = httpx.Client(base_url=root, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    [rollout_id] = queue.submit([RolloutSpec("g0", {"question": "What is 2 + 2?"}, policy_version=5)])

    def leased() -> tuple[dict[str, Any], str]:
        lease = http.post("/v1/rollouts/lease", json={"runner": "curl", "wait_s": 1}).json()
        assert lease["gateway_base_url"] == f"{root}/rollouts/g0/{lease['lease_id']}/v1"
        return lease, lease["gateway_base_url"]

    # A report refused for its body ends the lease that sent it: the rollout goes to the next try.
    lease, gateway = leased()
    bad = http.post(
        f"/v1/rollouts/{rollout_id}/reward", json={"lease_id": lease["lease_id"], "reward": "high"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_reward"
    assert bad.json()["error"]["param"] == "reward"
    ended = http.post(f"/v1/rollouts/{rollout_id}/renew", json={"lease_id": lease["lease_id"]})
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "lease_lost"

    ask = {
        "model": "default",
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "max_tokens": 8,
        "temperature": 0,
    }

    def two_calls(gateway: str) -> tuple[dict[str, Any], list[int]]:
        answered = http.post(f"{gateway}/chat/completions", json=ask)
        assert answered.status_code == 200, answered.text
        streamed_ids = []
        with http.stream("POST", f"{gateway}/chat/completions", json={**ask, "stream": True}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: {"):
                    chunk = httpx.Response(200, content=line[6:]).json()
                    for choice in chunk["choices"]:
                        streamed_ids += choice.get("token_ids") or []
        return answered.json(), streamed_ids

    lease, gateway = leased()
    assert lease["attempt"] == 2
    two_calls(gateway)
    too_many = http.post(
        f"/v1/rollouts/{rollout_id}/reward",
        json={"lease_id": lease["lease_id"], "reward": 1.0, "step_rewards": [0.5, None, 1.0]},
    )
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "step_rewards"
    assert "3 entries for 2 recorded calls" in too_many.json()["error"]["message"]

    lease, gateway = leased()
    assert lease["attempt"] == 3
    whole, streamed_ids = two_calls(gateway)
    refused = http.post(f"{root}/rollouts/g0/not-the-lease/v1/chat/completions", json=ask)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "lease_lost"
    unauthorised = httpx.post(f"{gateway}/chat/completions", json=ask, timeout=60)
    assert unauthorised.status_code == 401  # and nothing recorded (two calls below, not three)
    # The gateway takes the agent's model key, and answers its own model's entry itself (no upstream).
    entry = httpx.get(f"{gateway}/models/default", headers={"x-api-key": model_key(key)}, timeout=60)
    assert entry.status_code == 200, entry.text
    assert (entry.json()["id"], entry.json()["owned_by"]) == ("default", "lightning-sdk")
    done = http.post(
        f"/v1/rollouts/{rollout_id}/reward",
        json={
            "lease_id": lease["lease_id"],
            "reward": 1.0,
            "step_rewards": [0.5, None],
            "output": "4",
            "name": "curl-agent",
        },
    )
    assert done.json() == {"stored": True, "calls": 2}  # the calls of this lease, none of the last one's
    [outcome] = queue.wait([rollout_id], timeout_s=5)
    episode = ls.Episode.from_dict(outcome.episode)
    assert episode.name == "curl-agent" and episode.reward == 1.0 and episode.output == "4"
    # Where it came from, as a runner's episode says it (docs/scaling.md, "What an episode carries").
    assert {key: episode.metadata[key] for key in ("rollout_id", "attempt", "policy_version", "gateway")} == {
        "rollout_id": "g0",
        "attempt": 3,
        "policy_version": 5,
        "gateway": True,
    }
    assert episode.metadata["base_url"] == gateway
    first, second = episode.calls
    assert first.prompt_token_ids == whole["prompt_token_ids"]
    assert first.completion_token_ids == whole["choices"][0]["token_ids"]  # the exact ids it served
    assert second.completion_token_ids == streamed_ids and second.prompt_token_ids == first.prompt_token_ids
    assert (first.reward, second.reward) == (0.5, None)
    assert {call.agent_name for call in episode.calls} == {"curl-agent"}


def test_gateway_records_responses_calls_and_passes_embeddings_through(
    protocol_server, openai_server
) -> None:
    # An agent on the Responses API that also embeds with OpenAI, pointed at its lease's gateway base URL.
    queue, server = protocol_server
    root, key = server.endpoint.base_url.removesuffix("/v1"), server.endpoint.api_key
    http = httpx.Client(base_url=root, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    [rollout_id] = queue.submit([RolloutSpec("r0", {"question": "What is 2 + 2?"})])
    lease = http.post("/v1/rollouts/lease", json={"runner": "responses", "wait_s": 1}).json()
    client = openai.OpenAI(base_url=lease["gateway_base_url"], api_key=key, max_retries=0)
    embedded = client.embeddings.create(model="text-embedding-3-small", input="2 + 2")
    assert embedded.data[0].embedding == [0.05, 0.2] and len(openai_server.requests) == 1
    whole = client.responses.create(
        model="default", input=lease["task"]["question"], max_output_tokens=8, temperature=0
    )
    events = list(
        client.responses.create(
            model="default", input="Name a colour.", max_output_tokens=8, temperature=0, stream=True
        )
    )
    streamed = events[-1].response  # response.completed, or response.incomplete when cut at 8 tokens
    gone = openai.OpenAI(base_url=f"{root}/rollouts/r0/not-the-lease/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.ConflictError):
        gone.embeddings.create(model="m", input="x")  # a lost lease is refused before anything passes through
    assert len(openai_server.requests) == 1
    done = http.post(f"/v1/rollouts/{rollout_id}/reward", json={"lease_id": lease["lease_id"], "reward": 1.0})
    assert done.json() == {"stored": True, "calls": 2}  # the two Responses calls; the embedding is not one
    [outcome] = queue.wait([rollout_id], timeout_s=5)
    first, second = ls.Episode.from_dict(outcome.episode).calls
    assert first.metadata["api"] == "responses" and first.text == whole.output_text
    assert first.completion_token_ids == whole.output[0].model_extra["token_ids"]  # the exact ids it served
    assert second.text == streamed.output_text and second.completion_token_ids
    assert first.prompt_token_ids and first.trainable and second.trainable


def test_gateway_records_anthropic_messages_calls(protocol_server) -> None:
    # An agent on Anthropic's client, pointed at its lease's gateway: without `/v1`, which the client appends.
    queue, server = protocol_server
    root, key = server.endpoint.base_url.removesuffix("/v1"), server.endpoint.api_key
    http = httpx.Client(
        base_url=root, headers={"x-api-key": key}, timeout=60
    )  # the key as Anthropic sends it
    [rollout_id] = queue.submit([RolloutSpec("m0", {"question": "Name a colour."})])
    lease = http.post("/v1/rollouts/lease", json={"runner": "anthropic", "wait_s": 1}).json()
    gateway = lease["gateway_base_url"].removesuffix("/v1")
    client = anthropic.Anthropic(base_url=gateway, api_key=key, max_retries=0)
    messages = [{"role": "user", "content": lease["task"]["question"]}]
    counted = client.messages.count_tokens(model="default", messages=messages)
    message = client.messages.create(
        model="default", max_tokens=8, messages=messages, extra_body={"temperature": 0}
    )
    gone = anthropic.Anthropic(base_url=f"{root}/rollouts/m0/not-the-lease", api_key=key, max_retries=0)
    with pytest.raises(anthropic.ConflictError) as lost:
        gone.messages.create(model="default", max_tokens=2, messages=messages)
    assert lost.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    done = http.post(f"/v1/rollouts/{rollout_id}/reward", json={"lease_id": lease["lease_id"], "reward": 1.0})
    assert done.json() == {"stored": True, "calls": 1}  # the message; counting tokens is not an LLM call
    [outcome] = queue.wait([rollout_id], timeout_s=5)
    [call] = ls.Episode.from_dict(outcome.episode).calls
    assert call.metadata["api"] == "messages" and call.messages == messages and call.trainable
    assert call.prompt_token_ids == message.model_extra["prompt_token_ids"]
    assert len(call.prompt_token_ids) == counted.input_tokens
    assert call.completion_token_ids == message.model_extra["token_ids"]  # the exact ids it served
    assert call.text == message.content[0].text


def test_runner_actors_on_a_local_ray_cluster_train_and_a_killed_one_comes_back(
    vllm_engine, tmp_path, repository_importable
) -> None:
    pytest.importorskip("ray", reason="Ray is not installed; install lightning-sdk[ray]")
    import threading

    from tests.scripts.runner_agent import solver

    marker = tmp_path / "hanging-actor.pid"
    tasks = [{**TASKS[0], "hang_once": str(marker)}, TASKS[1]]
    # A long lease keeps the step waiting for the hung rollout long enough to see Ray restart the actor.
    runners = ls.Runners(processes=2, backend="ray", resources={"num_cpus": 0.5}, lease_timeout_s=30)
    config = ls.TrainerConfig(
        group_size=2,
        batch_size=2,
        max_steps=1,
        max_tokens=6,
        learning_rate=1e-3,
        eval_every=0,
        save_every=0,
        run_dir=str(tmp_path / "ray"),
        progress_bar=False,
        runners=runners,
    )
    trainer = ls.Trainer(config=config, engine=vllm_engine)
    seen: dict[str, Any] = {}

    def kill_then_watch() -> None:
        deadline = time.monotonic() + 600
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        seen["killed"] = killed = int(marker.read_text())
        os.kill(killed, signal.SIGKILL)  # the actor's process, mid-episode
        while time.monotonic() < deadline and trainer.session is not None:
            try:
                pids = trainer.session.remote.processes.pids
            except Exception:  # noqa: BLE001 - the actor may be restarting; ask again
                pids = []
            if len(pids) == 2 and killed not in pids:
                seen["pids_after"] = pids
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=kill_then_watch, daemon=True)
    watcher.start()
    result = trainer.fit(solver, tasks)
    watcher.join(60)
    assert "pids_after" in seen, seen  # Ray restarted the killed actor under a new process
    with EpisodeStore(tmp_path / "ray" / "episodes.sqlite") as store:
        episodes = list(store.episodes())
    assert {e.metadata["runner"].split("/")[0] for e in episodes} <= {"ray-0", "ray-1"}
    assert max(e.metadata["attempt"] for e in episodes) == 2  # the killed actor's rollout, run again
    # The same episodes as the same tasks run in the trainer's process, and the adapter trained.
    in_process = ls.Trainer(
        config=dataclasses.replace(config, run_dir=str(tmp_path / "here"), runners=None), engine=vllm_engine
    ).fit(solver, TASKS[:2])
    assert _structure(tmp_path / "ray") == _structure(tmp_path / "here")
    [record] = [r for r in result.history if "reward_mean" in r]
    assert record["samples"] > 0 and _adapter_moved(result) and _adapter_moved(in_process)


ADD = CHAT_ADD_STRICT  # strict and bounded: a forced call always closes within max_tokens


def test_gateway_records_tool_calls_and_every_choice_as_served(protocol_server) -> None:
    queue, server = protocol_server
    root, key = server.endpoint.base_url.removesuffix("/v1"), server.endpoint.api_key
    http = httpx.Client(base_url=root, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    [rollout_id] = queue.submit([RolloutSpec("t0", {"question": "What is 2 + 3?"})])
    lease = http.post("/v1/rollouts/lease", json={"runner": "tools", "wait_s": 1}).json()
    gateway = lease["gateway_base_url"]
    ask = {
        "model": "default",
        "messages": [{"role": "user", "content": "What is 2 + 3?"}],
        "tools": [ADD],
        "tool_choice": {"type": "function", "function": {"name": "add"}},
        "max_tokens": 40,
        "temperature": 0,
    }
    whole = http.post(f"{gateway}/chat/completions", json=ask).json()
    streamed_calls = []
    with http.stream("POST", f"{gateway}/chat/completions", json={**ask, "stream": True}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: {"):
                for choice in httpx.Response(200, content=line[6:]).json()["choices"]:
                    streamed_calls += choice["delta"].get("tool_calls") or []
    prompts = ["2 + 3 =", "The sky is"]
    texts = http.post(
        f"{gateway}/completions",
        json={"model": "default", "prompt": prompts, "n": 2, "max_tokens": 4, "temperature": 0},
    ).json()
    done = http.post(f"/v1/rollouts/{rollout_id}/reward", json={"lease_id": lease["lease_id"], "reward": 0.0})
    assert done.json() == {"stored": True, "calls": 6}  # a call per choice: 1 + 1 + 2 prompts x 2
    [outcome] = queue.wait([rollout_id], timeout_s=5)
    chat, chat_streamed, *completions = ls.Episode.from_dict(outcome.episode).calls
    [served] = whole["choices"]
    assert served["message"]["tool_calls"]  # the forced call was made
    # The calls as the agent received them, ids included (its next request answers them by id).
    assert chat.response_message == served["message"] and chat.text == served["message"]["content"]
    assert (chat.finish_reason, chat.usage) == (served["finish_reason"], whole["usage"])
    assert chat.prompt_token_ids == whole["prompt_token_ids"] and chat.messages == ask["messages"]
    assert chat.completion_token_ids == served["token_ids"] and chat.logprobs == served["token_logprobs"]
    assert chat.tools == [ADD] and chat.sampling["tool_choice"] == ask["tool_choice"]
    assert streamed_calls and chat_streamed.response_message["tool_calls"] == [
        {key: value for key, value in call.items() if key != "index"} for call in streamed_calls
    ]
    assert chat_streamed.trainable and chat_streamed.usage is None  # no usage was asked for, none sent
    for call, choice in zip(completions, texts["choices"], strict=True):
        assert (call.choice_index, call.text) == (choice["index"], choice["text"])
        assert call.prompt_token_ids == choice["prompt_token_ids"]  # each choice's own prompt
        assert call.completion_token_ids == choice["token_ids"]
        assert call.request_id == texts["id"] and call.kind == "completion"
    assert len({call.id for call in completions}) == 4  # one record per choice


def _never_runs(task: Any) -> Any:
    raise AssertionError(f"no rollout should reach a runner once training is over: {task}")


def test_when_training_is_over_runners_stop_and_every_request_is_told(protocol_server) -> None:
    from lightning_sdk.runner import run_runner

    queue, server = protocol_server
    root, key = server.endpoint.base_url.removesuffix("/v1"), server.endpoint.api_key
    http = httpx.Client(base_url=root, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    [rollout_id] = queue.submit([RolloutSpec("last", {"question": "What is 2 + 2?"})])
    lease = http.post("/v1/rollouts/lease", json={"runner": "curl", "wait_s": 1}).json()
    # A runner with nothing to run waits in its long poll; closing the queue answers it.
    returned: list[int] = []
    runner = threading.Thread(target=lambda: returned.append(run_runner(_never_runs, root, key)), daemon=True)
    runner.start()
    queue.close("the training run ended")
    runner.join(120)
    assert returned == [0]  # it stopped by itself, having uploaded nothing
    held = {"lease_id": lease["lease_id"]}
    ask = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    for answer in (
        http.post("/v1/rollouts/lease", json={"runner": "curl", "wait_s": 1}),
        http.post(f"{lease['gateway_base_url']}/chat/completions", json=ask),
        http.post(f"/v1/rollouts/{rollout_id}/reward", json={**held, "reward": 1.0}),
        http.post(f"/v1/rollouts/{rollout_id}/renew", json=held),
        http.post(f"/v1/rollouts/{rollout_id}/episode", json={**held, "episode": {}}),
    ):
        assert answer.status_code == 410, answer.text
        error = answer.json()["error"]
        assert error["code"] == "training_over" and "the training run ended" in error["message"]
    assert http.get("/v1/rollouts").json() == {"pending": 0, "leased": 0, "done": 1}
    [outcome] = queue.wait([rollout_id], timeout_s=5)
    assert outcome.failure == "the training run ended"


def test_leases_and_renewals_carry_the_trainers_clock_of_time_held_for_updates(protocol_server) -> None:
    """A runner's own episode limit leaves out the time the trainer held calls for updates, as the queue's
    does: it reads that clock from its lease and then from every renewal."""
    queue, server = protocol_server
    root, key = server.endpoint.base_url.removesuffix("/v1"), server.endpoint.api_key
    http = httpx.Client(base_url=root, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    held = [12.5]
    queue.paused_s = lambda: held[0]
    [rollout_id] = queue.submit([RolloutSpec("clock", {"question": "What is 2 + 2?"})])
    lease = http.post("/v1/rollouts/lease", json={"runner": "curl", "wait_s": 1}).json()
    assert lease["paused_s"] == 12.5
    held[0] = 20.0  # an update held calls for 7.5 s more
    renewed = http.post(f"/v1/rollouts/{rollout_id}/renew", json={"lease_id": lease["lease_id"]})
    assert renewed.status_code == 200 and renewed.json()["paused_s"] == 20.0


def test_a_runner_does_not_time_out_an_episode_for_an_update_that_began_between_renewals(
    protocol_server,
) -> None:
    """The runner's limit is 1 s and its agent works 2.5 s, 3 s of which the trainer held calls for an
    update that began after the lease and before any renewal (renewals come every 10 s here): the runner
    asks the trainer again when its limit seems passed, and keeps the episode."""
    from lightning_sdk.runner import run_runner

    queue, server = protocol_server
    root, key = server.endpoint.base_url.removesuffix("/v1"), server.endpoint.api_key
    began: list[float] = []

    @ls.trace_agent(name="slow_tool")
    def slow_tool(task: Any) -> str:
        began.append(time.monotonic())
        time.sleep(2.5)  # a tool call, while the trainer updates
        return "done"

    def held_for_updates() -> float:  # an update from 0.2 s to 3.2 s into the episode
        return min(max(time.monotonic() - began[0] - 0.2, 0.0), 3.0) if began else 0.0

    queue.paused_s = held_for_updates
    [rollout_id] = queue.submit([RolloutSpec("held", {"question": "What is 2 + 2?"})])
    runner = threading.Thread(
        target=lambda: run_runner(slow_tool, root, key, episode_timeout_s=1.0, max_rollouts=1), daemon=True
    )
    runner.start()
    [outcome] = queue.wait([rollout_id], timeout_s=60)
    runner.join(60)
    assert outcome.failure is None and outcome.episode is not None
    assert "timed_out" not in outcome.episode["metadata"] and outcome.episode["output"] == "done"


def test_a_runner_routes_an_agent_whose_client_was_built_before_it_started(
    protocol_server, openai_server
) -> None:
    from lightning_sdk.runner import run_runner

    queue, server = protocol_server
    root, key = server.endpoint.base_url.removesuffix("/v1"), server.endpoint.api_key
    hosted = openai.OpenAI(base_url=openai_server.base_url, api_key=openai_server.api_key, max_retries=0)

    @ls.trace_agent(name="import-time")
    def agent(task: dict[str, Any]) -> str:
        # "default": this test server (unlike the trainer's) answers only its own model's names.
        reply = hosted.chat.completions.create(
            model="default", messages=[{"role": "user", "content": task["question"]}], max_tokens=4
        )
        return reply.choices[0].message.content or ""

    [rollout_id] = queue.submit([RolloutSpec("routed", {"question": "Name a fruit."})])
    returned: list[int] = []
    runner = threading.Thread(
        target=lambda: returned.append(run_runner(agent, root, key, max_rollouts=1)), daemon=True
    )
    runner.start()
    [outcome] = queue.wait([rollout_id], timeout_s=120)
    runner.join(60)
    assert returned == [1] and openai_server.requests == []  # the hosted model saw nothing
    [call] = ls.Episode.from_dict(outcome.episode).all_calls()
    assert call.base_url == server.endpoint.base_url and call.trainable  # the trainer's endpoint served it
