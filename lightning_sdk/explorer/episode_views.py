"""Episodes as the pages show them: plain dicts of strings and numbers, built from what was recorded.

Everything here is untrusted text (the agent, the model and imported trace files wrote it): these functions
never build markup; the templates escape every value (Jinja2's autoescape), and the page's script only ever
sets `textContent`.

The training signal of a call is shown when the run recorded it in the call's `metadata`
(`training/algorithm/call_credit.py`, the one contract the trainer writes and this reads); a run that did
not shows "not recorded" rather than a number the viewer made up.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from lightning_sdk.tracing.episode import FEEDBACK_KEY, Episode, LLMCall
from lightning_sdk.training.algorithm.call_credit import call_credit, episode_advantage

__all__ = [
    "NOT_RECORDED",
    "call_view",
    "episode_agents",
    "episode_has_error",
    "episode_view",
    "group_view",
    "sample_view",
    "task_text",
]

NOT_RECORDED = "not recorded"


def task_text(task: Any) -> str:
    """The task as one line of text (a string as it is, anything else as JSON)."""
    return task if isinstance(task, str) else json.dumps(task, ensure_ascii=False, default=str)


def short(value: Any, limit: int = 200) -> str:
    text = task_text(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def number(value: Any, digits: int = 3) -> str:
    """A recorded number as text; anything else (missing, NaN, a string) as "not recorded"."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return NOT_RECORDED
    return f"{value:.{digits}f}"


def episode_agents(episode: Episode) -> set[str]:
    """The agent's name, its sub-agents' names and every call's agent/role."""
    names = {episode.name}
    for call, owner in episode.calls_with_owner():
        names.add(owner.name)
        if call.agent_name:
            names.add(call.agent_name)
    return names


def episode_has_error(episode: Episode) -> bool:
    """The agent raised or timed out, or one of its calls failed."""
    if episode.error is not None or episode.metadata.get("timed_out"):
        return True
    return any(call.error for call, _ in episode.calls_with_owner())


def _error_text(episode: Episode) -> str:
    if episode.error is not None:
        return f"{episode.error.get('type', 'error')}: {episode.error.get('message', '')}"
    if episode.metadata.get("timed_out"):
        return "timed out"
    failed = [call.error for call, _ in episode.calls_with_owner() if call.error]
    return f"a call failed: {failed[0]}" if failed else ""


def sample_view(episode: Episode, success_threshold: float) -> dict[str, Any]:
    """One sample of a group, as its card shows it."""
    reward = episode.reward
    return {
        "id": episode.id,
        "sample": episode.metadata.get("sample"),
        "reward": number(reward) if reward is not None else "unscored",
        "reward_value": reward,
        "failed": reward is None or reward < success_threshold or episode_has_error(episode),
        "output": short(episode.output, 300),
        "calls": len(episode.calls_with_owner()),
        "advantage": number(episode_advantage(episode)),
        "error": short(_error_text(episode), 300),
        "agents": sorted(episode_agents(episode)),
    }


def group_view(episodes: Sequence[Episode], success_threshold: float) -> dict[str, Any]:
    """A task's group: its samples side by side, and whether its rewards gave a learning signal.

    GRPO learns from a group only when its rewards differ (`training/algorithm/advantages.py` skips the
    others): the reason shown is read from the samples' rewards, unless the run recorded its own
    (`metadata["group_skipped"]`)."""
    first = episodes[0]
    rewards = [episode.reward for episode in episodes]
    scored = [reward for reward in rewards if reward is not None]
    recorded = first.metadata.get("group_skipped")
    if isinstance(recorded, str):
        skipped: str | None = recorded
    elif len(scored) < 2:
        skipped = "fewer than two scored samples: nothing to compare"
    elif max(scored) - min(scored) == 0:
        skipped = f"no reward spread: every sample scored {scored[0]:.3f}, so every advantage is 0"
    else:
        skipped = None
    samples = sorted(episodes, key=lambda episode: episode.metadata.get("sample", 0))
    return {
        "task_index": first.metadata.get("task_index"),
        "task": short(first.task, 400),
        "samples": [sample_view(episode, success_threshold) for episode in samples],
        "mean_reward": number(math.fsum(scored) / len(scored)) if scored else NOT_RECORDED,
        "mean_value": math.fsum(scored) / len(scored) if scored else -math.inf,
        "spread_value": max(scored) - min(scored) if scored else 0.0,
        "skipped": skipped,
    }


