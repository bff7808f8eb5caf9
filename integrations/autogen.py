"""AutoGen (autogen-agentchat 0.7): record each `AssistantAgent`'s model calls under the agent's name,
its tool-calling inferences and its reflection calls (`reflect_on_tool_use=True`), in teams too.

    from lightning_sdk.integrations.autogen import instrument_autogen
    instrument_autogen()

`AssistantAgent` makes its model calls in two places, a first (or tool-loop) inference and the
reflection on tool results; both receive the agent's name and model client. While instrumented, the
agent sees its model client through a thin wrapper for those calls, which runs each `create` /
`create_stream` inside `call_attributes(agent_name=<agent name>, ...)`. With `OpenAIChatCompletionClient`
the openai capture records the request there (token ids included) and the call carries the agent's
name; with any other model client, or with the openai capture off, the wrapper records the call
itself (`source="autogen"`, no token ids). Either way there is one `LLMCall` per model call.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import nullcontext
from typing import Any

from lightning_sdk.integrations._support import check_version, linked_calls, missing_framework

try:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core.models import CreateResult
except ImportError as error:  # pragma: no cover - depends on the environment
    raise missing_framework("AutoGen (autogen-agentchat, autogen-ext)", "autogen") from error

from lightning_sdk.integrations._autogen_records import openai_messages, openai_tools, response_fields
from lightning_sdk.tracing.context import call_attributes, current_episode, record_call
from lightning_sdk.tracing.episode import LLMCall, new_id
from lightning_sdk.tracing.errors import never_break_the_agent

__all__ = ["CALL_ID_KEY", "STEP_KEY", "instrument_autogen", "is_autogen_instrumented", "uninstrument_autogen"]

CALL_ID_KEY = "autogen_call_id"
"""`LLMCall.metadata` key linking a recorded call to the AutoGen model call that made it."""
STEP_KEY = "autogen_step"
"""`LLMCall.metadata` key: `"inference"` for the agent's tool-calling inferences, `"reflection"` for
the call that reflects on tool results."""

# AssistantAgent's classmethods that call the model client, and the step each one is.
_MODEL_STEPS = {"_call_llm": "inference", "_reflect_on_tool_use_flow": "reflection"}
_SUPPORTED = ("autogen-agentchat", "0.7", "0.8")
_lock = threading.Lock()
_originals: dict[str, classmethod] = {}


class _PendingCall:
    """One model call of one agent: the scope the request runs in, and its settlement afterwards."""

    def __init__(
        self, agent_name: str | None, step: str, messages: Sequence[Any], options: dict[str, Any]
    ) -> None:
        self.episode = current_episode()
        self.link = new_id()
        self.attributes: dict[str, Any] = {"metadata": {CALL_ID_KEY: self.link, STEP_KEY: step}}
        if agent_name is not None:
            self.attributes["agent_name"] = agent_name
        self.messages, self.tools = messages, options.get("tools") or ()
        self.started_at = time.time()

    def scope(self) -> Any:
        return call_attributes(**self.attributes) if self.episode is not None else nullcontext()

    def settle(self, result: CreateResult | None, error: BaseException | None) -> None:
        """Record the call ourselves unless the openai capture recorded it inside our scope."""
        with never_break_the_agent("recording an AutoGen model call"):
            if self.episode is None or linked_calls(self.episode, CALL_ID_KEY, self.link):
                return
            fields = (
                response_fields(result)
                if result is not None
                else {"error": f"{type(error).__name__}: {error}"}
            )
            call = LLMCall(
                source="autogen",
                messages=openai_messages(self.messages),
                tools=openai_tools(self.tools),
                started_at=self.started_at,
                latency_s=time.time() - self.started_at,
                **fields,
            )
            record_call(call, episode=self.episode, attributes=self.attributes)


class _AgentModelClient:
    """An agent's model client as the agent's model steps see it while instrumented (see module doc).

    Everything but `create` and `create_stream` is the wrapped client's own attribute.
    """

    def __init__(self, inner: Any, agent_name: str | None, step: str) -> None:
        self._inner, self._agent_name, self._step = inner, agent_name, step

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def create(self, messages: Sequence[Any], **options: Any) -> CreateResult:
        call = _PendingCall(self._agent_name, self._step, messages, options)
        with call.scope():
            try:
                result = await self._inner.create(messages, **options)
            except Exception as error:
                call.settle(None, error)
                raise
        call.settle(result, None)
        return result

    async def create_stream(self, messages: Sequence[Any], **options: Any) -> AsyncGenerator[Any, None]:
        call = _PendingCall(self._agent_name, self._step, messages, options)
        stream = self._inner.create_stream(messages, **options)
        result = None
        try:
            while True:
                # The scope covers each step of the model's stream, not our consumer's code between steps.
                with call.scope():
                    try:
                        item = await stream.__anext__()
                    except StopAsyncIteration:
                        break
                if isinstance(item, CreateResult):
                    result = item
                yield item
        except Exception as error:
            call.settle(None, error)
            raise
        finally:
            await stream.aclose()
        call.settle(result, None)


def _observe_model_step(method: Callable[..., Any], step: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def observed(cls: type, *args: Any, **kwargs: Any) -> Any:
        client = kwargs.get("model_client")
        if client is not None and current_episode() is not None and not isinstance(client, _AgentModelClient):
            kwargs["model_client"] = _AgentModelClient(client, kwargs.get("agent_name"), step)
        return method(cls, *args, **kwargs)

    return observed


def instrument_autogen() -> bool:
    """Attribute every `AssistantAgent` model call to its agent (and record it). Idempotent.

    Returns True when this call switched it on, False when it was already on. Raises RuntimeError when
    the installed autogen-agentchat does not have the methods this integration wraps.
    """
    with _lock:
        if _originals:
            return False
        check_version(*_SUPPORTED, extra="autogen")
        found = {name: AssistantAgent.__dict__.get(name) for name in _MODEL_STEPS}
        missing = [name for name, original in found.items() if not isinstance(original, classmethod)]
        if missing:
            raise RuntimeError(
                f"this autogen-agentchat has no AssistantAgent.{', '.join(missing)}, "
                "which lightning-sdk's AutoGen "
                "integration wraps; install a supported version: pip install 'lightning-sdk[autogen]'"
            )
        for name, step in _MODEL_STEPS.items():
            original = found[name]
            setattr(AssistantAgent, name, classmethod(_observe_model_step(original.__func__, step)))
            _originals[name] = original
        return True


def uninstrument_autogen() -> bool:
    """Restore AssistantAgent's own methods. Idempotent; returns True when something was restored."""
    with _lock:
        restored = bool(_originals)
        for name, original in _originals.items():
            setattr(AssistantAgent, name, original)
        _originals.clear()
        return restored


def is_autogen_instrumented() -> bool:
    """True while `instrument_autogen()` is in effect."""
    return bool(_originals)
