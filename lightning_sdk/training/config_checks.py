"""Validation of `TrainerConfig`: each check returns what is wrong, why, and what to set, or None.

The allowed values of a field are those of the `Literal` in its annotation (`allowed_values`): written once,
in `config.py`, where readers and type checkers see them.
"""

from __future__ import annotations

import functools
import math
import re
import typing
from collections.abc import Callable
from typing import Any, Literal

__all__ = ["allowed_values", "config_problem"]

Check = Callable[[Any], "str | None"]


def config_problem(config: object) -> str | None:
    """The first problem found in a `TrainerConfig`, or None when every value is valid."""
    for check in _CHECKS:
        problem = check(config)
        if problem:
            return problem
    return None


def allowed_values(cls: type, name: str) -> tuple[str, ...]:
    """The values of the `Literal`s in the annotation of field `name` of `cls` (also inside a union or a
    sequence: `CreditRule | Callable`, `Sequence[Literal[...]]`)."""
    return _literal_values(typing.get_type_hints(cls)[name])


@functools.cache
def _literal_values(hint: object) -> tuple[str, ...]:
    if typing.get_origin(hint) is Literal:
        return tuple(typing.get_args(hint))
    return tuple(value for part in typing.get_args(hint) for value in _literal_values(part))


def _choice(name: str) -> Callable[[Any], str | None]:
    def check(config: object) -> str | None:
        value, options = getattr(config, name), allowed_values(type(config), name)
        if value not in options:
            return f"{name}={value!r} is not one of {list(options)}; set {name} to one of them."
        return None

    return check


def _at_least(name: str, minimum: float, why: str) -> Callable[[Any], str | None]:
    def check(config: object) -> str | None:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{name}={value!r} must be a finite number."
        if value < minimum:
            return f"{name}={value!r} is too small: {why}. Set {name} >= {minimum}."
        return None

    return check


def _check_int_fields(config: object) -> str | None:
    names = (
        "group_size",
        "batch_size",
        "max_steps",
        "micro_batch_size",
        "mini_batches_per_step",
        "lora_rank",
        "max_tokens",
        "max_concurrency",
        "save_every",
        "keep_checkpoints",
        "eval_every",
        "warmup_steps",
        "seed",
        "dynamic_sampling_rounds",
        "max_staleness",
    )
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{name}={value!r} must be an integer."
    return None


def _check_balance_by(config: Any) -> str | None:
    key = config.balance_by
    if key is None or callable(key) or (isinstance(key, str) and key):
        return None
    return (
        f"balance_by={key!r} must be a task field name (a non-empty string), a function of the task, or None."
    )


def _check_limits(config: Any) -> str | None:
    tokens = config.max_sample_tokens
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 2):
        return (
            f"max_sample_tokens={tokens!r} must be an integer >= 2 (a prompt token and a trained token), "
            "or None for no cap."
        )
    size = config.episode_store_max_mb
    if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0):
        return f"episode_store_max_mb={size!r} must be a positive number of megabytes, or None for no limit."
    return None


def _check_group_size(config: Any) -> str | None:
    if config.group_size < 2:
        return (
            f"group_size={config.group_size} leaves nothing to compare: GRPO scores each episode against "
            "the other episodes of the same task. Set group_size >= 2 (4 to 16 is typical)."
        )
    return None


def _check_sampling(config: Any) -> str | None:
    if not 0 < config.temperature <= 2:
        return (
            f"temperature={config.temperature} cannot train: rollouts must sample (temperature 0 is "
            "greedy, every episode of a group would be the same). Set temperature in (0, 2], usually 1.0."
        )
    if not 0 < config.top_p <= 1:
        return f"top_p={config.top_p} must be in (0, 1]; set top_p=1.0 to sample the full distribution."
    return None


def _check_clipping(config: Any) -> str | None:
    if not 0 <= config.epsilon_low < 1:
        return (
            f"epsilon_low={config.epsilon_low} must be in [0, 1): the ratio is clipped at "
            "1 - epsilon_low, which must stay positive. Set epsilon_low=0.2."
        )
    if config.epsilon_high < 0 or not math.isfinite(config.epsilon_high):
        return f"epsilon_high={config.epsilon_high} must be >= 0 (the ratio is clipped at 1 + epsilon_high)."
    return None


def _check_importance_cap(config: Any) -> str | None:
    cap = config.importance_sampling_cap
    if cap is not None and (not math.isfinite(cap) or cap < 1):
        return (
            f"importance_sampling_cap={cap} must be >= 1 (a cap below 1 down-weights every token, even "
            "when trainer and engine agree) or None to disable the correction. Typical: 2.0."
        )
    return None