TEXT_LIMIT = 100_000
"""Characters of one message shown on a page: a tool that returned a whole file must not make the page
megabytes long (the rest is named, not shown)."""


def _limited(text: str) -> str:
    if len(text) <= TEXT_LIMIT:
        return text
    return f"{text[:TEXT_LIMIT]}\n… ({len(text) - TEXT_LIMIT:,} more characters not shown)"


def _content_text(content: Any) -> str:
    """A message's content as text (cut at `TEXT_LIMIT`): a string, or the text of its parts (other parts
    as JSON)."""
    return _limited(_full_text(content))


def _full_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(json.dumps(part, ensure_ascii=False, default=str))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, default=str)


def _tool_calls(message: dict[str, Any] | None) -> list[dict[str, str]]:
    calls = []
    for tool_call in (message or {}).get("tool_calls") or []:
        if not isinstance(tool_call, dict):
            continue
        function = tool_call.get("function") or {}
        arguments = function.get("arguments", "")
        calls.append(
            {
                "id": str(tool_call.get("id", "")),
                "name": str(function.get("name", "")),
                "arguments": _limited(arguments if isinstance(arguments, str) else json.dumps(arguments)),
            }
        )
    return calls


def _message_view(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        return {"role": "?", "text": json.dumps(message, default=str), "tool_calls": [], "tool_call_id": ""}
    return {
        "role": str(message.get("role", "?")),
        "text": _content_text(message.get("content")),
        "tool_calls": _tool_calls(message),
        "tool_call_id": str(message.get("tool_call_id") or ""),
        "name": str(message.get("name") or ""),
    }


def _trained(call: LLMCall) -> str:
    credit = call_credit(call)
    trained, reason = credit.get("trained"), credit.get("untrained_reason")
    if trained is True:
        return "yes"
    if trained is False or isinstance(reason, str):
        return f"no: {reason}" if isinstance(reason, str) else "no"
    # The run did not record it; what the record itself says: without token ids a call cannot be trained.
    ids = "token ids recorded" if call.trainable else "no token ids recorded, so it cannot be trained"
    return f"{NOT_RECORDED} ({ids})"


def _advantage(call: LLMCall) -> str:
    credit = call_credit(call)
    value = credit.get("advantage")
    if value is None and credit.get("trained") is False:
        return "none (not trained)"  # the run recorded its credit, and this call got no advantage
    return number(value)


def _step_parts(call: LLMCall) -> str:
    """Under step-level credit: the episode part, the step part and the size of the call's step group."""
    credit = call_credit(call)
    if credit.get("step_advantage") is None:
        return ""
    # Under step_estimate="state_value" the step part of a shared state's call is the value of where it
    # led, and its episode part 0: say which, so a 0 is not read as "no episode advantage".
    estimate = credit.get("step_estimate")
    valued = ", valued by the state it led to" if estimate == "state_value" else ""
    return (
        f"episode part {number(credit.get('episode_advantage'))}, step part "
        f"{number(credit.get('step_advantage'))} (a step group of "
        f"{credit.get('step_group_size', '?')} calls{valued})"
    )


def call_view(
    call: LLMCall, owner: Episode, index: int, earlier: tuple[int, int] | None = None
) -> dict[str, Any]:
    """One model call: what it saw, what it answered, and what training made of it.

    `earlier`: (n, k) when the call's first `n` messages are exactly those of call `k` before it (an agent's
    conversation grows by a reply and a tool result each turn): only the new messages are shown, so a long
    episode's page does not repeat its history once per call."""
    usage = call.usage or {}
    prompt_tokens = len(call.prompt_token_ids) if call.prompt_token_ids else usage.get("prompt_tokens")
    completion_tokens = (
        len(call.completion_token_ids)
        if call.completion_token_ids is not None
        else usage.get("completion_tokens")
    )
    shown = (call.messages or [])[earlier[0] if earlier else 0 :]
    messages = [_message_view(message) for message in shown]
    if call.prompt is not None:
        messages.append({"role": "prompt", "text": call.prompt, "tool_calls": [], "tool_call_id": ""})
    reply_text = _content_text((call.response_message or {}).get("content")) or _limited(call.text or "")
    return {
        "index": index,
        "id": call.id,
        "role": call.agent_name or owner.name,
        "agent": owner.name,
        "adapter": call.adapter or "",
        "model": call.model or "",
        # The weights that sampled it: a trained run's step whose adapter answered (rollouts that run on
        # through the update mix versions within a group).
        "policy_version": _policy_version(call),
        "messages": messages,
        "tools": [str((tool.get("function") or tool).get("name", "?")) for tool in call.tools or []],
        "reply": reply_text,
        "reply_tool_calls": _tool_calls(call.response_message),
        "finish_reason": call.finish_reason or "",
        "error": call.error or "",
        "prompt_tokens": prompt_tokens if prompt_tokens is not None else NOT_RECORDED,
        "completion_tokens": completion_tokens if completion_tokens is not None else NOT_RECORDED,
        "latency": f"{call.latency_s:.2f} s" if call.latency_s is not None else NOT_RECORDED,
        "step_reward": number(call.reward) if call.reward is not None else "none (no emit_reward)",
        "credited_reward": number(call_credit(call).get("credited_reward")),
        "advantage": _advantage(call),
        "trained": _trained(call),
        "credit_rule": str(call_credit(call).get("credit_rule") or NOT_RECORDED),
        "step_parts": _step_parts(call),
        "earlier": {"count": earlier[0], "call": earlier[1] + 1} if earlier else None,
    }


def _policy_version(call: LLMCall) -> str:
    if call.policy_version is not None:
        return f"step {call.policy_version}"
    return "none reported: the base weights, or another server"


def episode_view(episode: Episode) -> dict[str, Any]:
    """A whole episode: its task, output, rewards, feedback and every call."""
    feedback = episode.metadata.get(FEEDBACK_KEY)
    metadata = {key: value for key, value in episode.metadata.items() if key != FEEDBACK_KEY}
    return {
        "id": episode.id,
        "name": episode.name,
        "run_id": episode.run_id or "",
        "task": _limited(task_text(episode.task)),
        "output": _limited(task_text(episode.output)),
        "error": _error_text(episode),
        "traceback": (episode.error or {}).get("traceback", ""),
        "reward": number(episode.reward) if episode.reward is not None else "unscored",
        "rewards": {name: number(value) for name, value in episode.rewards.items()},
        "reward_errors": [json.dumps(error, ensure_ascii=False) for error in episode.reward_errors],
        "advantage": number(episode_advantage(episode)),
        "feedback": [
            json.dumps(item, ensure_ascii=False, default=str) for item in feedback or [] if feedback
        ],
        "metadata": json.dumps(metadata, ensure_ascii=False, indent=1, default=str),
        "step": episode.metadata.get("step"),
        "task_index": episode.metadata.get("task_index"),
        "sample": episode.metadata.get("sample"),
        "evaluation": bool(episode.metadata.get("evaluation")),
        "calls": _call_views(episode),
    }


def _call_views(episode: Episode) -> list[dict[str, Any]]:
    """Every call's view; a call that continues an earlier call's conversation (the same messages first,
    then more) shows only what is new."""
    views = []
    previous: list[tuple[int, list[Any]]] = []  # each earlier call's index and messages
    for index, (call, owner) in enumerate(episode.calls_with_owner()):
        messages = call.messages or []
        earlier = None
        for number, seen in reversed(previous):  # the latest call it continues
            if seen and len(seen) < len(messages) and messages[: len(seen)] == seen:
                earlier = (len(seen), number)
                break
        views.append(call_view(call, owner, index, earlier))
        previous.append((index, messages))
    return views
