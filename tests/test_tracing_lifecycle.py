"""The lifecycle of openai capture: what is patched, when, and what passes through unrecorded."""

from __future__ import annotations

import pytest
from openai import _base_client

import lightning_sdk as ls
from lightning_sdk.tracing.capture import openai_client as openai_capture

USER = [{"role": "user", "content": "What is 2 + 2?"}]


def in_episode(fn):
    """Run `fn()` as a traced agent; return its single episode."""
    with ls.capture() as episodes:
        ls.trace_agent(name="probe")(lambda: fn())()
    return episodes[0]


def test_calls_outside_an_episode_are_not_recorded(openai_client, instrumented):
    with ls.capture() as episodes:
        openai_client.chat.completions.create(model="test-model", messages=USER)
        list(openai_client.chat.completions.create(model="test-model", messages=USER, stream=True))
    assert episodes == [] and ls.current_episode() is None


def test_other_endpoints_pass_through(openai_client, instrumented):
    episode = in_episode(lambda: [model.id for model in openai_client.models.list()])
    assert episode.output == ["test-model"] and episode.calls == []


def test_uninstrument_restores_the_original_methods():
    sync_original = _base_client.SyncAPIClient.__dict__["request"]
    async_original = _base_client.AsyncAPIClient.__dict__["request"]
    assert ls.instrument_openai() is True
    assert ls.instrument_openai() is False  # idempotent
    assert _base_client.SyncAPIClient.__dict__["request"] is not sync_original
    assert openai_capture.is_openai_instrumented()
    assert ls.uninstrument_openai() is True
    assert ls.uninstrument_openai() is False
    assert _base_client.SyncAPIClient.__dict__["request"] is sync_original
    assert _base_client.AsyncAPIClient.__dict__["request"] is async_original


def test_uninstrumented_calls_in_an_episode_are_not_recorded(openai_client):
    ls.uninstrument_openai()  # also stops traced agents from switching capture back on
    episode = in_episode(lambda: openai_client.chat.completions.create(model="test-model", messages=USER))
    assert episode.calls == [] and not openai_capture.is_openai_instrumented()


def test_traced_agent_switches_capture_on_at_its_first_call(openai_client):
    assert not openai_capture.is_openai_instrumented()
    agent = ls.trace_agent(lambda: openai_client.chat.completions.create(model="test-model", messages=USER))
    assert not openai_capture.is_openai_instrumented()  # not at decoration time
    with ls.capture() as episodes:
        agent()
    assert openai_capture.is_openai_instrumented() and len(episodes[0].calls) == 1


def test_configure_can_turn_automatic_capture_off(openai_client):
    ls.configure(instrument_openai=False)
    episode = in_episode(lambda: openai_client.chat.completions.create(model="test-model", messages=USER))
    assert episode.calls == [] and not openai_capture.is_openai_instrumented()


def test_unsupported_openai_version_warns():
    with pytest.warns(RuntimeWarning, match="found 9.1.0"):
        openai_capture.PATCH.warn_if_unsupported("9.1.0")
