"""LangChain and LangGraph: record every chat-model and LLM call into the current episode, with the
agent name of the run that made it and the tool calls it produced.

    from lightning_sdk.integrations.langchain import instrument_langchain
    instrument_langchain()          # every LangChain run in this process, from now on

or per call, without any global change:

    chain.invoke(inputs, config={"callbacks": [LightningCallbackHandler()]})

One `LLMCall` per model call: when the model talks to an OpenAI-compatible server through the `openai`
client (`ChatOpenAI`), the openai capture records the call with its token ids and this handler only
names it (agent name, run id); for any other model the handler records the call itself
(`source="langchain"`, no token ids). See `agent_name_of` for how the agent name is chosen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from lightning_sdk.integrations._support import CallLink, check_version, missing_framework

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.outputs import LLMResult
    from langchain_core.tracers.context import register_configure_hook
except ImportError as error:  # pragma: no cover - depends on the environment
    raise missing_framework("LangChain (langchain-core)", "langchain") from error

from lightning_sdk.integrations._langchain_records import (
    calls_from_result,
    generation_text,
    request_fields,
    response_id_of,
)
from lightning_sdk.tracing.context import (
    current_episode,
    record_call,
)
from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.errors import never_break_the_agent

__all__ = [
    "AGENT_TAG_PREFIX",
    "RUN_ID_KEY",
    "LightningCallbackHandler",
    "agent_name_of",
    "instrument_langchain",
    "is_langchain_instrumented",
    "uninstrument_langchain",
]

RUN_ID_KEY = "langchain_run_id"
"""`LLMCall.metadata` key holding the LangChain run id of the model call."""

_SUPPORTED = ("langchain-core", "1.0", "2")

AGENT_TAG_PREFIX = "agent:"
"""A run tagged `"agent:writer"` (or a parent run tagged so) records its calls as agent `writer`."""


def agent_name_of(
    fixed: str | None, tags: Sequence[str] | None, metadata: dict[str, Any] | None, run_name: str | None
) -> str | None:
    """The agent name of a model run, by the documented rule (first match wins):

    1. the handler's own `agent_name`;
    2. the innermost tag `"agent:<name>"` (tags are inherited from parent runs);
    3. metadata `"agent_name"` (inherited too);
    4. the model run's explicit `run_name` (`model.with_config(run_name=...)`);
    5. metadata `"lc_agent_name"` (set by `langchain.agents.create_agent(name=...)`);
    6. metadata `"langgraph_node"` (the LangGraph node the call runs in).
    """
    if fixed:
        return fixed
    for tag in reversed(tags or ()):
        if tag.startswith(AGENT_TAG_PREFIX) and len(tag) > len(AGENT_TAG_PREFIX):
            return tag[len(AGENT_TAG_PREFIX) :]
    metadata = metadata or {}
    for value in (
        metadata.get("agent_name"),
        run_name,
        metadata.get("lc_agent_name"),
        metadata.get("langgraph_node"),
    ):
        if isinstance(value, str) and value:
            return value
    return None


@dataclass
class _Run:
    """What a model run's start tells us, kept until its end (which may run in another context)."""

    episode: Episode
    agent_name: str | None
    request: dict[str, Any]
    link: CallLink
    started_at: float = field(default_factory=time.time)