def _check_credit(config: Any) -> str | None:
    if callable(config.credit):
        return None
    rules = allowed_values(type(config), "credit")
    if config.credit not in rules:
        return (
            f"credit={config.credit!r} is unknown; set one of {', '.join(map(repr, rules))} or a function "
            "fn(episode, calls) -> list of rewards (one per call, None to leave a call untrained)."
        )
    if not 0 < config.gamma <= 1:
        return f"gamma={config.gamma} must be in (0, 1]; 1 means no discount, 0.9 a strong one."
    return None


def _check_step_credit(config: Any) -> str | None:
    if config.state_key is not None and not callable(config.state_key):
        return (
            f"state_key={config.state_key!r} is not callable; pass a function fn(call) -> hashable "
            "(e.g. the last tool result of call.messages), or None to key by the exact prompt token ids."
        )
    if config.state_key is not None and config.credit != "step":
        return (
            f"state_key is set but credit={getattr(config.credit, '__qualname__', config.credit)!r}; only "
            'credit="step" compares calls by state. Set credit="step", or leave state_key unset.'
        )
    if config.step_estimate != "return" and config.credit != "step":
        return (
            f"step_estimate={config.step_estimate!r} is set but credit="
            f'{getattr(config.credit, "__qualname__", config.credit)!r}; it chooses how credit="step" '
            'compares calls. Set credit="step", or leave step_estimate at "return".'
        )
    if config.step_estimate == "state_value" and config.step_advantage_weight == 0:
        return (
            'step_advantage_weight=0 with step_estimate="state_value" would train no call whose state '
            "another sample shared (the weight scales such a call's whole advantage there); use a weight "
            'above 0, or step_estimate="return", where 0 leaves the episode advantage.'
        )
    return None


def _check_train_agents(config: Any) -> str | None:
    agents = config.train_agents
    if agents is None:
        return None
    if isinstance(agents, str):
        try:
            re.compile(agents)
        except re.error as error:
            return f"train_agents={agents!r} is not a valid regular expression ({error}); fix the pattern."
        return None
    if not agents or not all(isinstance(name, str) and name for name in agents):
        return (
            f"train_agents={agents!r} must be None (every agent), a regular expression, or a non-empty "
            "list of agent names."
        )
    return None


def _check_lora(config: Any) -> str | None:
    modules = config.lora_target_modules
    if isinstance(modules, str):
        if not modules:
            return "lora_target_modules is empty; set 'all-linear' or a list such as ['q_proj', 'v_proj']."
    elif not modules or not all(isinstance(name, str) and name for name in modules):
        return "lora_target_modules must be 'all-linear' or a non-empty list of module names."
    if not 0 <= config.lora_dropout < 1:
        return f"lora_dropout={config.lora_dropout} must be in [0, 1)."
    return None


def _check_report_to(config: Any) -> str | None:
    backends = allowed_values(type(config), "report_to")
    unknown = [name for name in config.report_to if name not in backends]
    if unknown:
        return f"report_to has unknown backend(s) {unknown}; use {' and/or '.join(map(repr, backends))}."
    return None


def _check_dr_grpo_length(config: Any) -> str | None:
    length = config.dr_grpo_length
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
        return f"dr_grpo_length={length!r} must be a positive integer or None (use max_tokens)."
    return None


def _check_max_time(config: Any) -> str | None:
    budget = config.max_time_s
    if budget is None:
        return None
    is_number = isinstance(budget, (int, float)) and not isinstance(budget, bool)
    if not is_number or not math.isfinite(budget) or budget <= 0:
        return f"max_time_s={budget!r} must be a positive number of seconds, or None for no time limit."
    return None


def _check_grad_norm(config: Any) -> str | None:
    norm = config.max_grad_norm
    if norm is not None and (not math.isfinite(norm) or norm <= 0):
        return f"max_grad_norm={norm} must be a positive number, or None to disable clipping."
    return None


def _check_runners(config: Any) -> str | None:
    from lightning_sdk.rollouts.runners import Runners

    if config.runners is not None and not isinstance(config.runners, Runners):
        return (
            f"runners={config.runners!r} must be None (rollouts in this process) or "
            "lightning_sdk.Runners(...) (rollouts in runner processes)."
        )
    return None


def _check_memory_fields(config: Any) -> str | None:
    if config.gradient_checkpointing not in (True, False, "auto"):
        return (
            f"gradient_checkpointing={config.gradient_checkpointing!r} must be True, False or 'auto' (on "
            "where the policy trains on a GPU)."
        )
    if config.attention not in ("auto", "flex_attention", "sdpa", "eager"):
        return (
            f"attention={config.attention!r} must be 'auto', 'flex_attention', 'sdpa' or 'eager' (the "
            "attention implementations that take the packed training pass's mask)."
        )
    for name, meaning in (
        ("micro_batch_tokens", "the tokens of one forward pass"),
        ("logit_chunk_tokens", "the tokens projected to the vocabulary at once"),
    ):
        value = getattr(config, name)
        if name == "micro_batch_tokens" and value == "auto":
            continue
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            auto = ", 'auto' (the largest that fits)" if name == "micro_batch_tokens" else ""
            return (
                f"{name}={value!r} must be a whole number of tokens >= 1 ({meaning}){auto}, or None for no "
                "limit."
            )
    return None


