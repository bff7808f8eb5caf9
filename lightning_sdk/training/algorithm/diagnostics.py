"""Plain-language warnings for a training step that had nothing to learn from, and why.

The usual first-run mistakes (a routing map that keeps every call on another server, an agent whose model
calls are not recorded, an agent that fails on every task) do not crash anything:
the trainer would run, train on nothing and report a flat curve. These checks name the cause and the fix
after the first step that shows it, once per run and cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lightning_sdk.tracing.episode import Episode
from lightning_sdk.tracing.urls import same_endpoint

__all__ = ["StepDiagnostics", "step_problems"]

_MAX_URLS_SHOWN = 3


def _all_failed(episodes: list[Episode]) -> str | None:
    if not episodes or any(episode.error is None for episode in episodes):
        return None
    first = episodes[0].error or {}
    return (
        f"all {len(episodes)} episodes of the step failed; the first with {first.get('type', 'an error')}: "
        f"{first.get('message', '')!s:.300}. Run the agent on one task by hand to see the traceback "
        "(episodes.sqlite in the run folder keeps every error)."
    )


def _no_calls(episodes: list[Episode]) -> str | None:
    finished = [episode for episode in episodes if episode.error is None]
    if not finished or any(episode.all_calls() for episode in finished):
        return None
    return (
        f"the step's {len(finished)} finished episodes recorded no LLM call, so there is nothing to train. "
        "The model must be called inside the @trace_agent function (or in threads started with "
        "ls.ContextThreadPoolExecutor) through an OpenAI-compatible client: openai, LangChain, AutoGen or "
        "the OpenAI Agents SDK."
    )


def _other_server(episodes: list[Episode], endpoint: str) -> str | None:
    calls = [call for episode in episodes for call in episode.all_calls()]
    if not calls or any(same_endpoint(call.base_url, endpoint) for call in calls):
        return None
    urls = sorted({str(call.base_url) for call in calls})[:_MAX_URLS_SHOWN]
    return (
        f"none of the step's {len(calls)} LLM calls reached the trainer's endpoint ({endpoint}); they went "
        f"to {', '.join(urls)}, and calls to another server are never trained. TrainerConfig(routes=...) "
        "decides which calls the policy answers (by model name, or 'agent:<name>'); with routes set, calls "
        "that no key sends to 'policy' keep their destination. Name the models the policy replaces there, or "
        "leave routes unset to send every call to the policy."
    )


def _no_token_ids(episodes: list[Episode], endpoint: str) -> str | None:
    ours = [
        call
        for episode in episodes
        for call in episode.all_calls()
        if same_endpoint(call.base_url, endpoint) and call.error is None
    ]
    if not ours or any(call.trainable for call in ours):
        return None
    return (
        f"the step's {len(ours)} calls to the trainer's endpoint were recorded without token ids, so none "
        "can be trained. Token ids come with every response of the endpoint; if a framework wraps the "
        "client, make sure its calls go through the openai package (instrument_openai() is on by default) "
        "or turn on the framework's integration."
    )


def step_problems(groups: Sequence[Sequence[Episode]], endpoint_base_url: str) -> dict[str, str]:
    """Why a step's episodes gave the trainer nothing to learn from, by cause (empty when nothing is wrong).

    Causes: `all_failed`, `no_calls`, `other_server`, `no_token_ids`; each value says what to change.
    """
    episodes = [episode for group in groups for episode in group]
    checks = {
        "all_failed": _all_failed(episodes),
        "no_calls": _no_calls(episodes),
        "other_server": _other_server(episodes, endpoint_base_url),
        "no_token_ids": _no_token_ids(episodes, endpoint_base_url),
    }
    return {cause: message for cause, message in checks.items() if message is not None}


@dataclass
class StepDiagnostics:
    """Remembers which causes were already reported, so each is logged once per run."""

    endpoint_base_url: str
    reported: set[str] = field(default_factory=set)

    def new_problems(self, groups: Sequence[Sequence[Episode]]) -> list[str]:
        """The messages of causes this step shows that were not reported before."""
        problems = step_problems(groups, self.endpoint_base_url)
        fresh = [message for cause, message in problems.items() if cause not in self.reported]
        self.reported.update(problems)
        return fresh