class LightningCallbackHandler(BaseCallbackHandler):
    """A LangChain callback handler that records model calls into the current lightning-sdk episode.

    Args:
        agent_name: Record every call this handler sees under this name. By default the name comes
            from the run: see `agent_name_of` (a tag `"agent:<name>"` is the simplest override).

    Calls made outside an episode (no `@trace_agent` function running) are ignored.
    """

    # Our start callback opens the `call_attributes` scope the openai request runs in, so it must run
    # in the caller's context: inline, not in a thread pool (which async callback managers use otherwise).
    run_inline = True
    # Internal errors are already logged and swallowed by `never_break_the_agent`, except under pytest,
    # where they re-raise; raise_error lets such a failure reach the test instead of a LangChain log line.
    raise_error = True

    def __init__(self, agent_name: str | None = None) -> None:
        super().__init__()
        check_version(*_SUPPORTED, extra="langchain")
        self.agent_name = agent_name
        self._runs: dict[UUID, _Run] = {}

    # ------------------------------------------------------------------ LangChain callbacks

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[Any]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        self._guarded("starting a LangChain chat model run", self._start, run_id, messages[0], None, kwargs)

    def on_llm_start(
        self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID, **kwargs: Any
    ) -> None:
        self._guarded("starting a LangChain LLM run", self._start, run_id, None, prompts[0], kwargs)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        self._guarded("ending a LangChain model run", self._end, run_id, response, None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._guarded("ending a failed LangChain model run", self._end, run_id, None, error)

    # ------------------------------------------------------------------ recording

    @staticmethod
    def _guarded(what: str, step: Any, *args: Any) -> None:
        with never_break_the_agent(what):
            step(*args)

    def _start(
        self, run_id: UUID, messages: list[Any] | None, prompt: str | None, kwargs: dict[str, Any]
    ) -> None:
        episode = current_episode()  # read at start: the end callback may run in another context
        if episode is None:
            return
        name = agent_name_of(self.agent_name, kwargs.get("tags"), kwargs.get("metadata"), kwargs.get("name"))
        link = CallLink(RUN_ID_KEY, str(run_id), agent_name=name)
        # A batch starts all its runs before making any request, so a scope per run would tag every
        # request with the last run's id; batch runs are matched by response id or text instead.
        if (kwargs.get("batch_size") or 1) == 1:
            link.open()
        request = request_fields(messages, prompt, kwargs.get("invocation_params"))
        self._runs[run_id] = _Run(episode, name, request, link)

    def _end(self, run_id: UUID, result: LLMResult | None, error: BaseException | None) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        run.link.close()
        found = run.link.calls(run.episode)
        if not found and result is not None:
            found = self._match_unlinked(run, result)
        if not found:  # the openai capture did not see this call: record LangChain's view of it
            found = self._record_own(run, result, error)
        for call in found:
            call.metadata[RUN_ID_KEY] = str(run_id)
            if run.agent_name is not None:
                call.agent_name = run.agent_name

    def _match_unlinked(self, run: _Run, result: LLMResult) -> list[LLMCall]:
        """Calls the openai capture recorded for this run without our link (batches, foreign contexts)."""
        open_runs = {str(run_id) for run_id in tuple(self._runs)}  # tuple(): other threads add runs
        candidates = [
            call
            for call in run.episode.all_calls()
            if call.source != "langchain"
            and call.started_at >= run.started_at
            and call.metadata.get(RUN_ID_KEY) in (None, *open_runs)
        ]
        response_id = response_id_of(result)
        if response_id is not None:
            return [call for call in candidates if call.request_id == response_id]
        picked: list[LLMCall] = []
        for generation in result.generations[0] if result.generations else []:
            text = generation_text(generation)
            match = next((c for c in candidates if c not in picked and (c.text or "") == text), None)
            if match is not None:
                picked.append(match)
        return picked

    @staticmethod
    def _record_own(run: _Run, result: LLMResult | None, error: BaseException | None) -> list[LLMCall]:
        if result is not None:
            calls = calls_from_result(result, run.request)
        else:
            calls = [LLMCall(**run.request, source="langchain", error=f"{type(error).__name__}: {error}")]
        latency = time.time() - run.started_at
        for call in calls:
            call.started_at, call.latency_s = run.started_at, latency
            if run.agent_name is not None:
                call.agent_name = run.agent_name
            record_call(call, episode=run.episode, attributes=run.link.outer)
        return calls


class _GlobalHandlerSlot:
    """What `register_configure_hook` reads: a process-wide handler, or None when instrumentation is off.

    LangChain only calls `.get()` on the hook's variable. A real ContextVar set by `instrument_langchain()`
    would reach neither threads started before the call nor contexts copied earlier; this slot does.
    """

    def __init__(self) -> None:
        self.handler: LightningCallbackHandler | None = None
        self.registered = False

    def get(self) -> LightningCallbackHandler | None:
        return self.handler


_slot = _GlobalHandlerSlot()
_lock = threading.Lock()


def instrument_langchain(agent_name: str | None = None) -> bool:
    """Record the model calls of every LangChain run in this process. Idempotent.

    Args:
        agent_name: Passed to the global `LightningCallbackHandler` (a fixed name for every call).

    Runs that already carry a `LightningCallbackHandler` in their callbacks keep theirs (no double
    recording). Returns True when this call switched recording on, False when it was already on.
    """
    with _lock:
        if _slot.handler is not None:
            return False
        if not _slot.registered:
            # Hooks cannot be unregistered; uninstrument_langchain() empties the slot instead.
            register_configure_hook(_slot, True, LightningCallbackHandler)  # type: ignore[arg-type]
            _slot.registered = True
        _slot.handler = LightningCallbackHandler(agent_name=agent_name)
        return True


def uninstrument_langchain() -> bool:
    """Stop recording LangChain runs globally. Idempotent; returns True when it was on."""
    with _lock:
        was_on = _slot.handler is not None
        _slot.handler = None
        return was_on


def is_langchain_instrumented() -> bool:
    """True while `instrument_langchain()` is in effect."""
    return _slot.handler is not None