def _check_routes(config: Any) -> str | None:
    from lightning_sdk.tracing.routing import compile_routes

    try:
        compile_routes(config.routes, config.role_adapters())
    except ValueError as error:
        return str(error)
    return None


def _check_init_adapter(config: Any) -> str | None:
    from lightning_sdk.engine.lora.folders import is_adapter_folder

    path = config.init_adapter
    if path is None:
        return None
    if not isinstance(path, str) or not is_adapter_folder(path):
        return (
            f"init_adapter={path!r} is not a saved adapter folder (one with adapter_model.safetensors, or "
            "one subfolder per role): pass the run_dir/adapter a run wrote."
        )
    return None


def _check_roles(config: Any) -> str | None:
    from lightning_sdk.tracing.routing import roles_problem

    if config.roles is None:
        if config.other_agents == "shared":
            return (
                "other_agents='shared' gives the agents without a role of their own one shared adapter, "
                "but roles is None: without roles one adapter already answers and learns from every call. "
                "Name the roles (roles=['writer', 'checker']), or leave other_agents='base'."
            )
        return None
    if isinstance(config.roles, str):
        return f"roles={config.roles!r} must be a list of role names, e.g. ['{config.roles}']."
    problem = roles_problem(config.roles, None)
    if problem:
        return problem
    if config.weight_sync == "merge":
        return (
            "weight_sync='merge' cannot serve roles their own adapters: one merged set of weights answers "
            "every call. Leave weight_sync='auto' (roles hot-load their LoRA adapters) or set 'lora'."
        )
    return None


def _check_upstream(config: Any) -> str | None:
    url = config.upstream_base_url
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        return (
            f"upstream_base_url={url!r} must be an http(s) base URL ending in /v1 (e.g. "
            "'https://api.openai.com/v1'), or None for the API of the environment the run starts in."
        )
    if not isinstance(config.upstream_api_key_env, str) or not config.upstream_api_key_env:
        return f"upstream_api_key_env={config.upstream_api_key_env!r} must name an environment variable."
    return None


_CHECKS: list[Check] = [
    _check_int_fields,
    _check_balance_by,
    _check_limits,
    _check_group_size,
    _at_least("batch_size", 1, "a step needs at least one task"),
    _at_least("max_steps", 1, "the run must train at least one step"),
    _check_max_time,
    _at_least("micro_batch_size", 1, "each forward pass needs at least one sequence"),
    _at_least("mini_batches_per_step", 1, "each step makes at least one optimizer step"),
    _at_least("lora_rank", 1, "a LoRA adapter needs rank >= 1"),
    _at_least("lora_alpha", 0, "a negative scale flips the update"),
    _at_least("max_tokens", 1, "each call must be allowed to generate"),
    _at_least("max_concurrency", 1, "at least one episode must run at a time"),
    _at_least("episode_timeout_s", 0.001, "episodes need time to run"),
    _at_least("learning_rate", 0, "a negative learning rate climbs the loss"),
    _at_least("warm_start_lr_scale", 0, "a negative learning rate climbs the loss"),
    _at_least("weight_decay", 0, "negative decay grows the weights"),
    _at_least("warmup_steps", 0, "warm-up cannot be negative"),
    _at_least("save_every", 0, "0 means only the final checkpoint"),
    _at_least("keep_checkpoints", 1, "resuming needs the newest checkpoint"),
    _at_least("eval_every", 0, "0 means only at the start and the end"),
    _at_least("dynamic_sampling_rounds", 0, "0 turns dynamic sampling off"),
    _at_least("max_staleness", 0, "0 trains each step on its own rollouts"),
    _at_least("kl_coef", 0, "a negative KL weight pushes the model away from the base model"),
    _at_least("advantage_eps", 0, "it is added to a standard deviation before dividing"),
    _check_sampling,
    _choice("on_error"),
    _check_credit,
    _choice("step_estimate"),
    _check_step_credit,
    _at_least("step_advantage_weight", 0, "a negative weight pushes each call against its own step's result"),
    _choice("episode_baseline"),
    _check_train_agents,
    _choice("mode"),
    _choice("loss_normalization"),
    _check_dr_grpo_length,
    _check_clipping,
    _check_importance_cap,
    _check_grad_norm,
    _check_lora,
    _choice("dtype"),
    _choice("lr_schedule"),
    _choice("weight_sync"),
    _choice("other_agents"),
    _check_roles,
    _check_init_adapter,
    _check_report_to,
    _check_runners,
    _check_memory_fields,
    _check_routes,
    _check_upstream,
]
