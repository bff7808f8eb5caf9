"""`TrainerConfig`: every knob of a training run, with defaults for the bundled 135M model on a CPU.

Bad values are rejected when the config is built, with a message that says what is wrong, why it
matters and what to set instead, so a run never fails an hour in because of a typo.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from lightning_sdk.rollouts.runners import Runners
from lightning_sdk.serving.limits import RequestLimits
from lightning_sdk.serving.passthrough.routes import PASSTHROUGH_ROUTES, check_passthrough_routes
from lightning_sdk.tracing.routing import SHARED_ROLE, Roles, RouteTarget
from lightning_sdk.training.config_checks import config_problem

__all__ = ["DEFAULT_LORA_TARGET_MODULES", "TrainerConfig"]

DEFAULT_LORA_TARGET_MODULES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
"""Every attention and MLP projection of Llama-style models (SmolLM2, Llama, Qwen, Mistral)."""

CreditRule = Literal["equal", "last", "discounted", "step"]
EpisodeBaseline = Literal["group_mean", "leave_one_out"]
StepEstimate = Literal["return", "state_value"]


@dataclass
class TrainerConfig:
    """Configuration of `Trainer.fit`; every field has a default that works for the bundled model on a CPU."""

    # --- the schedule -------------------------------------------------------------------------------
    group_size: int = 8
    """Episodes per task in one step. GRPO compares a task's episodes with each other, so at least 2."""
    batch_size: int = 4
    """Tasks per step; a step runs `batch_size * group_size` episodes."""
    max_steps: int = 50
    """Training steps of the run (the dataset is reshuffled and repeated as needed)."""
    max_time_s: float | None = None
    """Wall-clock budget of the training steps in seconds: the run ends after the step that uses it up,
    then saves and evaluates as usual. `None`: only `max_steps` ends the run. A learning-rate decay still
    spans `max_steps`."""
    shuffle: bool = True
    """Shuffle the training tasks (with `seed`) at the start of each pass over the dataset."""
    balance_by: str | Callable[[Any], Any] | None = None
    """Draw the kinds of task evenly: a task field name (`"template"` for dict tasks) or a function of
    the task; tasks with equal values form a kind, and every step's tasks cycle through the kinds in a
    shuffled order, each kind through its own tasks. Use it when a few easy kinds would fill most steps
    (e.g. 70% of the tasks are lookups the model already gets right). `None`: every task once per pass."""
    seed: int = 0
    """Seed of Python, NumPy and torch random generators (data order, LoRA init, dropout)."""

    # --- optimizer --------------------------------------------------------------------------------
    learning_rate: float = 1e-4
    """Peak AdamW learning rate of the LoRA weights."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Training steps of linear learning-rate warm-up from 0 to `learning_rate`."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate shape after warm-up: constant, or a linear or cosine decay to 0 at `max_steps`."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this value before each optimizer step; `None` disables clipping."""
    micro_batch_size: int = 8
    """Most sequences per forward/backward pass where samples run padded (a CPU); gradients of the
    micro-batches are accumulated. Lower it to save memory, it does not change the result. On a GPU the
    pass is packed and `micro_batch_tokens` alone bounds it."""
    micro_batch_tokens: int | Literal["auto"] | None = "auto"
    """Most tokens per forward/backward pass: on a GPU, packed tokens (each distinct prompt once plus every
    completion); on a CPU, padded ones (rows x (longest prompt + longest completion)). A sample longer than
    this goes alone. Peak training memory follows this budget, not the longest episode:
    `lightning-sdk memory` (or `lightning_sdk.training.update.memory.estimate_step_memory`) says what a
    budget costs for a model. `"auto"` (the default): the largest of 2048, 4096, 8192 and 16384 tokens
    whose step, by the sizing rule, fits the memory available when the run starts (CPU RAM or the GPU's)
    with a tenth to spare; the run says which and why in one line. Past 16384 a larger pass no longer
    speeds a step up. `None`: only `micro_batch_size` limits a micro-batch."""
    mini_batches_per_step: int = 1
    """Optimizer steps per training step: the step's samples are split into this many mini-batches.
    1 is fully on-policy; more reuses each rollout for several updates, with PPO clipping keeping
    the later updates close to the rollout policy (costs one extra forward pass over all samples)."""

    # --- LoRA ---------------------------------------------------------------------------------------
    lora_rank: int = 16
    """Rank of the LoRA matrices."""
    lora_alpha: float = 32.0
    """LoRA scaling numerator: the update is scaled by `lora_alpha / lora_rank`."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input. Kept at 0 by default so the trained policy equals the sampled one."""
    lora_target_modules: Sequence[str] | str = DEFAULT_LORA_TARGET_MODULES
    """Module names that receive LoRA adapters, or `"all-linear"`."""
    init_adapter: str | os.PathLike[str] | None = None
    """A saved adapter folder the LoRA weights start from instead of zero: a supervised warm start
    (`Trainer.fit_sft`'s `run_dir/adapter`) or an earlier run's adapter. The engine serves it from the
    first rollout. Its LoRA shape (`lora_rank`, `lora_target_modules`) must match this config's."""
    warm_start_lr_scale: float = 0.125
    """Multiplies `learning_rate` when GRPO starts from a trained adapter (`init_adapter`): the quickstart's
    4e-4 becomes 5e-5. A warm-started adapter already solves many tasks, few groups carry a signal, and
    AdamW turns even a small gradient into a step of about the learning rate in every weight, so a rate
    tuned for a fresh adapter can undo what SFT taught. Measured on the quickstart after SFT, 3 seeds
    (`benchmarks/results/learning.md`, rows `warm-*`): at 4e-4 GRPO lost ground in two seeds of three,
    at 5e-5 in none. The run logs the rate it uses; 1.0 uses `learning_rate` as is."""
    logit_chunk_tokens: int | None = 512
    """Tokens projected to the vocabulary at once in the training pass: the logits of a long completion
    never exist whole (at their peak 16 bytes per vocabulary entry: 1.2 GiB for 512 tokens of a 150k
    vocabulary, against 4.6 GiB for a 2k-token completion at once), for a second projection of each chunk
    in the backward pass. `None`: all at once."""
    gradient_checkpointing: bool | Literal["auto"] = "auto"
    """Recompute each layer's activations in the backward pass: the pass keeps one tensor per layer and
    token instead of dozens, for about a third more compute. `"auto"` (the default) asks the sizing rule
    when the run starts (`update/memory.py`, `choose_gradient_checkpointing`): off when a step fits the
    memory available without recomputing, with a tenth to spare (with `micro_batch_tokens="auto"`, at its
    smallest budget), on otherwise; the start-up line says which and why. Where the memory available is
    unknown, and for `lightning-sdk sft` (which does not size its step): on a GPU, off on a CPU."""
    attention: Literal["auto", "flex_attention", "sdpa", "eager"] = "auto"
    """transformers' attention implementation for the policy in the training pass. The pass packs each
    micro-batch into one row (each prompt once, no padding) under a mask that each of these takes: `"auto"`
    is flex attention on a GPU where it compiles (it skips the masked blocks: a completion is never
    multiplied against its sibling completions), else SDPA with a dense mask (docs/gpu.md)."""
    fused_kernels: bool = True
    """Use Liger-Kernel's fused RMSNorm, SwiGLU and rotary kernels for the policy on a GPU where the
    package is installed (`pip install 'lightning-sdk[liger]'`) and the model is a Llama, Qwen2 or Qwen3:
    12-14% faster and 10% less memory on an H100. Without it, or on a CPU, nothing changes."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Dtype of the policy's base weights, and of the engine the run starts (the two must sample and learn
    from the same numbers: docs/engine.md, "The two policies agree"): `"auto"` is float32 on a CPU,
    bfloat16 on a GPU (float16 on one without bfloat16). `"float16"` on a GPU runs both in float16, with
    the policy's loss scaled dynamically."""

    # --- rollouts -------------------------------------------------------------------------------------
    temperature: float = 1.0
    """Sampling temperature of training rollouts. RL needs exploration: the policy gradient uses the
    same temperature to compute the log-probabilities of the sampled tokens."""
    top_p: float = 1.0
    """Nucleus sampling of training rollouts. Below 1 the sampled tokens come from a truncated
    distribution the loss does not model; keep 1 unless you know you want it."""
    max_tokens: int = 256
    """Cap on the completion tokens of one LLM call during rollouts."""
    max_sample_tokens: int | None = 8192
    """Cap on the tokens of one training sequence (prompt and completion, or a whole trajectory in
    `mode="trajectory"`), which bounds training memory however long an agent runs. Longer samples are
    left out of the update, counted in `samples_dropped_too_long` and warned about; `None`: no cap."""
    max_concurrency: int = 32
    """Episodes running at the same time during a rollout."""
    episode_timeout_s: float = 300.0
    """Seconds one episode may run before it is cancelled and counted as failed."""
    tool_parser: str = "hermes"
    """The tool-call format the model writes and the endpoint reads: `"hermes"` (the bundled model's, and
    the one the server can also constrain and force) or a vLLM `--tool-call-parser` name (`"llama3_json"`,
    `"mistral"`, `"qwen3_xml"`, ...) for models whose chat template renders tools their own way."""
    routes: Mapping[str, RouteTarget | str] | None = None
    """Which of the agent's model calls the policy answers during rollouts and evaluations, whatever base
    URL the agent's client was built with and whenever it was built (a client made at import time
    included). Keys select calls by model name (`"gpt-4o-mini"`) or by agent name (`"agent:planner"`), as
    regular expressions matched against the whole name; the first key that matches decides. Values are
    `"policy"` (the trained model answers, and the call is trained), `"keep"` (the call goes where its
    client was going: a hosted judge, a hosted planner) or, with `roles`, a role name (that role's adapter
    answers, and the call trains it). Calls no key selects keep their destination. `None` (the default):
    every chat, completion and responses call goes to the policy. Outside `fit` nothing is redirected."""
    roles: Sequence[str] | None = None
    """Roles that get a LoRA adapter of their own (a multi-agent system: a writer, a checker, a rewriter).
    A call is answered by the adapter of the role named like the agent that made it (the `@trace_agent`
    or sub-agent name, LangChain run name, AutoGen or Agents SDK agent name), or of the role `routes`
    names for it; each role's calls train its own adapter, with its own optimizer state. Role names are
    letters, digits, `_` and `-`. Calls of other agents go to `other_agents`. Outside the process, an
    agent picks a role's adapter with `model="<role>"`. Needs the vLLM engine with LoRA hot-load
    (`weight_sync` "auto" or "lora"). `None` (the default): one adapter answers and learns from every
    call. See docs/multi-agent.md."""
    other_agents: Literal["base", "shared"] = "base"
    """With `roles`: the calls of agents without a role of their own are answered by the base model and
    not trained (`"base"`), or share one more adapter, named `"shared"`, which they train (`"shared"`;
    refused without `roles`, where one adapter already learns from every call)."""
    upstream_base_url: str | None = None
    """Where the agent's OpenAI requests that the policy does not serve (`/v1/embeddings`, moderations,
    files, ...) go during training, passed through unchanged with the key in `upstream_api_key_env`.
    `None`: the API the agent would have called without the trainer, `OPENAI_BASE_URL` of the environment
    `fit` starts in (or api.openai.com when only the key is set); with neither, such requests get a 404 that
    names this option."""
    upstream_api_key_env: str = "OPENAI_API_KEY"
    """Environment variable that holds the upstream's key (read when the run starts, never saved)."""
    passthrough_routes: Sequence[str] = PASSTHROUGH_ROUTES
    """The agent's requests passed through to the upstream, as `"METHOD /v1/path"` (`*` for one segment):
    by default the inference routes a model client calls (embeddings, moderations, images, audio, and
    `GET /v1/models/<id>`), never what acts on the account (files, fine-tuning, batches). Add one with
    `(*ls.PASSTHROUGH_ROUTES, "POST /v1/files")`; `()` switches pass-through off. Any other request gets a
    404 that names this option. See docs/serving.md, "Other OpenAI routes"."""
    request_limits: RequestLimits | None = None
    """What one request to the run's endpoint may ask: body size, JSON nesting, sequences started (prompts x
    `n`); `None`: `ls.RequestLimits()`'s defaults (32 MiB, 64 levels, 256 sequences). Every agent, runner
    and tool that holds the run's key can send requests; these bound what one of them costs the run."""
    runners: Runners | None = None
    """Where the agent runs: `None` in this process (the default), or `Runners(...)`: in runner processes
    this trainer starts, or that you start on this or other machines (see `lightning_sdk.Runners`). A mapping
    of `Runners` fields is taken too (`{"processes": 2}`), as a JSON config file gives it."""
    dynamic_sampling_rounds: int = 0
    """Extra rollout rounds a step may run to replace groups that carry no learning signal (every
    episode of the task scored the same, so GRPO has nothing to compare): each round runs the next
    `batch_size` tasks, until `batch_size` groups with a reward spread are found (DAPO's dynamic
    sampling). The step then trains on those groups only. 0 (the default) trains on the first round as it
    comes. Each round costs a rollout; the metrics `groups_with_signal`, `groups_rolled_out` and
    `rollout_rounds` show what it bought."""
    max_staleness: int = 0
    """How many updates old a trained sample may be. 0 (the default): every step rolls out its batch, then
    trains on it, the engine idle while the agents finish and the agents idle while the model trains.
    With S >= 1 rollouts never stop for the update: up to `(S + 1) x batch_size` groups run at once, a step
    trains on the first `batch_size` to complete (the rest run on), and a model call made during the update
    waits at the endpoint and is answered by the new weights. A group with a call sampled more than S
    updates before the one it would train is left out (`groups_too_old`), never silently. The truncated
    importance weight (`importance_sampling_cap`) corrects for the older policy. Pays when agents wait on
    tools; see docs/trainer.md, "Rollouts that run on through the update". In-process agents and runners
    alike; not under torchrun yet."""
    on_error: Literal["drop", "zero"] = "drop"
    """A failed or timed-out episode is dropped from its group (`"drop"`) or scored 0 (`"zero"`)."""

    # --- credit assignment and advantages ------------------------------------------------------------
    credit: CreditRule | Callable[..., Sequence[float | None]] = "equal"
    """How an episode's return becomes a reward per trained LLM call: `"equal"` (every call gets the
    return, the paper's choice), `"last"` (only the final call is trained), `"discounted"` (reward to
    go with `gamma`), `"step"` (the episode's advantage plus each call's advantage over the calls of its
    group that faced the same state; `lightning_sdk.training.algorithm.step_credit`), or
    `fn(episode, calls) -> list[float | None]`. See `lightning_sdk.training.algorithm.credit`."""
    gamma: float = 1.0
    """Discount per LLM call for `credit="discounted"` and `"step"` (its return to go); 1 means no
    discount."""
    state_key: Callable[[Any], Hashable] | None = None
    """`credit="step"`: `fn(call) -> hashable` naming the state an `LLMCall` faced; calls of a task's group
    with equal keys (and the same role and agent) are compared. `None`: the exact prompt token ids. Key
    by what decides the situation when prompts carry noise (a timestamp, a request id), e.g. the last
    tool result (docs/trainer.md)."""
    step_advantage_weight: float = 1.0
    """`credit="step"`: the weight `w` of the step advantage added to the episode advantage. 1 is the
    smallest weight at which the closed-form test gets each decision's direction better than `"equal"`
    (by sign and by correlation); larger weights get it better still but make every advantage larger
    (docs/trainer.md)."""
    step_estimate: StepEstimate = "return"
    """`credit="step"`: what a call is compared by within its state. `"return"` (GiGPO's): the return its
    own episode went on to earn, added as `w` times the step advantage to the episode advantage.
    `"state_value"`: where its state is shared, the mean return of the samples that reached the state it
    led to, in place of the episode advantage, so a right call that a later call spoiled is not blamed
    for it (times `step_advantage_weight`, which must then be above 0); alone in its state, the episode
    advantage (`lightning_sdk.training.algorithm.step_credit`, docs/trainer.md)."""
    episode_baseline: EpisodeBaseline = "group_mean"
    """The episode advantage's baseline: the group mean (GRPO) or, for each episode, the mean of the others
    (RLOO), so that a sample is never its own baseline. See `lightning_sdk.training.algorithm.advantages`."""
    train_agents: Sequence[str] | str | None = None
    """Which agents' calls are trained in a multi-agent system: a list of names, a regular expression
    matched against the whole name, or `None` for every agent. Calls to other endpoints are never trained."""
    mode: Literal["transition", "trajectory"] = "transition"
    """`"transition"`: one sample per trained call. `"trajectory"`: an episode's calls whose token ids
    extend each other become one sequence, with tokens the model did not sample masked out."""
    scale_advantages: bool = True
    """Divide group-centred rewards by the group's standard deviation (GRPO). `False` is Dr. GRPO's
    choice: it keeps easy and hard tasks from getting the same weight."""
    advantage_eps: float = 1e-4
    """Added to the group standard deviation before dividing, so near-uniform groups do not explode."""

    # --- loss ---------------------------------------------------------------------------------------
    loss_normalization: Literal["grpo", "dapo", "dr_grpo"] = "dapo"
    """How token losses are averaged: `"grpo"` (mean per sequence, then over sequences), `"dapo"` (mean
    over every trained token of the batch) or `"dr_grpo"` (sum per sequence over a constant length)."""
    dr_grpo_length: int | None = None
    """The constant length of `"dr_grpo"`; `None` uses `max_tokens`."""
    epsilon_low: float = 0.2
    """PPO clipping below: the probability ratio is clipped at `1 - epsilon_low` for negative advantages."""
    epsilon_high: float = 0.28
    """PPO clipping above: the ratio is clipped at `1 + epsilon_high` for positive advantages (DAPO's
    "clip higher" keeps rare good tokens from being clipped too early)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference policy (k3 estimator): the base model (the same network
    with the adapter disabled), or, after a warm start (`init_adapter`), a frozen copy of the adapter the
    run started from, so that GRPO is held near what SFT taught rather than pulled back to the base model.
    0 skips the extra forward pass."""
    importance_sampling_cap: float | None = 2.0
    """Truncated importance sampling: each token's loss is weighted by `min(p_train / p_engine, cap)`
    to correct for differences between the engine that sampled and the model that trains. `None`
    disables the correction."""

    # --- around the loop --------------------------------------------------------------------------------
    save_every: int = 10
    """Write a checkpoint every this many steps (and at the end); 0 writes only the final one."""
    keep_checkpoints: int = 3
    """How many of the newest checkpoints to keep on disk."""
    eval_every: int = 10
    """Evaluate on `val_dataset` every this many steps (and at the start and the end); 0 only at the
    start and the end."""
    keep_best: bool = True
    """With a validation set, the run's result (`FitResult.adapter_path`) is the adapter of the best held-out
    reward among the evaluations (the starting adapter included), kept in `run_dir/best_adapter`; the last
    one stays in `run_dir/adapter`. As Hugging Face's `load_best_model_at_end`: GRPO can lose ground, and a
    run should not hand back a worse adapter than one it had. False: the last adapter, always."""
    success_threshold: float = 1.0
    """An evaluated episode counts as a success when its reward is at least this (full marks by default)."""
    eval_greedy: bool = True
    """Evaluate with greedy decoding (temperature 0), so validation reward is not sampling noise."""
    eval_beside_training: bool = True
    """With `max_staleness >= 1`, an evaluation between steps runs beside training: the evaluated step's
    adapter is pinned in the engine and answers the evaluation's calls while the next updates train and
    load newer ones, so no update waits for it (its record comes when it ends). Where that cannot be (an
    engine with `weight_sync="merge"`, the CPU's default; roles; runners; a judge), or with False, the next
    update waits for the evaluation, which runs on the weights alone. See docs/trainer.md."""
    run_dir: str | None = None
    """Folder of checkpoints, metrics and reports; `None` makes `runs/<date-time>` in the working
    directory."""
    weight_sync: Literal["auto", "merge", "lora"] = "auto"
    """How new weights reach the engine: `"merge"` reloads merged weights in place (fast generation),
    `"lora"` loads the adapter (fast push, slow CPU kernels), `"auto"` picks the faster for the device."""
    episode_store_max_mb: float | None = 10240.0
    """Size limit of `run_dir/episodes.sqlite`, where every rollout's episode is kept for reports and
    analysis. At the limit the run goes on training and stops storing episodes, with a warning and the
    `episodes_not_stored` metric; `None` means no limit."""
    report_to: Sequence[Literal["tensorboard", "wandb"]] = ()
    """Extra metric backends beside `metrics.jsonl`: `"tensorboard"` and/or `"wandb"`."""
    wandb_project: str | None = None
    """W&B project name (`None`: W&B's default) when `"wandb"` is in `report_to`."""
    progress_bar: bool = True
    """Show a live progress line with step, reward and speed."""
    verbose: bool = False
    """Show what the engine and the libraries under it print (vLLM's log lines, torch's C++ warnings,
    weight-loading bars) on the console. By default it goes to `run_dir/engine.log`, and one line names that
    file when anything in it is a warning or an error; an engine that fails to start shows it either way."""
    explorer: bool = False
    """Serve the run explorer (`lightning-sdk view`) over the run folder on 127.0.0.1 while the run trains,
    and print its address at the start: the page follows the run live (curves, each step's groups, every
    call). It runs in a process of its own and stops with the run."""

    def __post_init__(self) -> None:
        if self.weight_sync == "merged":  # type: ignore[comparison-overlap]  # the name before 0.2
            warnings.warn(
                'weight_sync="merged" is now spelt "merge", as in VLLMEngine.',
                DeprecationWarning,
                stacklevel=3,
            )
            self.weight_sync = "merge"
        self.lora_target_modules = _normalise_target_modules(self.lora_target_modules)
        self.report_to = tuple(self.report_to)
        self.passthrough_routes = check_passthrough_routes(self.passthrough_routes)
        if self.request_limits is not None and not isinstance(self.request_limits, RequestLimits):
            raise ValueError(
                f"request_limits={self.request_limits!r} must be an ls.RequestLimits(...) or None "
                "(None: its defaults)."
            )
        if isinstance(self.train_agents, (list, tuple, set, frozenset)):
            self.train_agents = tuple(self.train_agents)
        if isinstance(self.roles, (list, tuple)):
            self.roles = tuple(self.roles)
        if isinstance(self.init_adapter, os.PathLike):  # `fit_sft(...).adapter_path` is a Path
            self.init_adapter = os.fspath(self.init_adapter)
        if isinstance(self.routes, Mapping):
            self.routes = dict(self.routes)  # a copy: the caller's dict may change after the run starts
        if isinstance(self.runners, Mapping):  # from a JSON config file (`lightning-sdk train --config`)
            self.runners = _runners_from_mapping(self.runners)
        problem = config_problem(self)
        if problem:
            raise ValueError(f"TrainerConfig: {problem}")

    def role_adapters(self) -> Roles | None:
        """`roles` and `other_agents` as the router and the trainer use them (None without roles)."""
        if self.roles is None:
            return None
        return Roles(tuple(self.roles), SHARED_ROLE if self.other_agents == "shared" else None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (a callable `credit` or `balance_by` is written as its qualified name)."""
        data = asdict(self)
        if callable(self.credit):
            data["credit"] = getattr(self.credit, "__qualname__", repr(self.credit))
        if callable(self.balance_by):
            data["balance_by"] = getattr(self.balance_by, "__qualname__", repr(self.balance_by))
        if self.state_key is not None:
            data["state_key"] = getattr(self.state_key, "__qualname__", repr(self.state_key))
        data["lora_target_modules"] = (
            self.lora_target_modules
            if isinstance(self.lora_target_modules, str)
            else list(self.lora_target_modules)
        )
        data["report_to"] = list(self.report_to)
        if isinstance(self.train_agents, tuple):
            data["train_agents"] = list(self.train_agents)
        if isinstance(self.roles, tuple):
            data["roles"] = list(self.roles)
        if data.get("runners") and data["runners"].get("api_key"):
            data["runners"]["api_key"] = "***"  # run.json and the metrics backends never see the key
        return data


def _runners_from_mapping(fields: Mapping[str, Any]) -> Runners:
    known = {field.name for field in dataclasses.fields(Runners)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(
            f"TrainerConfig: runners has unknown field(s) {', '.join(unknown)}; Runners takes "
            f"{', '.join(sorted(known))}."
        )
    return Runners(**fields)


def _normalise_target_modules(value: Sequence[str] | str) -> tuple[str, ...] | str:
    if isinstance(value, str):
        return value
    return tuple(value)
